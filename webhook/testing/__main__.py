"""`python -m webhook.testing`: serve a synthetic cluster from the API simulator in its own process.

Benchmarks run the simulator apart from the client they measure, so the client's peak RSS is its
own. The first line on stdout says where it serves (after the kubeconfig is written); SIGTERM or
SIGINT stops it.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sim = KubeSim(port=args.port, bookmark_interval=args.bookmark_interval)
    started = time.monotonic()
    rv = sim.load(iter_synthetic_cluster(nodes=args.nodes, pods=args.pods, seed=args.seed))
    sim.start()
    if args.kubeconfig:
        sim.write_kubeconfig(args.kubeconfig)
    print(
        f"kubesim: {args.nodes} nodes, {args.pods} pods at resourceVersion {rv}, "
        f"loaded in {time.monotonic() - started:.1f} s, serving {sim.url}",
        flush=True,
    )
    stop.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
