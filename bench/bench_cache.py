"""The live inventory at Kubernetes' supported scale, side by side with the client's typed models.

1. Cold sync of 5,000 nodes and 150,000 Pods from the API simulator (served by its own process, so
   only the client is measured): gpupool's raw-JSON reflectors vs. listing the same through
   `CoreV1Api` typed models. The typed path is run on the first 20,000 Pods and extrapolated linearly
   to 150,000 (time and memory above the interpreter's baseline scale with the number of objects).
   Each side runs in a fresh process; peak RSS is that process's ru_maxrss.
2. Applying watch events: MODIFIED Pod events (raw JSON lines, as the watch delivers them) decoded,
   projected and applied to the loaded cache: 1-GPU Pods turning Running and Succeeded on 500 of its
   GPU nodes, so every event changes a pool's free GPUs.
3. Admission latency with that cache loaded vs. the demo inventory, interleaved.

    .venv/bin/python bench/bench_cache.py [--nodes 5000] [--pods 150000] [--typed-pods 20000]
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_gpupool(kubeconfig: str, events: int) -> dict[str, Any]:
    import orjson

    from bench.bench_decision import PODS
    from webhook.admission.core import evaluate
    from webhook.domain.policy import load_policy
    from webhook.sources.live import LiveInventory
    from webhook.sources.snapshot import SnapshotInventory

    policy = load_policy(None)
    baseline = rss_mb()
    start = time.perf_counter()
    live = LiveInventory.connect(policy, kubeconfig).start()
    assert live.wait_ready(600), "no sync"
    sync_s = time.perf_counter() - start
    peak = rss_mb()
    with live.read() as index:
        gpu_pods = len(index.pod_keys())
        all_gpu = sorted(n for p in index.pools() for g in p.groups.values() for n in g.nodes)
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
        "sync_s": sync_s,
        "peak_rss_mb": peak,
        "baseline_rss_mb": baseline,
        "gpu_pods_kept": gpu_pods,
        "events": events,
        "events_per_s": events / events_s,
        "decision": {
            k: {"median_ms": statistics.median(v), "p99_ms": sorted(v)[int(0.99 * len(v))]} for k, v in timings.items()
        },
    }


def child_typed(kubeconfig: str, pods: int) -> dict[str, Any]:
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    baseline = rss_mb()
    start = time.perf_counter()
    kept: list[Any] = []
    nodes = api.list_node(limit=500)
    kept.extend(nodes.items)
    while nodes.metadata._continue:
        nodes = api.list_node(limit=500, _continue=nodes.metadata._continue)
        kept.extend(nodes.items)
    n_nodes = len(kept)
    cont = None
    while len(kept) - n_nodes < pods:
        page = (
            api.list_pod_for_all_namespaces(limit=500, _continue=cont)
            if cont
            else api.list_pod_for_all_namespaces(limit=500)
        )
        kept.extend(page.items)
        cont = page.metadata._continue
        if not cont:
            break
    return {
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": rss_mb(),
        "baseline_rss_mb": baseline,
        "nodes": n_nodes,
        "pods": len(kept) - n_nodes,
    }


def run_child(mode: str, kubeconfig: str, extra: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, kubeconfig, str(extra)], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--typed-pods", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, kubeconfig, extra = args.child
        result = child_gpupool(kubeconfig, int(extra)) if mode == "gpupool" else child_typed(kubeconfig, int(extra))
        print(json.dumps(result))
        return 0
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
            gp = run_child("gpupool", kubeconfig, args.events)
            typed = run_child("typed", kubeconfig, args.typed_pods)
        finally:
            sim.terminate()
            sim.wait(30)
    scale = args.pods / max(typed["pods"], 1)
    typed_s = typed["seconds"] * scale
    typed_mb = typed["baseline_rss_mb"] + (typed["peak_rss_mb"] - typed["baseline_rss_mb"]) * scale
    print(f"\ncold sync of {args.nodes:,} nodes and {args.pods:,} Pods")
    print(f"{'client':<34}{'seconds':>10}{'peak RSS MB':>14}")
    print(f"{'gpupool (raw JSON, projected)':<34}{gp['sync_s']:>10.1f}{gp['peak_rss_mb']:>14.0f}")
    print(
        f"{'typed models, ' + format(typed['pods'], ',') + ' Pods measured':<34}{typed['seconds']:>10.1f}"
        f"{typed['peak_rss_mb']:>14.0f}"
    )
    print(f"{'typed models, extrapolated':<34}{typed_s:>10.1f}{typed_mb:>14.0f}")
    print(
        f"ratio: {typed_s / gp['sync_s']:.1f}x faster, {typed_mb / gp['peak_rss_mb']:.1f}x less memory; "
        f"GPU Pods kept: {gp['gpu_pods_kept']:,}; interpreter baseline {gp['baseline_rss_mb']:.0f} MB"
    )
    print(f"\nwatch events applied: {gp['events_per_s']:,.0f} events/s ({gp['events']:,} MODIFIED Pod events)")
    d = gp["decision"]
    print("\nadmission decision with the cache loaded")
    print(f"{'inventory':<24}{'median ms':>10}{'p99 ms':>10}")
    for name, label in (("demo", "demo (examples/)"), ("live", f"live ({args.nodes:,} nodes)")):
        print(f"{label:<24}{d[name]['median_ms']:>10.4f}{d[name]['p99_ms']:>10.4f}")
    print(
        f"ratio live/demo: median {d['live']['median_ms'] / d['demo']['median_ms']:.2f}x, "
        f"p99 {d['live']['p99_ms'] / d['demo']['p99_ms']:.2f}x"
    )
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "cache.json").write_text(
        json.dumps(
            {"gpupool": gp, "typed": typed, "typed_extrapolated": {"seconds": typed_s, "peak_rss_mb": typed_mb}},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
