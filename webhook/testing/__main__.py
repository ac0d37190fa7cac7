"""`python -m webhook.testing`: serve a synthetic cluster from the API simulator in its own process.

Benchmarks run the simulator apart from the client they measure, so the client's peak RSS is its
own. The first line on stdout says where it serves (after the kubeconfig is written); SIGTERM or
SIGINT stops it. With `--churn N` the cluster keeps changing at N Pod writes per second from before
that line on; on exit a line `kubesim: churn {...}` gives the churn's counts as JSON. With
`--schedule` the scheduler and kubelet stand-in runs (binding, starting and finishing Pods; see
webhook.testing.kubescheduler), with `--run-seconds` and `--finish-rate`; on exit a line
`kubesim: scheduler {...}` gives its counts.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from webhook.testing.kubesim import KubeSim
from webhook.testing.synthetic import iter_synthetic_cluster


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a synthetic cluster until SIGTERM or SIGINT (for benchmarks in a separate process)."""
    parser = argparse.ArgumentParser(prog="python -m webhook.testing", description=main.__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the simulator here")
    parser.add_argument("--bookmark-interval", type=float, default=60.0)
    parser.add_argument("--churn", type=float, default=0.0, metavar="WRITES_PER_S", help="change Pods at this rate")
    parser.add_argument("--churn-gpu-share", type=float, default=0.25, help="share of the churn on GPU Pods")
    parser.add_argument(
        "--schedule", action="store_true", help="bind, start and finish Pods as kube-scheduler and kubelets"
    )
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=None,
        metavar="S",
        help="with --schedule: Pods finish S seconds after they start",
    )
    parser.add_argument(
        "--finish-rate",
        type=float,
        default=0.0,
        metavar="PODS_PER_S",
        help="with --schedule: finish running Pods at this rate",
    )
    args = parser.parse_args(argv)
    if (args.run_seconds is not None or args.finish_rate) and not args.schedule:
        parser.error("--run-seconds and --finish-rate need --schedule")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sim = KubeSim(port=args.port, bookmark_interval=args.bookmark_interval)
    started = time.monotonic()
    rv = sim.load(iter_synthetic_cluster(nodes=args.nodes, pods=args.pods, seed=args.seed))
    sim.start()
    scheduler = (
        sim.scheduler(run_seconds=args.run_seconds, finish_rate=args.finish_rate, seed=args.seed)
        if args.schedule
        else None
    )
    churn = sim.churn(args.churn, seed=args.seed, gpu_share=args.churn_gpu_share) if args.churn > 0 else None
    if args.kubeconfig:
        sim.write_kubeconfig(args.kubeconfig)
    print(
        f"kubesim: {args.nodes} nodes, {args.pods} pods at resourceVersion {rv}, "
        f"loaded in {time.monotonic() - started:.1f} s, "
        + (f"churning {args.churn:g} writes/s, " if churn else "")
        + ("scheduling, " if scheduler else "")
        + f"serving {sim.url}",
        flush=True,
    )
    stop.wait()
    sim.stop()
    if churn is not None:
        print(f"kubesim: churn {json.dumps(churn.stats())}", flush=True)
    if scheduler is not None:
        print(f"kubesim: scheduler {json.dumps(scheduler.stats())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
