"""The live inventory at Kubernetes' supported scale: the cold sync side by side with a bare client that only
lists and decodes, where its time goes, watch events, and a decision with the cache loaded.

The API simulator serves 5,000 nodes and 150,000 Pods from its own process, so that only the client is
measured; each client runs in a fresh process of its own, and its peak RSS is that process's ru_maxrss.

1. Cold sync, in interleaved rounds (the order of the clients turns each round), wall and CPU time:
   - bare: `CoreV1Api` lists nodes, Pods and ResourceQuotas in pages of 500 with `_preload_content=False`
     and `orjson.loads` every page; nothing else (the floor of listing and decoding, as a client does it);
   - bare, collector paused: the same with Python's garbage collector paused while a page is decoded,
     as gpupool's reflector does (webhook.sources.reflector): the floor on this stack;
   - gpupool: `LiveInventory` with the queue's observer (webhook.queue.waiting), as `gpupool serve` runs
     it, until ready. Its reflectors ask for the next page while they deliver one; the bare clients ask
     in turn, as a client does by default.
2. Where the time goes: the same lists in one thread, step by step (list pages, decode, project, index,
   observe), CPU time per step beside the floor of each step, and the wall time of the list calls (the
   simulator's share: serving, encoding, the wire).
3. Watch events: MODIFIED Pod events (raw JSON lines, as the watch delivers them) decoded, projected and
   applied to the loaded cache: 1-GPU Pods turning Running and Succeeded on 500 of its GPU nodes, so
   every event changes a pool's free GPUs.
4. Admission latency with that cache loaded vs. the demo inventory, interleaved.
5. With `--typed-pods N` (default 20,000; 0 skips it): the client's typed models, run on the first N
   Pods and extrapolated linearly to all of them.

    .venv/bin/python bench/bench_cache.py [--rounds 3] [--nodes 5000] [--pods 150000] [--typed-pods 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# `--against DIR` runs the gpupool client on another checkout's code: its children import from there.
sys.path.insert(0, os.environ.get("BENCH_CODE_ROOT") or str(ROOT))

PAGE = 500
CLIENTS = ["bare", "bare-paused", "gpupool"]
AGAINST = "gpupool, --against"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Clock:
    """Wall and CPU time (every thread of this process) since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict[str, float]:
        return {"wall_s": time.perf_counter() - self.wall, "cpu_s": time.process_time() - self.cpu}


def core_v1(kubeconfig: str) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))


def list_calls(api: Any) -> dict[str, Callable[..., Any]]:
    return {
        "nodes": api.list_node,
        "pods": api.list_pod_for_all_namespaces,
        "resourcequotas": api.list_resource_quota_for_all_namespaces,
    }


def child_bare(kubeconfig: str, paused: bool) -> dict[str, Any]:
    """List and decode every page, keeping nothing: what any client of this API pays."""
    import orjson

    from webhook.sources.reflector import COLLECTOR_PAUSED

    api = core_v1(kubeconfig)  # importing the client's models is startup, not the sync: outside the clock
    baseline = rss_mb()
    clock = Clock()
    objects = 0
    for call in list_calls(api).values():
        cont = ""
        while True:
            body = call(_preload_content=False, limit=PAGE, **({"_continue": cont} if cont else {})).data
            if paused:
                with COLLECTOR_PAUSED:
                    page = orjson.loads(body)
                    objects += len(page["items"])
                    cont = page["metadata"].get("continue") or ""
                    del page
            else:
                page = orjson.loads(body)
                objects += len(page["items"])
                cont = page["metadata"].get("continue") or ""
            if not cont:
                break
    return {**clock.read(), "peak_rss_mb": rss_mb(), "baseline_rss_mb": baseline, "objects": objects}


