"""MIG layouts: what NVIDIA's mig-manager can cut a node's GPUs into, and which cut the waiting demand wants.

A layer of its own, just above webhook.domain and as pure: no Kubernetes client, no clock, no I/O.
- `geometry.py`: the GPU models gpupool knows MIG profiles of (memory slices, starts, most instances,
  memory), which product and PCI device IDs name each, and whether a set of instances fits one GPU;
- `config.py`: mig-parted's config file (`version: v1`, `mig-configs`), read as hostile input;
- `layouts.py`: what a named layout yields on a node's GPUs, per device filter and GPU model;
- `planner.py`: which opted-in, idle nodes to re-cut to which named layout for the Pods that wait;
- `follow.py`: where a change gpupool asked for stands (in flight, done, failed, stuck);
- `hint.py`: whether some layout gpupool may choose could serve a Pod that no current one can.

How re-cutting works and what is never touched: docs/mig.md.
"""
