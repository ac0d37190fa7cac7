"""Benchmark: what the read of the Lease `gpupool-charges` costs a `placement: now` Pod's mutating call.

With the queue on, a `now` Pod is placed counting the charges and the leader's recorded releases
(webhook.admission.charging.for_now): one read of that Lease per admission, an API round trip. In one
process, through the app's WSGI entry on the demo inventory and policy (`placement: now`), as
bench_validate.py calls it, two Admitters answer the same Pod in turn, call by call, so a noisy neighbour
hits both alike:

- queue off: no store, nothing read (what a snapshot inventory or an install without a queue does);
- queue on: the store the workers use (webhook.sources.charge_store on a bounded client), reading the
  Lease from the API simulator (`webhook.testing`, a Python server on this machine: a round trip to a
  real kube-apiserver costs what its network and etcd's cache add, typically 1 to 3 ms in-cluster),
  with the record empty, and again with `--charges N` entries in it (default 40).

Wall time per call (`time.perf_counter`): the median and the p99, with the ratio to the queue off; and
the thread's CPU time per call (`time.thread_time`), what the read takes of the worker itself.

First, `--threads` threads (default 4, a worker's pool) admit at once, record empty, in 3 rounds in turn:
the queue off, on with a read per call, and on with the reads shared as the workers share them
(webhook.admission.charging.SharedReads): admissions a second, each call's p50 and p99, and the reads
made per admission.

    .venv/bin/python bench/bench_now_charges.py [--calls 2000] [--charges 40] [--threads 4]

Results are printed and written to bench/results/now-charges-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from webhook.admission.charging import SharedReads
from webhook.admission.core import Admitter
from webhook.domain.policy import load_policy
from webhook.pools.charges import Charge, ChargeStore
from webhook.serving.app import AppConfig, create_app
from webhook.serving.metrics import Metrics
from webhook.sources.bounded import bounded
from webhook.sources.charge_store import LeaseCharges
from webhook.sources.live import api_client
from webhook.sources.snapshot import SnapshotInventory
from webhook.testing import KubeSim

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/...` finds the bench package
from bench.bench_validate import DEMO_INVENTORY, DEMO_POLICY, RESULTS, caller, review

NAMESPACE = "gpupool-system"
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"generateName": "train-", "namespace": "ml-train",
                    "annotations": {"gpupool.io/gpu-class": "medium"}},
       "spec": {"containers": [{"name": "main", "image": "cuda:12"}]}}  # fmt: skip


def mutate_with(store: ChargeStore | None) -> tuple[Any, Admitter]:
    policy = load_policy(str(DEMO_POLICY))
    admitter = Admitter(policy, SnapshotInventory.from_file(str(DEMO_INVENTORY), policy), store=store)
    app = create_app(AppConfig(admitter=admitter, metrics=Metrics(CollectorRegistry())))
    return caller(app, "/mutate"), admitter


def charges(n: int) -> list[Charge]:
    """`n` charges of Pods that name their node in another namespace, unexpired, as validating calls write them."""
    until = time.time() + 3600
    return [Charge("team-x", f"p-{i}", "gpu-node-1", (("nvidia.com/gpu", 1),), until) for i in range(n)]


class Counted:
    """A store that counts its reads."""

    def __init__(self, store: LeaseCharges) -> None:
        self._store, self.reads = store, 0

    def read(self) -> tuple[list[Charge], str]:
        self.reads += 1
        return self._store.read()

    def write(self, charges: list[Charge], version: str) -> bool:
        return self._store.write(charges, version)


def at_once(call: Any, admitter: Admitter, threads: int, calls: int) -> tuple[float, list[float]]:
    """`calls` admissions from `threads` threads at once, as a worker's thread pool runs them: admissions a
    second, and each call's wall time."""
    body, times = review(POD), []
    per = calls // threads

    def run() -> None:
        for _ in range(per):
            started = time.perf_counter()
            assert call(body)["allowed"]
            times.append(time.perf_counter() - started)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    with admitter.inventory.read() as index:
        index.expire(float("inf"))
    return per * threads / elapsed, times


