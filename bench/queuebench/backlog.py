"""`--backlog N`: N Pods queued past their quota, created straight in the simulator as gpupool leaves them.

Queueing 100,000 Pods through the webhook takes about 12 minutes on this machine, all of it admissions the
backlog's figures do not need (the memory phase's queue-in through both replicas measures those). So each
distinct shape of backlog Pod (class high, one GPU, priority 0 or 100: all `queued_pod` varies for the
namespace) is admitted for real, once through each replica; both answers must carry the same patch, and
that patch, applied with jsonpatch as kube-apiserver applies it (`persisted`), makes every backlog Pod of
that shape, which is then POSTed to the simulator. What the replicas watch is the Pod kube-apiserver would
have stored after the webhook: gated, annotated and limited exactly so, with its own name and priority.
"""

from __future__ import annotations

import copy
import random
import time
from typing import Any

import orjson

from bench.queueaudit import Auditor
from bench.queuebench.cluster import BACKLOG, now, queued_pod
from bench.queuebench.creator import Creator, wait_queued
from bench.queuebench.replicas import Replica
from bench.queuebench.sim import post_all
from bench.soakbench.client import persisted
from bench.soakbench.sim import Simulator

PRIORITIES = (0, 100)  # queued_pod's: one Pod in ten at 100


def shape_patches(creator: Creator, rng: random.Random) -> dict[int, list[dict[str, Any]]]:
    """Per priority, the patch gpupool answers for a backlog Pod of it, the same from both replicas."""
    conns = creator.connections()
    patches: dict[int, list[dict[str, Any]]] = {}
    try:
        for priority in PRIORITIES:
            answers = []
            for first in range(len(conns)):
                pod = shape_pod(f"{BACKLOG.name}-shape-{priority}-{first}", priority, rng)
                answers.append(creator.admit(conns, pod, first))
            if len({orjson.dumps(patch, option=orjson.OPT_SORT_KEYS) for _, patch in answers}) != 1:
                raise RuntimeError(f"the replicas' patches for one backlog shape differ: {answers}")
            if sorted(i for i, _ in answers) != list(range(len(conns))):
                raise RuntimeError(f"a replica did not answer for the backlog's shape: {answers}")
            patches[priority] = answers[0][1]
    finally:
        for conn in conns:
            conn.close()
    return patches


def shape_pod(name: str, priority: int, rng: random.Random) -> dict[str, Any]:
    pod = queued_pod(BACKLOG.name, "high", name, rng, quota=False)
    pod["spec"]["priority"] = priority
    return pod


def make_backlog(creator: Creator, sim: Simulator, auditor: Auditor, reps: list[Replica], n: int) -> dict[str, Any]:
    """N backlog Pods waiting, as the auditor and both replicas count them; the seconds each step took and
    the patches applied (per priority)."""
    rng = random.Random(n)
    began = now()
    patches = shape_patches(creator, rng)
    pods = []
    for k in range(n):
        pod = queued_pod(BACKLOG.name, "high", f"{BACKLOG.name}-{k:06d}", rng, quota=False)
        pods.append(persisted(pod, copy.deepcopy(patches[pod["spec"]["priority"]])))
    built = now()
    post_all(sim, pods)
    del pods
    posted = now()
    # One of them is released to the quota's one GPU, and never finishes: the webhook queues one more.
    wait_queued(auditor, {BACKLOG.name: n}, 600, creator)
    total = sum(auditor.snapshot()["waiting"].values())
    deadline = now() + 600
    while min(rep.queued() for rep in reps) < total:
        if now() > deadline:
            raise TimeoutError(f"the replicas never counted {total:,} waiting: {[rep.queued() for rep in reps]}")
        time.sleep(1)
    counted = now()
    steps = {"built_s": built - began, "posted_s": posted - built, "counted_s": counted - posted}
    return {"seconds": {k: round(v, 1) for k, v in steps.items()}, "patches": patches}
