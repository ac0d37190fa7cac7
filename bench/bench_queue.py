"""The queue at Kubernetes' supported scale: two `gpupool serve` replicas, one leader releasing as room appears.

The API simulator (`python -m webhook.testing`, its own process) serves 5,000 nodes and 150,000 Pods with
its scheduler and kubelet stand-in (`--schedule`: it binds what is released and finishes Pods), and keeps
an audit log of every write with the time it was stored (`--audit-log`). Two `gpupool serve` replicas as
the manifests ship them (1 worker x 8 threads, `POD_NAME` replica-a / replica-b) watch it and elect a
leader on the Lease `gpupool-system/gpupool`. Queued Pods are created as kube-apiserver creates them: the
AdmissionReview goes to one replica or the other, alternating, its patch is applied, and the Pod is POSTed
to the simulator. They go to queue namespaces with quotas of every form gpupool enforces (a tutorial
`nvidia.com/gpu` ResourceQuota, a `limits.nvidia.com/gpu` one, a `classQuota`, a `memoryQuota`) and
without, in classes medium and high, one GPU each.

1. Setup: every free GPU of every usable node is taken by a one-GPU "filler" Pod bound there (the fleet
   is saturated), then `--queued` Pods are queued (they wait: there is no room).
2. Steady (`--seconds`): the simulator finishes `--finish-rate` Pods a second (fillers and released queue
   Pods, at random); the benchmark keeps the queue at `--queued` Pods. Release latency: from the write
   that made room to the write that removed the gate (bench/queueaudit/ says exactly how room is
   attributed). Pods of the quota namespaces run 2 to 8 s, so their quotas fill and free all the time.
3. Failover: SIGKILL of the leading replica's leader process (the Lease's holderIdentity is its
   `POD_NAME`; its pid is in that replica's /readyz), as the steady phase goes on; time from the kill to
   the first release of a new term (the other replica, or the killed one's restarted leader process).
4. Burst (releases/s): finishing stops, `--queued` medium Pods wait (in the namespaces without quotas),
   then nodes with room for every waiting Pod join at once (L4 nodes of 8 GPUs, created as fast as the
   API takes them); releases per second of those medium Pods, from the first node stored to the last of
   their releases.
5. Memory: `--memory-queued` more Pods queued with no room; RSS of the leading worker and of the other
   replica's (a follower, which keeps the same watch and the same queue but does not release) before and
   after, their CPU while nothing changes, and the admission latency of each (dry runs in a `placement:
   now` namespace, interleaved: the follower is the baseline).

With `--backlog N` (the issue's scale point: `--backlog 100000`), N more Pods are queued before the steady
phase in a namespace whose classQuota of one high GPU is held by a Pod that never finishes: they wait the
whole run, beside the Pods that go, as a team's queue far past its quota does. They are not admitted one by
one (100,000 admissions take about 12 minutes, and the memory phase's queue-in already measures admissions):
each distinct shape (priority 0 or 100) is admitted for real through each replica, the two patches must be
the same, and that patch applied with jsonpatch makes every backlog Pod of the shape, POSTed straight to the
simulator, so the replicas watch exactly what kube-apiserver would have stored (bench/queuebench/backlog.py).

GPUs overbooked and quotas exceeded are judged after every write of the run from the audit log alone
(bench/queueaudit/), never from gpupool's view. The machine's load (others' CPU) is reported per phase.

    .venv/bin/python bench/bench_queue.py [--nodes 5000] [--pods 150000] [--queued 1000] [--seconds 60]
        [--finish-rate 100] [--backlog 0] [--memory-queued 10000] [--seed 0] [--profile] [--quick]

`--quick` is a short run (1,000 nodes, 300 queued, 20 s) to iterate with; the figures come from a full one.

`--profile` samples the leader process with `py-spy record --nonblocking` (it reads the process's memory and
never stops it, so it cannot trip the master's hung bound; `pip install py-spy`). The Lease it follows is the
queue's alone (bench/queueaudit: the leader's charges Lease has no holder), and each phase that needs the
leader waits up to 60 s for one (a leader process being restarted, a Lease just handed back).

Results: a table on stdout and JSON in bench/results/queue-<time>.json.

The parts are in bench/queuebench/ (its docstring lists them), the judge in bench/queueaudit/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `python bench/bench_queue.py` finds the bench package too

from bench.queuebench.report import print_report  # noqa: E402
from bench.queuebench.run import run  # noqa: E402
from bench.serverbench.launch import RESULTS  # noqa: E402

# --quick: a fifth of the cluster, still at 100 finishes/s, so a leader that falls behind shows it.
QUICK = ["--nodes", "1000", "--pods", "30000", "--queued", "300", "--seconds", "20", "--memory-queued", "1000"]
QUICK += ["--probe-seconds", "5"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--queued", type=int, default=1000, help="Pods kept queued while room appears")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the steady phase")
    parser.add_argument("--finish-rate", type=float, default=100.0, help="Pods finishing per second")
    parser.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="Pods queued before the steady phase past a quota that never frees, waiting all run "
        "(the issue's scale point: --backlog 100000)",
    )
    parser.add_argument("--memory-queued", type=int, default=10_000, help="Pods queued for the memory phase (0: none)")
    parser.add_argument(
        "--probe-seconds", type=float, default=15.0, help="memory phase: how long admissions are timed, idle"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the leader in the steady, burst and memory phases (pip install py-spy)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run to iterate with: {' '.join(QUICK)} (flags given after it still win)",
    )
    args = parser.parse_args()
    if args.quick:
        args = parser.parse_args([*QUICK, *sys.argv[1:]])
    result = run(args)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"queue-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2, default=str))  # before the table: a long run's figures kept
    print_report(result)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