def concurrent(store: LeaseCharges, threads: int, calls: int, rounds: int = 3) -> dict[str, Any]:
    """With the record empty: the queue off, on with a read per call, on with the reads shared (SharedReads,
    what the workers use), `rounds` rounds in turn."""
    own, shared = Counted(store), Counted(store)
    apps = {"queue off": mutate_with(None), "queue on, a read each": mutate_with(own),
            "queue on, reads shared": mutate_with(SharedReads(shared))}  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in apps}
    times: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(rounds):
        for name, (call, admitter) in apps.items():
            rate, took = at_once(call, admitter, threads, calls)
            rates[name].append(rate)
            times[name].extend(took)
    base = statistics.median(rates["queue off"])
    rows = {}
    for name in apps:
        reads = {"queue off": 0, "queue on, a read each": own.reads, "queue on, reads shared": shared.reads}[name]
        ordered, rate = sorted(times[name]), statistics.median(rates[name])
        rows[name] = {"per_s": round(rate), "vs_off": round(rate / base, 2),
                      "p50_us": round(statistics.median(ordered) * 1e6, 1),
                      "p99_us": round(ordered[int(len(ordered) * 0.99)] * 1e6, 1),
                      "reads_per_admission": round(reads / len(ordered), 3)}  # fmt: skip
        row = rows[name]
        print(f"{threads} threads, {name:24} {row['per_s']:6,} admissions/s ({row['vs_off']:4.2f}x the queue off)  "
              f"p50 {row['p50_us']:7.1f} us  p99 {row['p99_us']:8.1f} us  "
              f"{row['reads_per_admission']:.3f} reads each")  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="Pods per case (default 2000)")
    parser.add_argument("--charges", type=int, default=40, help="entries in the non-empty record (default 40)")
    parser.add_argument("--threads", type=int, default=4, help="threads admitting at once (default 4, a worker's)")
    args = parser.parse_args()
    with KubeSim() as sim, tempfile.TemporaryDirectory() as tmp:
        store = LeaseCharges(bounded(api_client(str(sim.write_kubeconfig(Path(tmp) / "kubeconfig")))), NAMESPACE)
        off, off_admitter = mutate_with(None)
        on, on_admitter = mutate_with(store)
        together = concurrent(store, args.threads, args.calls)
        body = review(POD)
        cases: dict[str, tuple[list[float], list[float]]] = {}
        baseline: dict[str, str] = {}  # each case's queue-off run, interleaved with it
        for record, filled in (("empty", 0), (f"{args.charges} entries", args.charges)):
            if filled:
                assert store.write(charges(filled), store.read()[1])
            assert len(store.read()[0]) == filled
            pair = ((f"queue off (beside: {record})", off), (f"queue on, record {record}", on))
            for name, _ in pair:
                cases[name] = ([], [])
                baseline[name] = pair[0][0]
            for _ in range(args.calls):
                for name, call in pair:
                    started, cpu = time.perf_counter(), time.thread_time()
                    answer = call(body)
                    cases[name][1].append(time.thread_time() - cpu)
                    cases[name][0].append(time.perf_counter() - started)
                    assert answer["allowed"], answer
            for admitter in (off_admitter, on_admitter):  # the namespace's reservations, bounded: start over
                with admitter.inventory.read() as index:
                    index.expire(float("inf"))
    rows = {}
    for name, (wall, cpu) in cases.items():
        base = statistics.median(cases[baseline[name]][0])
        ordered = sorted(wall)
        p50, p99 = statistics.median(ordered), ordered[int(len(ordered) * 0.99)]
        cpu_p50 = statistics.median(cpu)
        rows[name] = {"p50_us": round(p50 * 1e6, 1), "p99_us": round(p99 * 1e6, 1),
                      "cpu_p50_us": round(cpu_p50 * 1e6, 1), "p50_vs_off": round(p50 / base, 2)}  # fmt: skip
        print(f"{name:32} p50 {p50 * 1e6:7.1f} us  p99 {p99 * 1e6:8.1f} us  "
              f"CPU p50 {cpu_p50 * 1e6:6.1f} us  {p50 / base:5.2f}x the queue off")  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"now-charges-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps({"calls": args.calls, "charges": args.charges, "results": rows, "at_once": together}, indent=2)
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
