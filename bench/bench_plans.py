"""What a plan costs (webhook.admission.decision: every pool of the vendor judged for one request, what
placing a Pod of a new request shape needs first), on this checkout and, with --against DIR, on another
checkout's code, in alternating child processes.

A plan is remembered per request until a node changes, so it is paid for each new request shape: a
change that makes it dearer slows every first Pod of a shape. Each child builds the same 5,000-node
synthetic fleet (a quarter of its GPU nodes partitioned, 20,000 Pods), works out the plan of each request
below 60 times in a row, 25 times, and reports the least per plan in its thread's CPU time
(`time.thread_time`), so that a busy neighbour counts as little as it can; the least of the rounds is
reported per checkout. Writes bench/results/plans.json.

    .venv/bin/python bench/bench_plans.py [--against ../main] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
REQUESTS: dict[str, dict[str, str]] = {
    "class medium": {"gpupool.io/gpu-class": "medium"},
    "min-memory 20Gi": {"gpupool.io/min-memory": "20Gi"},
    "gpu-product H20": {"gpupool.io/gpu-product": "H20"},
    "class high, min-driver 535": {"gpupool.io/gpu-class": "high", "gpupool.io/min-driver": "535"},
    "100 products": {"gpupool.io/gpu-product": ",".join(f"X{i}" for i in range(100))},
}


def child(tree: Path) -> dict[str, float]:
    """The least cost of each request's plan on the code of `tree`, in µs."""
    sys.path.insert(0, str(tree))
    from webhook.admission.decision import _plan
    from webhook.admission.pod import read_pod
    from webhook.admission.request import parse_request
    from webhook.domain.policy import load_policy
    from webhook.sources.snapshot import build_index
    from webhook.testing.synthetic import synthetic_cluster

    policy = load_policy(None)
    index = build_index(synthetic_cluster(nodes=5_000, pods=20_000, seed=1, partitioned=0.25), policy)
    out = {}
    for name, wanted in REQUESTS.items():
        pod: dict[str, Any] = {"metadata": {"name": "job", "annotations": wanted},
                               "spec": {"containers": [{"name": "main"}]}}  # fmt: skip
        req = parse_request(read_pod(pod, "ml").shape, policy)
        _plan(req, index, policy)
        best = float("inf")
        for _ in range(25):
            start = time.thread_time()
            for _ in range(60):
                _plan(req, index, policy)
            best = min(best, (time.thread_time() - start) / 60 * 1e6)
        out[name] = best
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="another checkout whose plans are measured in the same rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the tree whose code a child process runs
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child))))
        return 0
    trees = {"this checkout": HERE, **({args.against: Path(args.against).resolve()} if args.against else {})}
    best: dict[str, dict[str, float]] = {label: {} for label in trees}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            run = subprocess.run(
                [sys.executable, "-B", __file__, "--child", str(tree)], check=True, capture_output=True, text=True
            )  # -B: no bytecode written into the other checkout
            for name, us in json.loads(run.stdout).items():
                best[label][name] = min(best[label].get(name, float("inf")), us)
    print(f"{'request':<30}" + "".join(f"{label:>20}" for label in trees))
    for name in REQUESTS:
        print(f"{name:<30}" + "".join(f"{best[label][name]:>17.1f} us" for label in trees))
    out = HERE / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "plans.json").write_text(json.dumps({"us_per_plan": best}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
