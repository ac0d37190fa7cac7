"""The run's record (marks, load, notes) and its phases after the steady one: failover, burst and memory."""

from __future__ import annotations

import argparse
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.queueaudit import GPU, Auditor
from bench.queuebench.cluster import BACKLOG, OPEN, burst_node, now
from bench.queuebench.creator import Creator, keep_topped_up, targets, top_up, wait_queued
from bench.queuebench.meters import Profile, cpu_percent, meter
from bench.queuebench.probes import Probes, timed_probes
from bench.queuebench.replicas import Replica, leader_of, roles_of
from bench.queuebench.sim import post_all
from bench.serverbench.launch import ready
from bench.soakbench.procfs import rss_mb
from bench.soakbench.sim import Simulator
from webhook.testing.synthetic import GPU_MODELS


@dataclass
class Run:
    args: argparse.Namespace
    marks: dict[str, float] = field(default_factory=dict)
    load: dict[str, dict[str, float]] = field(default_factory=dict)  # CPU % per phase, by process
    notes: dict[str, Any] = field(default_factory=dict)
    ca: Path = Path()  # the replicas' CA certificate, for clients of their own


HOLDER_SECONDS = 60.0  # the most failover() waits for a leader to kill: a Lease handed back, or expired, and taken


def wait_for_leader(reps: list[Replica], auditor: Auditor, seconds: float = HOLDER_SECONDS) -> tuple[str, Replica, int]:
    """The Lease's holder, its replica and that replica's leader process, waited for up to `seconds`: the
    Lease may have no holder (handed back by a leader process that stopped, until the next takes it) or name
    a replica whose leader process is being restarted (its pid not known yet)."""
    deadline = now() + seconds
    while True:
        holder = auditor.snapshot()["holder"]
        found = leader_of(reps, holder) if holder else None
        if found is not None:
            return holder, *found
        if now() >= deadline:
            raise TimeoutError(f"no replica's leader process held the Lease for {seconds:g} s (holder {holder!r})")
        time.sleep(0.2)


def failover(r: Run, reps: list[Replica], auditor: Auditor, creator: Creator, wanted: dict[str, int]) -> None:
    holder, victim, pid = wait_for_leader(reps, auditor)
    r.notes["killed"] = holder
    r.notes["killed_term"] = term = auditor.snapshot()["term"]
    r.marks["kill"] = now()
    os.kill(pid, signal.SIGKILL)
    deadline = r.marks["kill"] + 90
    while now() < deadline:
        top_up(creator, auditor, wanted)
        snap = auditor.snapshot()
        # A new term: the other replica, or the victim's restarted leader process once it has synced.
        if snap["holder"] and snap["term"] > term and snap["last_release_at"] > r.marks["kill"]:
            break
        time.sleep(0.1)
    keep_topped_up(creator, auditor, wanted, now() + 5)
    r.marks["failover_end"] = now()
    respawned = now() + 600
    while now() < respawned and not ready(victim.health_port):  # the killed leader process's successor running
        time.sleep(0.2)
    r.marks["victim_ready"] = now()
    print(f"failover: killed {holder} ({victim.name}); the Lease went to {auditor.snapshot()['holder']}", flush=True)


