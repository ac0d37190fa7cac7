"""Soak: `gpupool serve` on the live inventory at 5,000 nodes and 150,000 Pods, under load, for a while.

Default mode (issue 12, part 1). The API simulator (`python -m webhook.testing`, its own process)
serves a synthetic cluster and changes its Pods at `--events` writes/s (adds, binds, status updates,
completions, deletions of GPU and CPU Pods; webhook.testing.kubechurn). One `gpupool serve`, as the
manifests ship it (1 worker x 8 threads, log level info), lists and watches it. The load generator
sends AdmissionReviews at a fixed rate (`--rate`, open loop: request i is due at start + i/rate and its
latency is measured from then, so a stall shows up in the latency of every request it delays) over a
few keep-alive TLS connections, as kube-apiserver does (it opens another when all are busy, up to
`--max-connections`). The Pods are GPU Pods of a mix of shapes, 10 %
dry runs, about 6 % that must be denied (a malformed annotation, a product the cluster lacks, a
namespace quota). Every Pod admitted for real is then created in the simulator with the patch applied
(what kube-apiserver does next), so the watch settles its reservation and the churn binds it.

An error is an answer that is not HTTP 200, not a well-formed AdmissionReview for the request's uid, a
different outcome than the shape's (mutated, denied 400, denied 403), or one that comes later than the
webhook's timeout (5 s) after it was due. The server's RSS (master + worker, /proc) is read once it
is ready and at the end. Every 20 s a probe measures how far the server's watch lags the cluster: a
Pod is created for a one-GPU pool and dry runs ask the server until it counts that Pod. The CPU use
of every process (and of the machine's other users) is read from /proc. `--lock-stats` also times,
inside the server, each admission's wait for the inventory lock (bench/lockstats/sitecustomize.py).

`--replicas-burst` (part 2): two `gpupool serve` processes, the two replicas of the manifests, watch
the same simulator. A burst of 100 one-GPU Pods for a pool with exactly 50 free GPUs is split evenly
and interleaved between them, sent as fast as possible, each admitted Pod created in the simulator
at once. Counted: admissions that claimed capacity (no "will wait" warning) beyond the 50. Then the
window in which that can happen is measured directly: an admission on one replica takes the last GPU
of a one-GPU pool, the Pod is created, and dry runs ask the other replica until it counts it.

    .venv/bin/python bench/soak.py [--minutes 10] [--rate 300] [--events 1000] [--connections 4] [--lock-stats]
    .venv/bin/python bench/soak.py --replicas-burst [--bursts 5] [--probes 40]

Results: a table on stdout and JSON in bench/results/soak-<time>.json (or burst-<time>.json).

The parts are in bench/soakbench/ (its docstring lists them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `python bench/soak.py` finds the bench package too

from bench.soakbench.burst import replicas_burst  # noqa: E402
from bench.soakbench.run import soak  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="soak duration (default 10)")
    parser.add_argument("--rate", type=float, default=300.0, help="admissions per second (default 300)")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive TLS connections (default 4)")
    parser.add_argument(
        "--max-connections", type=int, default=32, help="more are opened when all are busy, up to this (default 32)"
    )
    parser.add_argument("--events", type=float, default=1000.0, help="the simulator's Pod writes/s (default 1000)")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-logs", action="store_true", help="copy the server's log to bench/results/")
    parser.add_argument(
        "--lock-stats", action="store_true", help="time the inventory lock inside the server (a diagnostic)"
    )
    parser.add_argument("--replicas-burst", action="store_true", help="two replicas, one burst (part 2)")
    parser.add_argument("--bursts", type=int, default=5, help="bursts in --replicas-burst (default 5)")
    parser.add_argument("--burst-connections", type=int, default=2, help="connections per replica (default 2)")
    parser.add_argument("--probes", type=int, default=40, help="window measurements in --replicas-burst")
    args = parser.parse_args()
    return replicas_burst(args) if args.replicas_burst else soak(args)


if __name__ == "__main__":
    sys.exit(main())
