"""The view of the cluster a decision reads. Pure: no I/O, no clock.

- nodes: what each node contributes to a pool (its GPU facts);
- index: the pool index, a façade over two parts: the capacity index (capacity; pool for one pool's
  groups of nodes and the packing of its holds) and the ledger of what Pods and reservations hold
  (ledger; claims for where a Pod's GPUs count; reservations for admissions not shown yet);
- kubeobj: projections of raw Kubernetes objects onto the domain;
- inventory: the Inventory interface the sources implement; quotas: warnings on ResourceQuotas;
  memo: a bounded memo for values derived on the admission path.
"""
