"""The figures from the audit log's judge, their baselines from the same run, the goals, and the table."""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
from typing import Any

from bench.queueaudit import Auditor, Release
from bench.queuebench.phases import Run
from bench.soakbench.metrics import quantiles
from webhook.queue.runner import WRITERS
from webhook.testing.synthetic import GPU_MODELS

GOALS = {"p50_s": 0.1, "p99_s": 1.0, "releases_per_s": 200.0, "overbooked": 0, "quota_exceeded": 0, "failover_s": 20.0}
# Issue 27: the leader's RSS, and admissions on the leader's Pod against the follower's (leader / follower).
ADMISSION_GOALS = {
    "leader_rss_mb": 600.0,
    "steady_admission_p50_ratio": 1.5,
    "steady_admission_p99_ratio": 2.0,
    "queue_in_admission_p50_ratio": 1.5,
    "queue_in_admission_p99_ratio": 2.0,
}


def between(releases: list[Release], start: float, end: float) -> list[Release]:
    return [x for x in releases if start <= x.at < end]


def gaps(releases: list[Release]) -> dict[str, float]:
    """Store time between consecutive releases: within a pass, what one release costs the leader (its
    writes are one at a time)."""
    times = sorted(x.at for x in releases)
    return quantiles([b - a for a, b in itertools.pairwise(times)])


def report(r: Run, auditor: Auditor) -> dict[str, Any]:
    marks = r.marks
    steady = between(auditor.releases, marks["steady"], marks["kill"])
    steady_s = marks["kill"] - marks["steady"]
    latency = quantiles([x.latency for x in steady])
    taken = [at for at, term in auditor.terms if at > marks["kill"] and term > r.notes["killed_term"]]
    takeover = taken[0] if taken else math.inf
    after = [x for x in auditor.releases if x.at > takeover]
    failover_release = after[0].at if after else math.inf
    burst_ns = set(r.notes.get("burst_namespaces", []))
    burst = [x for x in between(auditor.releases, marks["burst"], marks["burst_end"] + 1) if x.namespace in burst_ns]
    first_room = min((at for at, name in auditor.nodes_added if at >= marks["burst"]), default=marks["burst"])
    last = max((x.at for x in burst), default=first_room)
    burst_rate = len(burst) / (last - first_room) if burst and last > first_room else 0.0
    quota = [
        {
            "quota": w.rule.name,
            "hard": w.rule.hard,
            "peak": w.peak,
            "excess_peak": w.excess_peak,
            "writes_over": w.writes_over,
            "writes_at_limit": w.at_limit_writes,
        }
        for w in auditor.quotas
    ]
    binds = quantiles([b - a for a, b in auditor.binds])
    book = auditor.overbooking
    result: dict[str, Any] = {
        "args": vars(r.args),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "load": r.load,
        "notes": r.notes,
        "steady": {
            "seconds": steady_s,
            "releases": len(steady),
            "releases_per_s": len(steady) / steady_s if steady_s else 0.0,
            "latency_s": latency,
            "latency_by_class": {
                cls: quantiles([x.latency for x in steady if x.product in products])
                for cls, products in _products_by_class().items()
            },
            "short_capacity": sum(x.short_capacity for x in steady),
            "gaps_s": gaps(steady),
        },
        "failover": {
            "killed": r.notes["killed"],
            "took_over": next((holder for at, holder in auditor.leases if at == takeover), ""),
            "lease_taken_s": takeover - marks["kill"],
            "first_release_s": failover_release - marks["kill"],
            "releases_before_takeover": sum(1 for x in auditor.releases if marks["kill"] < x.at <= takeover),
            "killed_replica_ready_again_s": marks["victim_ready"] - marks["kill"],
        },
        "burst": {
            "releases": len(burst),
            "nodes": r.notes.get("burst_nodes", 0),
            "nodes_posted_s": marks["burst_nodes_posted"] - marks["burst"],
            "first_room_to_last_release_s": last - first_room,
            "releases_per_s": burst_rate,
            "latency_s": quantiles([x.latency for x in burst]),
            "gaps_s": gaps(burst),
        },
        "overbooked": {
            "peak_gpus": book.peak,
            "writes_over": book.writes_over,
            "gpu_seconds": book.gpu_seconds,
            "node_peak_gpus": book.node_peak,
        },
        "quotas": quota,
        "release_to_bind_s": binds,
        "audit": {
            "writes": auditor.writes,
            "gaps": auditor.gaps,
            "signatures_off_pool": auditor.signatures_off_pool,
            "bound_off_pool": auditor.bound_off_pool,
            "node_changes": auditor.node_changes,
            "releases": len(auditor.releases),
        },
        "memory": r.notes.get("memory"),
    }
    result["baselines"] = baselines(result)
    result["goals"] = judge(result)
    return result