def burst(
    r: Run,
    sim: Simulator,
    auditor: Auditor,
    *,
    creator: Creator,
    nodes: list[dict[str, Any]],
    reps: list[Replica],
) -> None:
    """`--queued` medium Pods waiting, then room for all of them at once: L4 nodes of 8 GPUs join."""
    args = r.args
    medium = [space for space in OPEN if space.classes == ("medium",)]
    wanted = targets(args.queued, medium)
    medium_products = {m.product for m in GPU_MODELS if m.gpu_class == "medium"}
    deadline = now() + 900
    while True:  # the room left from the steady phase taken (a leader that fell behind still releases into it)
        wait_queued(auditor, wanted, 600, creator)
        snap = auditor.snapshot()
        if not any(snap["room"].get(p, 0) for p in medium_products) and now() - snap["last_release_at"] > 2:
            break
        if now() > deadline:
            raise TimeoutError(f"medium room never ran out before the burst: {snap['room']}")
        time.sleep(0.5)
    template = next(
        n
        for n in nodes
        if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-L4"
        and n["status"]["allocatable"].get(GPU) == "8"
        and not n["spec"].get("unschedulable")
    )
    # Room for every Pod waiting, not only the burst's: the quota namespaces' Pods (medium ones among them)
    # take room too as their quotas free, and a burst Pod left without room would wait for a finish, which
    # is not the release rate this phase measures.
    waiting_now = auditor.snapshot()["waiting"]
    room_for = sum(n for ns, n in waiting_now.items() if ns != BACKLOG.name)  # the backlog waits on its quota
    count = math.ceil(room_for / 8)
    new_nodes = [burst_node(template, k) for k in range(count)]
    cpu = meter(sim, reps)
    holder, _, pid = wait_for_leader(reps, auditor)
    spy = Profile(args, pid, "burst", 12)
    probes = Probes(sim, r.ca, roles_of(reps, holder))
    r.marks["burst"] = now()
    post_all(sim, new_nodes)
    r.marks["burst_nodes_posted"] = now()
    deadline = now() + 120
    while now() < deadline:
        waiting = auditor.snapshot()["waiting"]
        if sum(waiting.get(ns, 0) for ns in wanted) == 0:
            break
        time.sleep(0.1)
    r.marks["burst_end"] = now()
    r.load["burst"] = cpu.read()
    r.notes["probes_burst"] = probes.stop()
    r.notes["profile_burst"] = spy.summary()
    r.notes["burst_namespaces"] = list(wanted)
    r.notes["burst_nodes"] = count
    r.notes["burst_pods"] = sum(waiting_now.get(ns, 0) for ns in wanted)
    print(f"burst: {count} nodes of 8 GPUs for {room_for} queued Pods", flush=True)


def memory(r: Run, sim: Simulator, reps: list[Replica], auditor: Auditor, *, creator: Creator) -> None:
    """Many Pods queued with no room: the leader's RSS and CPU against a follower's, and their admissions."""
    args = r.args
    holder, _, _ = wait_for_leader(reps, auditor)
    roles = roles_of(reps, holder)
    leader = roles["leader"]
    r.marks["memory"] = now()
    # The queue is in each replica's leader process (the workers only admit).
    before = {role: {"rss_mb": rss_mb(rep.leader_process()), "queued": rep.queued()} for role, rep in roles.items()}
    waiting_before = sum(auditor.snapshot()["waiting"].values())
    before_cpu = cpu_percent({role: rep.leader_process() for role, rep in roles.items()}, 10)
    before_probe = timed_probes(sim, r.ca, roles, args.probe_seconds)
    waiting = auditor.snapshot()["waiting"]
    high = [space for space in OPEN if space.classes == ("high",)]
    wanted = {ns: waiting.get(ns, 0) + n for ns, n in targets(args.memory_queued, high).items()}
    began = now()
    probes = Probes(sim, r.ca, roles)
    wait_queued(auditor, wanted, 1800, creator)
    during = probes.stop()
    total = sum(auditor.snapshot()["waiting"].values())
    deadline = now() + 120
    while now() < deadline and min(rep.queued() for rep in roles.values()) < total:
        time.sleep(0.5)
    r.marks["memory_queued"] = now()
    print(f"memory: {args.memory_queued:,} more Pods queued in {now() - began:.1f} s ({total:,} waiting)", flush=True)
    time.sleep(10)  # the leader has made passes over all of them
    after = {role: {"rss_mb": rss_mb(rep.leader_process()), "queued": rep.queued()} for role, rep in roles.items()}
    spy = Profile(args, leader.leader_process(), "memory", 10)
    after_cpu = cpu_percent({role: rep.leader_process() for role, rep in roles.items()}, 10)
    r.notes["profile_memory"] = spy.summary()
    after_probe = timed_probes(sim, r.ca, roles, args.probe_seconds)
    r.marks["memory_end"] = now()
    idle_end = {role: {"rss_mb": rss_mb(rep.leader_process()), "queued": rep.queued()} for role, rep in roles.items()}
    r.notes["memory"] = {
        "leader": f"{leader.name} ({holder})",
        "waiting_before": waiting_before,
        "waiting": total,
        "before": before,
        "after": after,
        "idle_end": idle_end,  # RSS again after the idle probes: flat while nothing changes
        "idle_s": r.marks["memory_end"] - r.marks["memory_queued"],
        "cpu_before": {k: v for k, v in before_cpu.items() if k in roles or k == "others"},
        "cpu_after": {k: v for k, v in after_cpu.items() if k in roles or k == "others"},
        "admission_before": before_probe,
        "probes_while_queueing": during,
        "queueing_s": r.marks.get("memory_queued", 0.0) - r.marks["memory"],
        "admission_after": after_probe,
    }