def child_gpupool(kubeconfig: str, events: int) -> dict[str, Any]:
    import orjson

    from bench.bench_decision import PODS
    from webhook.admission.core import evaluate
    from webhook.domain.policy import load_policy
    from webhook.queue.waiting import Waiting
    from webhook.sources.live import LiveInventory
    from webhook.sources.snapshot import SnapshotInventory

    policy = load_policy(None)
    api = core_v1(kubeconfig)  # outside the clock, as for the bare client
    baseline = rss_mb()
    clock = Clock()
    live = LiveInventory(policy, api)
    live.observe(Waiting(policy))  # as `gpupool serve` does: the queue follows every page
    live.start()
    assert live.wait_ready(600), "no sync"
    sync = clock.read()
    peak = rss_mb()
    with live.read() as index:
        gpu_pods = len(index.usage.pod_keys())
        all_gpu = sorted(n for p in index.capacity.pools() for g in p.groups.values() for n in g.nodes)
        gpu_nodes = all_gpu[:: max(len(all_gpu) // 500, 1)][:500]  # spread over every pool
    # Watch events: Pods flipping between Running and Succeeded on GPU nodes, so each one updates a pool.
    lines = []
    for i in range(events):
        node = gpu_nodes[i % len(gpu_nodes)]
        phase = "Running" if (i // 500) % 2 == 0 else "Succeeded"
        pod = {
            "metadata": {"name": f"bench-{i % 500}", "namespace": "team-a", "resourceVersion": str(10**7 + i)},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}, "requests": {"cpu": "1"}},
                    }
                ],
            },
            "status": {"phase": phase},
        }
        lines.append(orjson.dumps({"type": "MODIFIED", "object": pod}))
    start = time.perf_counter()
    for line in lines:
        event = orjson.loads(line)
        live.apply("pods", event["type"], event["object"])
    events_s = time.perf_counter() - start
    demo = SnapshotInventory.from_file(str(ROOT / "examples" / "cluster.yaml"), policy)
    timings: dict[str, list[float]] = {"demo": [], "live": []}
    for _ in range(20):
        for name, inventory in (("demo", demo), ("live", live)):
            for i in range(250):
                with inventory.read() as index:
                    t = time.perf_counter_ns()
                    evaluate(PODS[i % len(PODS)], "team-a", policy, index, explain=False)
                    timings[name].append((time.perf_counter_ns() - t) / 1e6)
    live.close()
    return {
        **sync,
        "peak_rss_mb": peak,
        "baseline_rss_mb": baseline,
        "gpu_pods_kept": gpu_pods,
        "events": events,
        "events_per_s": events / events_s,
        "decision": {
            k: {"median_ms": statistics.median(v), "p99_ms": sorted(v)[int(0.99 * len(v))]} for k, v in timings.items()
        },
    }


STEPS = ("list", "decode", "project", "index", "observe")


def child_steps(kubeconfig: str) -> dict[str, Any]:
    """The sync's steps one after the other in one thread (nodes, then Pods, then quotas), each timed
    alone: `Reflector._list_all` and `LiveInventory.replace` per page, run by hand (list, decode,
    `project_page`, `apply_page`, the queue's `Waiting.replace`), with the floor of each step measured on
    the same page. CPU seconds per step and kind."""
    import orjson

    from webhook.domain.policy import load_policy
    from webhook.queue.waiting import Waiting
    from webhook.sources.live import LiveInventory
    from webhook.sources.reflector import COLLECTOR_PAUSED

    policy = load_policy(None)
    api = core_v1(kubeconfig)
    live, waiting = LiveInventory(policy, api), Waiting(policy)  # not started: driven page by page here
    cpu: dict[str, dict[str, float]] = {}
    floors: dict[str, dict[str, float]] = {}
    list_wall: dict[str, float] = {}

    @contextmanager
    def timed(table: dict[str, dict[str, float]], kind: str, step: str) -> Iterator[None]:
        start = time.process_time()
        yield
        row = table.setdefault(kind, {})
        row[step] = row.get(step, 0.0) + time.process_time() - start

    for kind, call in list_calls(api).items():
        cont, first = "", True
        while True:
            wall = time.perf_counter()
            with timed(cpu, kind, "list"):
                body = call(_preload_content=False, limit=PAGE, **({"_continue": cont} if cont else {})).data
            list_wall[kind] = list_wall.get(kind, 0.0) + time.perf_counter() - wall
            with COLLECTOR_PAUSED:
                with timed(cpu, kind, "decode"):
                    page = orjson.loads(body)
                items, cont = page["items"], page["metadata"].get("continue") or ""
                with timed(cpu, kind, "project"):
                    projected = live.project_page(kind, items)
                with timed(cpu, kind, "index"):
                    live.apply_page(kind, items, projected, first, not cont)
                with timed(cpu, kind, "observe"):
                    waiting.replace(kind, items, first, not cont)
                # Floors: touch each object once (a projection reads at least its spec), store each kept
                # projection once, look once for the scheduling gates the queue follows.
                with timed(floors, kind, "project"):
                    for obj in items:
                        obj.get("spec")
                held: dict[Any, Any] = {}
                with timed(floors, kind, "index"):
                    for key, value in projected:
                        if value is not None:
                            held[key] = value
                with timed(floors, kind, "observe"):
                    for obj in items:
                        (obj.get("spec") or {}).get("schedulingGates")
                del projected, held
                with timed(cpu, kind, "decode"):  # freeing the page: the bare client pays that too
                    items.clear()
                    page.clear()
                del page, items
            first = False
            if not cont:
                break
    with live.read() as index:
        kept = len(index.usage.pod_keys())
    return {"cpu_s": cpu, "floor_cpu_s": floors, "list_wall_s": list_wall, "kept": kept}