def baselines(result: dict[str, Any]) -> dict[str, float]:
    """The figures as ratios of what the API allows in the same run: releases/s against the PATCHes/s the
    simulator takes from as many writers as the leader has (gpupool's own client, nothing else writing),
    and release latency against one bare PATCH round trip measured during the steady phase."""
    capacity = (result["notes"].get("write_capacity") or {}).get(f"gpupool x{WRITERS}") or {}
    probes = result["notes"].get("probes_steady") or {}
    probe, watched = probes.get("write_raw") or {}, probes.get("write_raw_then_watched") or {}
    latency = result["steady"]["latency_s"]
    out: dict[str, float] = {}
    if capacity.get("patches_per_s"):
        out["burst_releases_per_api_patch"] = result["burst"]["releases_per_s"] / capacity["patches_per_s"]
    if probe.get("p50") and latency:
        out["latency_p50_in_round_trips"] = latency["p50"] / probe["p50"]
        out["latency_p99_in_round_trips"] = latency["p99"] / probe["p99"]
    if probe.get("p50") and watched.get("p50") and latency:
        # The least a release can take: the write that made room reaching a watcher, then one PATCH.
        out["floor_p50_s"] = watched["p50"] + probe["p50"]
        out["latency_p50_over_floor"] = latency["p50"] / out["floor_p50_s"]
    return out


def _products_by_class() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m in GPU_MODELS:
        out.setdefault(m.gpu_class, set()).add(m.product)
    return out


