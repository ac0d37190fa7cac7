"""The queue benchmark's judge: the simulator's audit log replayed write by write, never gpupool's own view.

bench/bench_queue.py runs the simulator with `--audit-log` (webhook.testing.kubeaudit): every write with
the object stored and the store's monotonic time. `Auditor` starts from the cluster as listed at one
resourceVersion and applies each later write in order, so after every write it knows what the cluster
holds, and judges:

- **GPUs overbooked**, at every moment: the GPUs that bound, non-terminated Pods request beyond their
  node's allocatable, plus the GPUs of released Pods (gate `gpupool.io/queue` removed, not bound yet, not
  terminated) that cannot all be placed at once on the free GPUs of the usable nodes (Ready, not
  cordoned) of their pool (first-fit decreasing, per pool; exact for Pods of one GPU). Reported: the
  most at any moment, how many writes left some overbooked, and GPU-seconds.
- **Quotas exceeded**, at every moment: for each quota of a queue namespace, what its Pods that count
  (ungated, not terminated: released or bound) hold beyond the hard limit: GPUs for a ResourceQuota in
  the forms gpupool enforces, devices of the class for a `classQuota` (the class of the node a Pod is
  bound to, else of the pool in its `gpupool.io/pool`), GPU memory for a `memoryQuota` (GPUs times the
  memory of the node, else the least of the pool's nodes).
- **Release latency**: each release is the write that removed the gate. Room is kept as units (GPUs per
  pool, GPUs or MiB per quota) stamped with the write that freed them (a Pod finishing or deleted, a node
  joining), oldest first: a release takes its units from the oldest room, as the queue's order takes the
  oldest waiting Pod first, and Pods placed by others (bound at creation, bound by the scheduler without
  passing the queue) take theirs when bound. "Room appeared" for a release is the latest of: when the
  last capacity unit it took appeared, when the last unit of each quota it counts against appeared, and
  when the Pod itself was created (room that waited for a Pod to come is not the queue's delay). The
  latency is the release's store time minus that. A release that finds too few units is overbooked (its
  pool) or over a quota, and is counted there as well.

Pools are products (a pool is the class and product of its nodes, and gpupool's nodeSelector sends a
released Pod to exactly those nodes: `signatures_off_pool` counts the releases whose constraints reach
other nodes than their pool's, which would make these figures wrong).

The package: `records` (what is kept of each node and Pod), `auditor` (the replay), and the judges it feeds,
`capacity` (overbooking), `quotas` and `room` (release latency's room, oldest first).
"""

from bench.queueaudit.auditor import QUEUE_LEASE, Auditor
from bench.queueaudit.capacity import Overbooking
from bench.queueaudit.quotas import QuotaRule, QuotaWatch
from bench.queueaudit.records import GPU, QUEUE_GATE
from bench.queueaudit.room import Release, Room

__all__ = ["GPU", "QUEUE_GATE", "QUEUE_LEASE", "Auditor", "Overbooking", "QuotaRule", "QuotaWatch", "Release", "Room"]