def child_typed(kubeconfig: str, pods: int) -> dict[str, Any]:
    api = core_v1(kubeconfig)
    baseline = rss_mb()
    clock = Clock()
    kept: list[Any] = []
    nodes = api.list_node(limit=PAGE)
    kept.extend(nodes.items)
    while nodes.metadata._continue:
        nodes = api.list_node(limit=PAGE, _continue=nodes.metadata._continue)
        kept.extend(nodes.items)
    n_nodes = len(kept)
    cont = None
    while len(kept) - n_nodes < pods:
        page = (
            api.list_pod_for_all_namespaces(limit=PAGE, _continue=cont)
            if cont
            else api.list_pod_for_all_namespaces(limit=PAGE)
        )
        kept.extend(page.items)
        cont = page.metadata._continue
        if not cont:
            break
    return {
        "seconds": clock.read()["wall_s"],
        "peak_rss_mb": rss_mb(),
        "baseline_rss_mb": baseline,
        "nodes": n_nodes,
        "pods": len(kept) - n_nodes,
    }


def run_child(mode: str, kubeconfig: str, extra: int, code: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "BENCH_CODE_ROOT": code} if code else None
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, kubeconfig, str(extra)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def child(mode: str, kubeconfig: str, extra: int) -> dict[str, Any]:
    if mode == "bare":
        return child_bare(kubeconfig, paused=False)
    if mode == "bare-paused":
        return child_bare(kubeconfig, paused=True)
    if mode == "gpupool":
        return child_gpupool(kubeconfig, extra)
    if mode == "steps":
        return child_steps(kubeconfig)
    return child_typed(kubeconfig, extra)


def median(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(r[field] for r in runs)


def report_sync(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], load: list[float]) -> None:
    print(f"\ncold sync of {args.nodes:,} nodes and {args.pods:,} Pods: {args.rounds} interleaved rounds, medians")
    print(f"load average (1 min) before each round: {', '.join(f'{x:.1f}' for x in load)}")
    print(f"{'client':<26}{'wall s':>8}{'CPU s':>8}{'peak RSS MB':>13}   per round (wall / CPU)")
    for name, client_runs in runs.items():
        rounds = "  ".join(f"{r['wall_s']:.1f}/{r['cpu_s']:.1f}" for r in client_runs)
        print(
            f"{name:<26}{median(client_runs, 'wall_s'):>8.2f}{median(client_runs, 'cpu_s'):>8.2f}"
            f"{median(client_runs, 'peak_rss_mb'):>13.0f}   {rounds}"
        )
    pairs = [
        ("gpupool", "bare"),
        ("gpupool", "bare-paused"),
        *([(AGAINST, "bare"), ("gpupool", AGAINST)] if AGAINST in runs else []),
    ]
    for side, base in pairs:
        for field, label in (("wall_s", "wall"), ("cpu_s", "CPU")):
            ratios = [g[field] / b[field] for g, b in zip(runs[side], runs[base], strict=True)]
            print(
                f"{side} / {base}, {label}: median {statistics.median(ratios):.2f}x "
                f"(rounds: {', '.join(f'{r:.2f}x' for r in ratios)})"
            )
    print(f"GPU Pods kept: {runs['gpupool'][0]['gpu_pods_kept']:,}")