def judge(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    latency = result["steady"]["latency_s"]
    quota_peak = max((q["excess_peak"] for q in result["quotas"]), default=0)
    measured = {
        "p50_s": latency.get("p50", math.inf),
        "p99_s": latency.get("p99", math.inf),
        "releases_per_s": result["burst"]["releases_per_s"],
        "overbooked": result["overbooked"]["peak_gpus"],
        "quota_exceeded": quota_peak,
        "failover_s": result["failover"]["first_release_s"],
    }
    goals = dict(GOALS)
    steady = result["notes"].get("probes_steady") or {}
    measured.update(_ratios("steady", steady))
    memory = result.get("memory")
    if memory:
        measured.update(_ratios("queue_in", memory["probes_while_queueing"]))
        measured["leader_rss_mb"] = max(memory[k]["leader"]["rss_mb"] for k in ("after", "idle_end"))
    goals.update({name: goal for name, goal in ADMISSION_GOALS.items() if name in measured})
    at_least = {"releases_per_s"}
    return {
        name: {
            "goal": goal,
            "measured": measured[name],
            "met": measured[name] >= goal if name in at_least else measured[name] <= goal,
        }
        for name, goal in goals.items()
    }


def _ratios(phase: str, probes: dict[str, dict[str, float]]) -> dict[str, float]:
    """Admissions to the leader's replica over the follower's, p50 and p99, as probed in one phase."""
    leader, follower = probes.get("admission_leader") or {}, probes.get("admission_follower") or {}
    if not leader or not follower:
        return {}
    return {f"{phase}_admission_{q}_ratio": leader[q] / follower[q] for q in ("p50", "p99") if follower.get(q)}


def print_report(result: dict[str, Any]) -> None:
    s, f, b = result["steady"], result["failover"], result["burst"]
    lat = s["latency_s"]
    print(
        f"\nsteady ({s['seconds']:.0f} s, {result['args']['finish_rate']:g} finishes/s, "
        f"{result['args']['queued']:,} queued): {s['releases']:,} releases, {s['releases_per_s']:.0f}/s"
    )
    if lat:
        print(
            f"  release latency room -> gate removed: p50 {lat['p50'] * 1e3:.0f} ms, p90 {lat['p90'] * 1e3:.0f} ms, "
            f"p99 {lat['p99'] * 1e3:.0f} ms, max {lat['max'] * 1e3:.0f} ms"
        )
    print(
        f"failover: Lease taken {f['lease_taken_s']:.1f} s after the SIGKILL (by {f['took_over']}), "
        f"first release {f['first_release_s']:.1f} s; the killed replica ready again after "
        f"{f['killed_replica_ready_again_s']:.1f} s"
    )
    print(
        f"burst: {b['releases']:,} released in {b['first_room_to_last_release_s']:.2f} s from the first node: "
        f"{b['releases_per_s']:.0f}/s (nodes created in {b['nodes_posted_s']:.2f} s)"
    )
    for phase in ("steady", "burst"):
        probes = result["notes"].get(f"probes_{phase}") or {}
        print(
            f"  {phase} probes (p50/p99 ms): "
            + ", ".join(f"{name} {q['p50'] * 1e3:.1f}/{q['p99'] * 1e3:.1f}" for name, q in probes.items() if q)
        )
        g = result[phase]["gaps_s"]
        if g:
            print(f"  {phase}: between consecutive releases p50 {g['p50'] * 1e3:.1f} ms")
    for name, c in (result["notes"].get("write_capacity") or {}).items():
        print(f"  API write capacity, {name}: {c['patches_per_s']:.0f} PATCH/s, p50 {c['p50'] * 1e3:.1f} ms")
    base = result.get("baselines") or {}
    if "burst_releases_per_api_patch" in base:
        ratio = base["burst_releases_per_api_patch"]
        print(f"  burst releases/s = {ratio:.2f}x the API's PATCH/s from {WRITERS} writers")
    if "floor_p50_s" in base:
        print(
            f"  the API's floor (a write reaching a watcher of every Pod, then one PATCH): p50 "
            f"{base['floor_p50_s'] * 1e3:.0f} ms; the release latency is {base['latency_p50_over_floor']:.1f}x it"
        )
    if "latency_p50_in_round_trips" in base:
        print(
            f"  steady release latency = {base['latency_p50_in_round_trips']:.1f}x (p50), "
            f"{base['latency_p99_in_round_trips']:.1f}x (p99) a bare PATCH's round trip in the same phase"
        )
    o = result["overbooked"]
    print(f"overbooked: peak {o['peak_gpus']} GPUs, {o['writes_over']} writes, {o['gpu_seconds']:.2f} GPU-seconds")
    for q in result["quotas"]:
        print(
            f"quota {q['quota']}: hard {q['hard']}, peak {q['peak']}, exceeded by {q['excess_peak']} "
            f"(at its limit after {q['writes_at_limit']:,} writes)"
        )
    m = result.get("memory")
    if m:
        for role in ("leader", "follower"):
            print(
                f"memory {role}: RSS {m['before'][role]['rss_mb']:.0f} -> {m['after'][role]['rss_mb']:.0f} MB "
                f"with {m['before'][role]['queued']:.0f} -> {m['after'][role]['queued']:.0f} queued; "
                f"CPU {m['cpu_after'][role]:.0f} % of a core; admission p50/p99 "
                f"{m['admission_after'][role]['p50'] * 1e3:.2f}/{m['admission_after'][role]['p99'] * 1e3:.2f} ms "
                f"(before {m['admission_before'][role]['p50'] * 1e3:.2f}/"
                f"{m['admission_before'][role]['p99'] * 1e3:.2f}; while queueing "
                f"{m['probes_while_queueing'][f'admission_{role}']['p50'] * 1e3:.0f}/"
                f"{m['probes_while_queueing'][f'admission_{role}']['p99'] * 1e3:.0f}); RSS "
                f"{m['idle_end'][role]['rss_mb']:.0f} MB after {m['idle_s']:.0f} s more with nothing changing"
            )
    print(
        "load (CPU % of one core): "
        + json.dumps({k: {n: round(v) for n, v in d.items()} for k, d in result["load"].items()})
    )
    print(
        "goals: "
        + ", ".join(f"{k} {'met' if v['met'] else 'MISSED'} ({v['measured']:.3g})" for k, v in result["goals"].items())
    )
