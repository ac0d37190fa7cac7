"""The view of the cluster a decision reads: each node's GPU facts, the pool index (capacity per pool
and the ledger of what Pods and reservations hold), projections of raw Kubernetes objects onto the
domain, and the Inventory interface the sources implement. Pure: no I/O, no clock."""