def report_steps(steps: dict[str, Any]) -> None:
    cpu, floors = steps["cpu_s"], steps["floor_cpu_s"]
    print("\nwhere the CPU goes: the same lists step by step in one thread (CPU seconds; floor in brackets)")
    print(f"{'kind':<16}" + "".join(f"{s:>18}" for s in STEPS) + f"{'total':>9}{'list wall s':>13}")
    for kind, row in cpu.items():
        cells = [f"{row[s]:.3f}" + (f" [{floors[kind][s]:.3f}]" if s in floors[kind] else " [same]") for s in STEPS]
        wall = steps["list_wall_s"][kind]
        print(f"{kind:<16}" + "".join(f"{c:>18}" for c in cells) + f"{sum(row.values()):>9.2f}{wall:>13.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--typed-pods", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--against", metavar="DIR", help="also sync with the gpupool code of this checkout")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, kubeconfig, extra = args.child
        print(json.dumps(child(mode, kubeconfig, int(extra))))
        return 0
    clients = [*CLIENTS, *([AGAINST] if args.against else [])]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in clients}
    load: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        sim = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook.testing",
                "--nodes",
                str(args.nodes),
                "--pods",
                str(args.pods),
                "--kubeconfig",
                kubeconfig,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert sim.stdout is not None
            print(sim.stdout.readline().strip())
            for i in range(args.rounds):
                load.append(os.getloadavg()[0])
                order = clients[i % len(clients) :] + clients[: i % len(clients)]
                for name in order:
                    code = str(Path(args.against).resolve()) if name == AGAINST else None
                    runs[name].append(run_child("gpupool" if code else name, kubeconfig, args.events, code))
            steps = run_child("steps", kubeconfig, 0)
            typed = run_child("typed", kubeconfig, args.typed_pods) if args.typed_pods else None
        finally:
            sim.terminate()
            sim.wait(30)
    report_sync(args, runs, load)
    report_steps(steps)
    gp = runs["gpupool"]
    print(
        f"\nwatch events applied: {statistics.median(r['events_per_s'] for r in gp):,.0f} events/s "
        f"(median; {gp[0]['events']:,} MODIFIED Pod events)"
    )
    print("\nadmission decision with the cache loaded (medians over the rounds)")
    print(f"{'inventory':<24}{'median ms':>10}{'p99 ms':>10}")
    d = {
        name: {f: statistics.median(r["decision"][name][f] for r in gp) for f in ("median_ms", "p99_ms")}
        for name in ("demo", "live")
    }
    for name, label in (("demo", "demo (examples/)"), ("live", f"live ({args.nodes:,} nodes)")):
        print(f"{label:<24}{d[name]['median_ms']:>10.4f}{d[name]['p99_ms']:>10.4f}")
    print(
        f"ratio live/demo: median {d['live']['median_ms'] / d['demo']['median_ms']:.2f}x, "
        f"p99 {d['live']['p99_ms'] / d['demo']['p99_ms']:.2f}x"
    )
    typed_extrapolated = None
    if typed is not None:
        scale = args.pods / max(typed["pods"], 1)
        typed_extrapolated = {
            "seconds": typed["seconds"] * scale,
            "peak_rss_mb": typed["baseline_rss_mb"] + (typed["peak_rss_mb"] - typed["baseline_rss_mb"]) * scale,
        }
        print(f"\ntyped models: {typed['pods']:,} Pods in {typed['seconds']:.1f} s, {typed['peak_rss_mb']:.0f} MB")
        print(
            f"extrapolated to {args.pods:,}: {typed_extrapolated['seconds']:.1f} s, "
            f"{typed_extrapolated['peak_rss_mb']:.0f} MB; gpupool "
            f"{typed_extrapolated['seconds'] / median(gp, 'wall_s'):.1f}x faster, "
            f"{typed_extrapolated['peak_rss_mb'] / median(gp, 'peak_rss_mb'):.1f}x less memory"
        )
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "cache.json").write_text(
        json.dumps(
            {"load": load, "runs": runs, "steps": steps, "typed": typed, "typed_extrapolated": typed_extrapolated},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
