"""Part 2, two replicas, one burst: Pods beyond a pool's free GPUs when both replicas admit at once, and the window
in which that can happen (bench/soak.py's docstring says how)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import ssl
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.serverbench.launch import REPO, RESULTS
from bench.soakbench.client import DEADLINE_S, Answer, Connection, persisted, read_answer
from bench.soakbench.metrics import gauge, quantiles, scrape
from bench.soakbench.pools import BURST_FREE, BURST_NS, BURST_PRODUCT, PROBE_NS, PROBE_PRODUCT, bench_pod
from bench.soakbench.prober import Prober
from bench.soakbench.reviews import review_body
from bench.soakbench.servers import Server, bench_cluster, servers
from bench.soakbench.sim import SimApi, Simulator


def burst_once(
    replicas: list[Server], context: ssl.SSLContext, sim: Simulator, number: int, per_replica_connections: int
) -> dict[str, Any]:
    """100 one-GPU Pods, interleaved between the replicas, each replica's share over its own
    connections, all started together; every admitted Pod created at once."""
    pods = [bench_pod(BURST_NS, f"burst-{number}-", BURST_PRODUCT, generate=True) for _ in range(2 * BURST_FREE)]
    lanes: list[list[int]] = [[] for _ in range(len(replicas) * per_replica_connections)]
    for i in range(len(pods)):
        replica = i % len(replicas)
        lanes[replica * per_replica_connections + (i // len(replicas)) % per_replica_connections].append(i)
    answers: dict[int, tuple[str, Answer, float, float]] = {}
    start = threading.Barrier(len(lanes) + 1)

    def lane(index: int, items: list[int]) -> None:
        server = replicas[index // per_replica_connections]
        conn, api = Connection(server.port, context), sim.api()
        conn.connect()  # and the TLS handshake, before the burst
        start.wait()
        for i in items:
            uid = str(uuid.uuid4())
            sent = time.perf_counter()
            answer = read_answer(*conn.post(review_body(pods[i], uid, dry_run=False), DEADLINE_S), uid)
            answered = time.perf_counter()
            answers[i] = (server.name, answer, sent, answered)
            if answer.outcome == "mutated":
                api.create(persisted(pods[i], answer.patch))
        conn.close()
        api.close()

    threads = [threading.Thread(target=lane, args=(n, items)) for n, items in enumerate(lanes)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join(120)
    took = time.perf_counter() - began
    claimed = Counter(name for name, a, _, _ in answers.values() if a.claimed)
    outcomes = Counter(a.outcome for _, a, _, _ in answers.values())
    return {
        "burst_ms": took * 1e3,
        "answered": len(answers),
        "outcomes": dict(outcomes),
        "claimed_by_replica": dict(claimed),
        "claimed": sum(claimed.values()),
        "beyond_capacity": max(0, sum(claimed.values()) - BURST_FREE),
        "warned_will_wait": sum(1 for _, a, _, _ in answers.values() if a.outcome == "mutated" and not a.claimed),
    }


def reset_burst_pool(replicas: list[Server], api: SimApi, timeout: float = 60.0) -> None:
    """Delete the burst's Pods; wait until both replicas report the 50 GPUs free and nothing reserved."""
    for pod in api.items(f"/api/v1/namespaces/{BURST_NS}/pods"):
        if pod["metadata"]["name"].startswith("burst-"):
            api.delete_pod(BURST_NS, pod["metadata"]["name"])
    pool = f"nvidia/medium/{BURST_PRODUCT}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        texts = [scrape(r.health_port) for r in replicas]
        if all(
            gauge(t, "gpupool_pool_gpus_free", pool) == BURST_FREE and gauge(t, "gpupool_reservations") == 0
            for t in texts
        ):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the replicas do not report {BURST_FREE} free GPUs in {pool}")


