"""The queue at scale (bench/bench_queue.py, whose docstring says what it measures), in modules of one part each:
`sim` (the simulator's process and its API), `cluster` (the namespaces, quotas and objects the benchmark adds),
`replicas` and `creator` (the two replicas, the Pods queued through them), `backlog` (`--backlog`'s Pods,
made from one real admission per shape), `probes` and `meters` (baselines,
profiles, CPU), `phases` and `run` (the run), `report` (the figures, the goals, the table). The judge of the
audit log is bench/queueaudit/."""
