"""What a denial costs with the search for a fix (webhook.admission.hints), side by side with the same
denial without it, on a 5,000-node / 150,000-Pod snapshot with a quarter of the GPU nodes partitioned.

A hostile or broken workload may have the same Pod denied thousands of times a second, so the search is
bounded: at most MAX_TRIES alternative requests, remembered per Pod shape, each decided with one
memoised plan lookup. Each Pod is evaluated as the server evaluates it (one shape memo across calls,
no explain lines), in interleaved rounds with the search on and off (MAX_TRIES = 0), so that noise on
this shared machine hits both alike (the Pods of one shape first, then those of a new shape every time,
whose rounds would evict the others' memo entries); each call is timed in the CPU time of its thread
(`time.thread_time_ns`), so that a busy neighbour does not count. Reports medians, p99s and the ratio per Pod; writes
bench/results/denials.json. The index is frozen out of the garbage collector's way once loaded, as
`gpupool serve` does (webhook.serving.server).

    .venv/bin/python bench/bench_denials.py [--rounds 20] [--per-round 300]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webhook.admission import hints
from webhook.admission.core import evaluate
from webhook.domain.policy import load_policy_text
from webhook.pools.index import PoolIndex
from webhook.pools.memo import Memo
from webhook.sources.snapshot import build_index
from webhook.testing.synthetic import synthetic_cluster

# `capped` may use high but holds no high GPU: every alternative that reaches high is decided and fails.
POLICY = "namespaces: {capped: {allowedClasses: [medium, high], defaultClass: medium, classQuota: {high: 0}}}"


def _pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "job", "annotations": annotations}, "spec": {"containers": [{"name": "main"}]}}


NEW_SHAPES = 5_000  # more than the shape memo and the plan memo hold (4,096 each): every call misses both
# The dearest denial to search a fix for: a new request each time (one product differs), in class
# medium, listing A100 and 7 products no pool has (8, the most that is searched): the A100 pool lacks
# only its class, so `gpu-class: high` and `fallback: true` are decided, each a plan of its own (the
# medium pools lack only their product, but none is related to those asked for). A list of 51 products
# gets no search at all.
NEW: list[dict[str, Any]] = [
    _pod({"gpupool.io/gpu-class": "medium",
          "gpupool.io/gpu-product": ",".join(["A100", *(f"X{i}-{j}" for j in range(7))])})
    for i in range(NEW_SHAPES)
]  # fmt: skip
LONG: list[dict[str, Any]] = [
    _pod({"gpupool.io/gpu-class": "medium",
          "gpupool.io/gpu-product": ",".join(["A100", *(f"X{i}-{j}" for j in range(50))])})
    for i in range(NEW_SHAPES)
]  # fmt: skip
# (what it shows, namespace, the Pods cycled through)
Case = tuple[str, str, list[dict[str, Any]]]
CASES: list[Case] = [
    ("a class fixes it", "ml", [_pod({"gpupool.io/gpu-class": "medium", "gpupool.io/min-memory": "40Gi"})]),
    ("another product (H20)", "ml", [_pod({"gpupool.io/gpu-product": "H20"})]),
    ("every alternative fails", "capped", [_pod({"gpupool.io/min-memory": "40Gi"})]),
    ("nothing to try", "ml", [_pod({"gpupool.io/min-memory": "200Gi"})]),
    ("placed (no denial)", "ml", [_pod({"gpupool.io/gpu-class": "medium"})]),
    ("a new shape every time", "ml", NEW),
    ("the same, 51 products", "ml", LONG),
]
_turn = dict.fromkeys((name for name, _, _ in CASES), 0)  # where each case is in its Pods


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_round(
    cases: list[Case], index: PoolIndex, memo: Memo, per_round: int, out: dict[str, list[float]], *, tries: int
) -> None:
    hints.MAX_TRIES = tries
    for name, namespace, pods in cases:
        samples = out[name]
        for _ in range(per_round):
            pod = pods[_turn[name] % len(pods)]
            _turn[name] += 1
            start = time.thread_time_ns()
            evaluate(pod, namespace, index.policy, index, explain=False, shapes=memo)
            samples.append((time.thread_time_ns() - start) / 1e6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=300)
    args = parser.parse_args()
    policy = load_policy_text(POLICY)
    index = build_index(synthetic_cluster(nodes=5_000, pods=150_000, seed=1, partitioned=0.25), policy)
    gc.collect()
    gc.freeze()  # as the server does once the inventory is loaded: a full collection skips the index
    tries = hints.MAX_TRIES
    memo = Memo()
    for name, namespace, pods in CASES:
        print(f"{name}: {evaluate(pods[0], namespace, policy, index, explain=False, shapes=memo).message[-160:]}")
    on: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    off: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    # The Pods of one shape first, then those of a new shape every time: a round of those evicts the other
    # cases' memo entries, more of them with the search on (each value decided is a plan), so rounds of
    # both kinds interleaved made a round without the search slower for the Pods it never touches.
    for cases in ([c for c in CASES if len(c[2]) == 1], [c for c in CASES if len(c[2]) > 1]):
        for _ in range(3):  # warm up both
            time_round(cases, index, memo, 50, {name: [] for name, _, _ in cases}, tries=tries)
            time_round(cases, index, memo, 50, {name: [] for name, _, _ in cases}, tries=0)
        for _ in range(args.rounds):
            time_round(cases, index, memo, args.per_round, on, tries=tries)
            time_round(cases, index, memo, args.per_round, off, tries=0)
    hints.MAX_TRIES = tries
    rows = {}
    print(f"\n{'Pod':<26}{'with hints':>24}{'without':>24}{'ratio':>16}")
    print(f"{'':<26}{'median / p99 ms':>24}{'median / p99 ms':>24}{'median / p99':>16}")
    for name, _, _ in CASES:
        row = {
            "with_median_ms": statistics.median(on[name]),
            "with_p99_ms": percentile(on[name], 0.99),
            "without_median_ms": statistics.median(off[name]),
            "without_p99_ms": percentile(off[name], 0.99),
            "n": len(on[name]),
        }
        row["median_ratio"] = row["with_median_ms"] / row["without_median_ms"]
        row["p99_ratio"] = row["with_p99_ms"] / row["without_p99_ms"]
        rows[name] = row
        print(
            f"{name:<26}{row['with_median_ms']:>13.3f} / {row['with_p99_ms']:<8.3f}"
            f"{row['without_median_ms']:>13.3f} / {row['without_p99_ms']:<8.3f}"
            f"{row['median_ratio']:>8.2f}x / {row['p99_ratio']:.2f}x"
        )
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "denials.json").write_text(json.dumps({"max_tries": tries, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