def window_once(
    replicas: list[Server], probers: list[Prober], context: ssl.SSLContext, api: SimApi, first: int
) -> dict[str, float]:
    """A real admission on one replica takes the probe pool's only GPU; the Pod is created; time until
    the other replica counts it."""
    admitting, other = replicas[first], probers[1 - first]
    for p in probers:
        p.wait_until(taken=False)
    conn = Connection(admitting.port, context)
    conn.connect()  # beforehand, as kube-apiserver's connections are
    pod = bench_pod(PROBE_NS, "window-", PROBE_PRODUCT, generate=True)
    uid = str(uuid.uuid4())
    sent = time.perf_counter()
    answer = read_answer(*conn.post(review_body(pod, uid, dry_run=False), DEADLINE_S), uid)
    answered = time.perf_counter()
    conn.close()
    if not answer.claimed:
        raise RuntimeError(f"the admission did not claim the probe GPU: {answer}")
    created = api.create(persisted(pod, answer.patch))
    acked = time.perf_counter()
    low, high = other.wait_until(taken=True)
    api.delete_pod(PROBE_NS, created["metadata"]["name"])
    return {
        "from": admitting.name,
        "admission_ms": (answered - sent) * 1e3,
        "create_ms": (acked - answered) * 1e3,
        "window_ms": (high - answered) * 1e3,  # admission answered -> the other replica counts the Pod
        "window_low_ms": max(0.0, low - answered) * 1e3,
        "watch_ms": (high - acked) * 1e3,  # Pod stored -> the other replica counts it
    }


def replicas_burst(args: argparse.Namespace) -> int:
    env_note = f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    print(
        f"two replicas: {args.bursts} bursts of {2 * BURST_FREE} Pods for {BURST_FREE} free GPUs, "
        f"{args.probes} window probes; {args.events:g} Pod events/s, {args.nodes:,} nodes, {args.pods:,} Pods; "
        f"{env_note}",
        flush=True,
    )
    bursts, windows = [], []
    with (
        bench_cluster(args, "burst") as (tmp, context, sim, api),
        servers(Server, ["replica-a", "replica-b"], tmp, sim) as replicas,
    ):
        reset_burst_pool(replicas, api)
        for n in range(args.bursts):
            bursts.append(burst_once(replicas, context, sim, n, args.burst_connections))
            b = bursts[-1]
            print(
                f"  burst {n}: {b['burst_ms']:.0f} ms, claimed {b['claimed']} "
                f"{b['claimed_by_replica']}, beyond capacity {b['beyond_capacity']}",
                flush=True,
            )
            time.sleep(2.0)  # let the churn bind what fits, for the record below
            pods = api.items(f"/api/v1/namespaces/{BURST_NS}/pods")
            mine = [p for p in pods if p["metadata"]["name"].startswith(f"burst-{n}-")]
            b["bound_after_2s"] = sum(1 for p in mine if p["spec"].get("nodeName"))
            b["pending_after_2s"] = len(mine) - b["bound_after_2s"]
            reset_burst_pool(replicas, api)
        probers = [Prober(r, context) for r in replicas]
        for n in range(args.probes):
            windows.append(window_once(replicas, probers, context, api, n % 2))
        for p in probers:
            p.close()
    beyond = [b["beyond_capacity"] for b in bursts]
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "environment": env_note,
        "settings": {
            "bursts": args.bursts,
            "probes": args.probes,
            "events": args.events,
            "nodes": args.nodes,
            "pods": args.pods,
            "free_gpus": BURST_FREE,
            "pods_per_burst": 2 * BURST_FREE,
            "connections_per_replica": args.burst_connections,
        },
        "bursts": bursts,
        "beyond_capacity": {"min": min(beyond), "median": statistics.median(beyond), "max": max(beyond)},
        "window_ms": quantiles([w["window_ms"] for w in windows]),
        "watch_ms": quantiles([w["watch_ms"] for w in windows]),
        "create_ms": quantiles([w["create_ms"] for w in windows]),
        "windows": windows,
        "churn": sim.churn,
    }
    w, ws = result["window_ms"], result["watch_ms"]
    print()
    print("| measure | value |")
    print("|---|---|")
    print(
        f"| Pods placed beyond the {BURST_FREE} free GPUs, per burst of {2 * BURST_FREE} | "
        f"{', '.join(map(str, beyond))} (median {statistics.median(beyond):g}) |"
    )
    print(f"| burst duration, median | {statistics.median(b['burst_ms'] for b in bursts):.0f} ms |")
    print(
        f"| window: admission answered on one replica -> counted by the other, p50 / p90 / max | "
        f"{w['p50']:.1f} / {w['p90']:.1f} / {w['max']:.1f} ms |"
    )
    print(
        f"| of which Pod stored -> counted by the other replica's watch, p50 / p90 / max | "
        f"{ws['p50']:.1f} / {ws['p90']:.1f} / {ws['max']:.1f} ms |"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"burst-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out.relative_to(REPO)}")
    return 0
