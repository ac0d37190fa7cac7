"""`python -m webhook.testing`: serve a synthetic cluster from the API simulator in its own process.

Benchmarks run the simulator apart from the client they measure, so the client's peak RSS is its
own. The first line on stdout says where it serves (after the kubeconfig is written); SIGTERM or
SIGINT stops it. With `--churn N` the cluster keeps changing at N Pod writes per second from before
that line on; on exit a line `kubesim: churn {...}` gives the churn's counts as JSON. With
`--schedule` the scheduler and kubelet stand-in runs (binding, starting and finishing Pods; see
webhook.testing.kubescheduler), with `--run-seconds`, `--finish-rate` and `--finish-selector`; on exit a
line `kubesim: scheduler {...}` gives its counts. With `--control`, commands on stdin, one a line, change
it while it runs: `finish-rate N` (answered `kubesim: finish-rate N`). `--audit-log FILE` writes every
write from the end of the load on as a JSON line with the time it was stored (webhook.testing.kubeaudit);
on exit a line `kubesim: audit {...}` gives its counts.
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

from webhook.testing.kubeproto import ApiError
from webhook.testing.kubescheduler import Scheduler
from webhook.testing.kubeselect import parse_label_selector
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
    parser.add_argument(
        "--finish-selector",
        default="",
        metavar="SELECTOR",
        help="with --schedule: the finish rate finishes only Pods whose labels match this label selector",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="with --schedule: read commands from stdin, one a line: `finish-rate N`",
    )
    parser.add_argument("--audit-log", type=Path, metavar="FILE", help="write every write as a JSON line here")
    parser.add_argument(
        "--audit-kinds", default="", metavar="KINDS", help="with --audit-log: only these kinds (`pods,nodes`)"
    )
    args = parser.parse_args(argv)
    if (args.run_seconds is not None or args.finish_rate or args.finish_selector or args.control) and not args.schedule:
        parser.error("--run-seconds, --finish-rate, --finish-selector and --control need --schedule")
    try:
        selector = parse_label_selector(args.finish_selector)
    except ApiError as exc:
        parser.error(f"--finish-selector: {exc}")
    kinds = [k.strip() for k in args.audit_kinds.split(",") if k.strip()] or None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sim = KubeSim(port=args.port, bookmark_interval=args.bookmark_interval)
    started = time.monotonic()
    rv = sim.load(iter_synthetic_cluster(nodes=args.nodes, pods=args.pods, seed=args.seed))
    try:
        audit = sim.audit(args.audit_log, kinds) if args.audit_log else None
    except KeyError as exc:
        parser.error(f"--audit-kinds: {exc}")
    sim.start()
    scheduler = (
        sim.scheduler(
            run_seconds=args.run_seconds,
            finish_rate=args.finish_rate,
            finish_filter=selector.matches if selector is not None else None,
            seed=args.seed,
        )
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
    if args.control and scheduler is not None:
        threading.Thread(target=_control, args=(scheduler,), name="kubesim-control", daemon=True).start()
    stop.wait()
    sim.stop()
    if churn is not None:
        print(f"kubesim: churn {json.dumps(churn.stats())}", flush=True)
    if scheduler is not None:
        print(f"kubesim: scheduler {json.dumps(scheduler.stats())}", flush=True)
    if audit is not None:
        print(f"kubesim: audit {json.dumps(audit.stats())}", flush=True)
    return 0


def _control(scheduler: Scheduler) -> None:
    """Commands from stdin (a benchmark's pipe): `finish-rate N` sets the scheduler's finish rate."""
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            if words[0] != "finish-rate" or len(words) != 2:
                raise ValueError
            rate = float(words[1])
            if not rate >= 0:  # also refuses nan
                raise ValueError
        except ValueError:
            print(f"kubesim: unknown command {line.strip()!r}; known: finish-rate N (N >= 0)", flush=True)
            continue
        scheduler.finish_rate = rate
        print(f"kubesim: finish-rate {rate:g}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
