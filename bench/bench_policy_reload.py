"""What a policy change costs a server on a live inventory at Kubernetes' supported scale.

The API simulator serves 5,000 nodes and 150,000 Pods from its own process; this process holds the
live inventory and an Admitter, as a worker does, and follows a policy file with the server's
PolicyReloader. Admissions (dry runs of bench_decision's Pods, so that no reservation holds the switch
back) run back to back throughout, and their latency is reported per phase, side by side:

1. before any change (the baseline);
2. a change of namespace rules only: switched at the reloader's next look, on the same inventory;
3. a change of the product table: a second inventory lists and watches the cluster while the first
   answers, then takes over. Reported: the time from the file's change to the switch, and this
   process's peak RSS before and after.

    .venv/bin/python bench/bench_policy_reload.py [--nodes 5000] [--pods 150000]
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

from bench.bench_decision import PODS  # noqa: E402
from webhook.admission.core import Admitter  # noqa: E402
from webhook.serving.policyfile import PolicyFile, PolicyReloader, read_policy_file  # noqa: E402
from webhook.sources.live import LiveInventory  # noqa: E402

NAMESPACES = "namespaces: {team-a: {allowedClasses: [medium, high]}}\n"
NEW_RULES = "namespaces: {team-a: {allowedClasses: [low, medium, high]}}\n"
# The T4s move to class low: the nodes are pooled anew, so the inventory is read again.
NEW_POOLS = (
    NEW_RULES + "products: [{match: T4, class: low, memory: 16Gi}, {match: L4, class: medium},"
    " {match: A100, class: high, memory: 40Gi}, {match: H100, class: high, memory: 80Gi}]\n"
)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "admissions": len(ordered),
        "median_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    }


def admit_until(admitter: Admitter, done: Any, seconds: float = 1.0) -> list[float]:
    """Admission latencies, back to back, until `done()`, for `seconds` at least (so that each phase's
    p99 rests on enough samples)."""
    samples: list[float] = []
    i = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not done():
        pod = PODS[i % len(PODS)]
        start = time.perf_counter()
        admitter.admit(pod, namespace=pod["metadata"].get("namespace", "team-a"), dry_run=True)
        samples.append(time.perf_counter() - start)
        i += 1
    return samples


def rewrite(path: Path, text: str) -> None:
    """A new version of the file, as the kubelet's swap makes one: a new inode."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def run(kubeconfig: str, directory: Path) -> dict[str, Any]:
    path = directory / "policy.yaml"
    path.write_text(NAMESPACES)
    loaded = read_policy_file(str(path))
    start = time.perf_counter()
    live = LiveInventory.connect(loaded.policy, kubeconfig).start()
    assert live.wait_ready(600), "no sync"
    result: dict[str, Any] = {"cold_sync_s": time.perf_counter() - start, "rss_after_sync_mb": rss_mb()}
    admitter = Admitter(loaded.policy, live)
    reloader = PolicyReloader(PolicyFile(loaded), admitter, interval=0.25).start()
    try:
        result["baseline"] = percentiles(admit_until(admitter, lambda: True, seconds=10))

        policy = admitter.policy
        changed = time.perf_counter()
        rewrite(path, NEW_RULES)
        result["new_rules"] = percentiles(admit_until(admitter, lambda: admitter.policy is not policy))
        result["new_rules"]["switch_s"] = time.perf_counter() - changed
        assert admitter.inventory is live

        changed = time.perf_counter()
        rewrite(path, NEW_POOLS)
        result["new_pools"] = percentiles(admit_until(admitter, lambda: admitter.inventory is not live))
        result["new_pools"]["switch_s"] = time.perf_counter() - changed
        result["rss_after_switch_mb"] = rss_mb()
        result["after"] = percentiles(admit_until(admitter, lambda: True, seconds=10))
    finally:
        reloader.stop()
        admitter.inventory.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        sim = subprocess.Popen(
            [sys.executable, "-m", "webhook.testing", "--nodes", str(args.nodes), "--pods", str(args.pods),
             "--kubeconfig", kubeconfig],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert sim.stdout is not None
            print(sim.stdout.readline().strip())
            result = run(kubeconfig, Path(tmp))
        finally:
            sim.terminate()
            sim.wait(30)
    print(f"\n{args.nodes:,} nodes, {args.pods:,} Pods: cold sync {result['cold_sync_s']:.1f} s, "
          f"peak RSS {result['rss_after_sync_mb']:.0f} MB")  # fmt: skip
    print(f"{'phase':<44}{'admissions':>11}{'median ms':>11}{'p99 ms':>9}{'switch s':>10}")
    labels = {
        "baseline": "before any change",
        "new_rules": "new namespace rules (same inventory)",
        "new_pools": "new product table (inventory read again)",
        "after": "after the switch",
    }
    for key, label in labels.items():
        r = result[key]
        switch = f"{r['switch_s']:>10.2f}" if "switch_s" in r else f"{'':>10}"
        print(f"{label:<44}{r['admissions']:>11,}{r['median_ms']:>11.4f}{r['p99_ms']:>9.3f}{switch}")
    base = result["baseline"]
    print(
        f"during the re-read, median {result['new_pools']['median_ms'] / base['median_ms']:.2f}x and "
        f"p99 {result['new_pools']['p99_ms'] / base['p99_ms']:.2f}x the baseline; peak RSS "
        f"{result['rss_after_sync_mb']:.0f} MB -> {result['rss_after_switch_mb']:.0f} MB"
    )
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "policy_reload.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
