"""Benchmark: a worker's memory under a stream of distinct large Pods (server-side dry runs).

Any tenant can send `kubectl create --dry-run=server` as often as it likes, each Pod a little different:
what gpupool remembers of each (its shape, request, patch and decision plan) must not follow. Each
process here builds the Admitter a worker builds (the demo policy and inventory), then admits, as dry
runs, Pods decoded from JSON as the server decodes them:

- `large`: valid 460 KB Pods, 1,024 long tolerations each (a 264-character key, a 63-character value),
  every Pod distinct in one toleration's value;
- `small`: ordinary Pods, every one a new shape (gpupool.io/min-memory varies), as the server benchmark's
  "every Pod a new shape".

It reports the worker's RSS (VmRSS from /proc/self/status, and the peak) after a warm-up and at every
tenth of the run, and the growth from warm-up to the end. Each kind runs in a process of its own.

    .venv/bin/python bench/bench_memo.py [--pods 10000] [--kinds large,small]

Results are printed and written to bench/results/memo-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RESULTS = REPO / "bench" / "results"
WARM_UP = 200
TOLERATIONS = 1024


def rss_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def template(kind: str) -> dict[str, Any]:
    """The Pod the run varies: a medium-class GPU Pod of the demo, with 1,024 long tolerations if large."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/train:1.0"}]}
    if kind == "large":
        prefix = "tolerations." + "x" * 187 + ".example.com"  # a 253-character DNS prefix, as Kubernetes allows
        spec["tolerations"] = [
            {"key": f"{prefix}/{'k' * 58}{i:05d}", "operator": "Equal", "value": "v" * 63, "effect": "NoSchedule"}
            for i in range(TOLERATIONS)
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml", "annotations": {"gpupool.io/gpu-class": "medium"}},
        "spec": spec,
    }


def body(base: dict[str, Any], kind: str, i: int) -> bytes:
    """The JSON of Pod number `i`: distinct from every other in one toleration's value (large) or in its
    min-memory (small)."""
    if kind == "large":
        base["spec"]["tolerations"][0]["value"] = f"{i:063d}"
    else:
        base["metadata"]["annotations"]["gpupool.io/min-memory"] = f"{1000 + i}Mi"
    return orjson.dumps(base)


def run(kind: str, pods: int, out: Any) -> None:
    import webhook
    from webhook.admission.core import Admitter
    from webhook.domain.policy import load_policy
    from webhook.sources.snapshot import SnapshotInventory

    policy = load_policy(str(REPO / "examples" / "policy.yaml"))
    admitter = Admitter(policy, SnapshotInventory.from_file(str(REPO / "examples" / "cluster.yaml"), policy))
    base = template(kind)
    size = len(body(base, kind, 0))
    started = time.perf_counter()
    samples: list[tuple[int, int]] = []
    rss_warm = 0
    for i in range(WARM_UP + pods):
        verdict = admitter.admit(orjson.loads(body(base, kind, i)), namespace="ml", dry_run=True)
        assert verdict.allowed, verdict.message
        if i + 1 == WARM_UP:
            rss_warm = rss_kib()[0]
        elif i >= WARM_UP and (i + 1 - WARM_UP) % max(pods // 10, 1) == 0:
            samples.append((i + 1 - WARM_UP, rss_kib()[0]))
    seconds = time.perf_counter() - started
    rss_end, peak = rss_kib()
    out.put(
        {
            "kind": kind,
            "pods": pods,
            "pod_json_bytes": size,
            "rss_after_warm_up_mib": round(rss_warm / 1024, 1),
            "rss_end_mib": round(rss_end / 1024, 1),
            "rss_peak_mib": round(peak / 1024, 1),
            "growth_mib": round((rss_end - rss_warm) / 1024, 1),
            "samples_mib": [(n, round(kib / 1024, 1)) for n, kib in samples],
            "ms_per_pod": round(seconds * 1000 / (WARM_UP + pods), 2),
            "code": str(Path(webhook.__file__).parent.parent),  # which tree was measured
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10000, help="distinct Pods after the warm-up")
    parser.add_argument("--kinds", default="large,small")
    args = parser.parse_args()
    results = []
    context = multiprocessing.get_context("spawn")  # a fresh interpreter each: RSS is the run's alone
    for kind in args.kinds.split(","):
        queue = context.Queue()
        process = context.Process(target=run, args=(kind, args.pods, queue))
        process.start()
        result = queue.get()
        process.join()
        results.append(result)
        print(
            f"{kind:6s} {result['pods']:6d} Pods of {result['pod_json_bytes']:7d} B: RSS"
            f" {result['rss_after_warm_up_mib']} MiB after the warm-up, {result['rss_end_mib']} MiB at the end"
            f" (peak {result['rss_peak_mib']}), growth {result['growth_mib']} MiB; {result['ms_per_pod']} ms per Pod"
            f" ({result['code']})"
        )
        print("       RSS by Pods:", " ".join(f"{n}:{mib}" for n, mib in result["samples_mib"]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"memo-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"python": platform.python_version(), "machine": platform.machine()}
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
