"""Backfill in the queue, simulated: one pool where big Pods cannot fit while services hold a GPU on every
node, backfill off and on, side by side on the same arrivals.

A discrete-event simulation in simulated time over gpupool's real queue: every Pod is queued by
admission (webhook.admission.core.evaluate, its patch applied), followed by webhook.queue.waiting on a
simulated clock, and released by the leader's own pass (webhook.queue.release.plan) over the real pool
index, after every arrival and finish and every `--tick` seconds. What it stands in for: kube-scheduler
(a released Pod binds at once to a random node of its pool with room: for `nvidia.com/gpu` the default
scheduler scores CPU and memory, not GPUs) and kubelet (a Pod runs its time, then is gone).

The fleet: `--nodes` Tesla-T4 nodes of 4 GPUs, each running a 1-GPU service to start with. Services end
after an exponential time (mean `--service-seconds`) and a new one starts 60 s later on a random node
with room, past the queue (a `placement: now` Pod: no leader holds it off). Demand, Poisson: 1-GPU Pods
of two namespaces (mean run `--small-seconds`, at a rate that asks for `--load` of the GPUs the services
leave), and one 4-GPU Pod every `--big-every` seconds on average (run `--big-seconds`), for `--hours`.

The modes, on the same arrivals (per seed):
- **off**: no backfill, the rule before it: a Pod that waits for room holds its pool at once (emulated as
  `queueHoldAfterSeconds: 0.001`; with one pool that is the old rule exactly);
- **on**: backfill, with the shipped bound (`queueHoldAfterSeconds: 300`);
- **unbounded**: backfill with no bound (`1e9`): what the bound is for.

Reported per mode (median over seeds): GPU utilisation (GPU-seconds in use / GPU-seconds there), the
GPU-seconds left idle while a 1-GPU Pod waited (of GPU-seconds there: what backfill is for), the big
Pods' mean and max wait (a Pod still waiting at the end counts what it has waited), how many of each
still wait at the end (small Pods starved show there, not in the waits of those released), the small
Pods' mean and p95 wait, and the wall time of a pass. Writes bench/results/backfill.json.

    .venv/bin/python bench/bench_backfill.py [--seeds 3] [--hours 4] [--nodes 8] [--load 0.8]
"""

from __future__ import annotations

import argparse
import copy
import heapq
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonpatch

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from tests.builders import gpu_node, index_of, pod, policy  # noqa: E402
from tests.queue.helpers import GPU_TOLERATION, queued_pod  # noqa: E402
from webhook.domain.model import PodKey  # noqa: E402
from webhook.pools.index import PoolIndex  # noqa: E402
from webhook.pools.kubeobj import pod_from_obj  # noqa: E402
from webhook.queue.release import plan  # noqa: E402
from webhook.queue.waiting import Waiting  # noqa: E402
from webhook.testing.kubefit import NodeFit, PodNeed, matches_node_affinity  # noqa: E402

GPUS = 4  # per node
BIG = 4  # GPUs of a big Pod
SERVICE_GAP = 60.0  # from a service's end to its successor's start
MODES = {"off": 0.001, "on": 300.0, "unbounded": 1e9}  # queueHoldAfterSeconds
EPOCH = datetime(2026, 12, 1, tzinfo=UTC)
RULES = "namespaces:\n  big: {placement: queue}\n  team-a: {placement: queue}\n  team-b: {placement: queue}\n"


@dataclass(frozen=True)
class Arrival:
    at: float
    name: str
    namespace: str
    gpus: int
    runs: float


def arrivals(seed: int, args: argparse.Namespace) -> tuple[list[Arrival], list[float]]:
    """The queued Pods in arrival order, and the services' run times (drawn in turn as each one starts)."""
    rng = random.Random(seed)
    horizon = args.hours * 3600
    small_rate = args.load * args.nodes * (GPUS - 1) / args.small_seconds
    found: list[Arrival] = []
    for kind, rate in (("small", small_rate), ("big", 1 / args.big_every)):
        at, i = 0.0, 0
        while True:
            at += rng.expovariate(rate)
            if at >= horizon:
                break
            if kind == "big":
                found.append(Arrival(at, f"big-{i}", "big", BIG, args.big_seconds))
            else:
                team = ("team-a", "team-b")[i % 2]
                found.append(Arrival(at, f"s-{i}", team, 1, rng.expovariate(1 / args.small_seconds)))
            i += 1
    services = [rng.expovariate(1 / args.service_seconds) for _ in range(100_000)]
    return sorted(found, key=lambda a: a.at), services


class Fleet:
    """The pool index, the queue on the simulated clock, and what runs where (the scheduler's view)."""

    def __init__(self, nodes: int, hold_after: float, seed: int) -> None:
        self.pol = policy(RULES + f"defaults: {{queueHoldAfterSeconds: {hold_after}}}\n")
        self.names = [f"t4-{i}" for i in range(nodes)]
        self.nodes = {n: NodeFit.of(gpu_node(n, "Tesla-T4", GPUS)) for n in self.names}  # what affinity reads
        self.index: PoolIndex = index_of([gpu_node(n, "Tesla-T4", GPUS) for n in self.names], self.pol)
        self.now = 0.0
        self.waiting = Waiting(self.pol, clock=lambda: self.now)
        self.free = dict.fromkeys(self.names, GPUS)
        self.on_node: dict[PodKey, tuple[str, int]] = {}
        self.objects: dict[PodKey, dict[str, Any]] = {}
        self.rng = random.Random(seed)
        self.small_waiting = 0  # small Pods queued, not released yet

    def used(self) -> int:
        return sum(GPUS - f for f in self.free.values())

    def bind(self, key: PodKey, obj: dict[str, Any], node: str, gpus: int) -> None:
        obj["spec"]["nodeName"] = node
        obj["status"] = {"phase": "Running"}
        self.index.upsert_pod(pod_from_obj(obj, self.pol.gpu_resources, self.pol.partition_prefixes), key)
        self.waiting.apply("pods", "MODIFIED", obj)
        self.free[node] -= gpus
        self.on_node[key] = (node, gpus)

    def start_service(self, name: str) -> bool:
        room = [n for n in self.names if self.free[n] >= 1]
        if not room:
            return False
        obj = pod(name, "svc", gpus=1, phase="Running", tolerations=[GPU_TOLERATION])
        self.bind(("svc", name), obj, self.rng.choice(room), 1)
        return True

    def queue(self, a: Arrival) -> None:
        created = (EPOCH + timedelta(seconds=a.at)).strftime("%Y-%m-%dT%H:%M:%SZ")
        annotations = {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(a.gpus)}
        obj = queued_pod(a.name, a.namespace, self.pol, self.index, annotations=annotations, created=created)
        self.objects[(a.namespace, a.name)] = obj
        self.index.upsert_pod(pod_from_obj(obj, self.pol.gpu_resources, self.pol.partition_prefixes))
        self.waiting.apply("pods", "ADDED", obj)
        self.small_waiting += a.gpus != BIG

    def finish(self, key: PodKey) -> None:
        node, gpus = self.on_node.pop(key)
        self.free[node] += gpus
        self.index.remove_pod(key)

    def release(self) -> list[PodKey]:
        """One pass; each release bound at once to a random node of the pool with room that its node
        affinity allows (a node held for a big Pod is left out by every release but the big Pod's)."""
        decided = plan(self.waiting.ordered(), self.index, self.pol, now=self.now)
        bound = []
        for r in decided.releases:
            key, gpus = r.queued.key, sum(r.released.gpu_requests.values())
            obj = jsonpatch.apply_patch(copy.deepcopy(self.objects.pop(key)), r.patch)
            need = PodNeed.of(obj)
            room = [n for n in self.names if self.free[n] >= gpus and matches_node_affinity(need, self.nodes[n])]
            assert room, f"{key} released with no node that has {gpus} free"
            self.bind(key, obj, self.rng.choice(room), gpus)
            self.small_waiting -= gpus != BIG
            bound.append(key)
        return bound


def simulate(
    demand: list[Arrival], services: list[float], args: argparse.Namespace, hold_after: float
) -> dict[str, Any]:
    fleet = Fleet(args.nodes, hold_after, seed=len(demand))
    horizon = args.hours * 3600
    events: list[tuple[float, int, str, Any]] = []  # (time, seq, kind, what)
    seq = 0

    def push(at: float, kind: str, what: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, what))

    runs = iter(services)
    for i, node in enumerate(fleet.names):  # one service per node to start with
        key = ("svc", f"svc-{i}")
        fleet.bind(key, pod(key[1], "svc", gpus=1, phase="Running", tolerations=[GPU_TOLERATION]), node, 1)
        push(next(runs), "finish", key)
    by_key = {(a.namespace, a.name): a for a in demand}
    for a in demand:
        push(a.at, "arrive", a)
    t = 0.0
    while t < horizon:
        t += args.tick
        push(t, "tick", None)
    waits: dict[str, list[float]] = {"big": [], "small": []}
    gpu_seconds, idle_seconds, last, services_started, pass_seconds = 0.0, 0.0, 0.0, len(fleet.names), []
    while events and events[0][0] < horizon:
        at, _, kind, what = heapq.heappop(events)
        gpu_seconds += fleet.used() * (at - last)
        if fleet.small_waiting:  # GPUs idle while a 1-GPU Pod waits: what backfill is for
            idle_seconds += (args.nodes * GPUS - fleet.used()) * (at - last)
        last = fleet.now = at
        if kind == "arrive":
            fleet.queue(what)
        elif kind == "finish":
            fleet.finish(what)
            if what[0] == "svc":
                push(at + SERVICE_GAP, "service", f"svc-{services_started}")
                services_started += 1
        elif kind == "service":
            if fleet.start_service(what):
                push(at + next(runs), "finish", ("svc", what))
            else:
                push(at + args.tick, "service", what)
        started = time.perf_counter()
        for key in fleet.release():
            a = by_key[key]
            waits["big" if a.gpus == BIG else "small"].append(at - a.at)
            push(at + a.runs, "finish", key)
        pass_seconds.append(time.perf_counter() - started)
    gpu_seconds += fleet.used() * (horizon - last)
    still_big = [horizon - by_key[q.key].at for q in fleet.waiting.ordered() if by_key[q.key].gpus == BIG]
    big = waits["big"] + still_big  # a big Pod still waiting has waited at least this long
    small = sorted(waits["small"])
    return {
        "utilisation": round(gpu_seconds / (args.nodes * GPUS * horizon), 3),
        "idle_while_small_wait": round(idle_seconds / (args.nodes * GPUS * horizon), 3),
        "big_released": len(waits["big"]),
        "big_waiting_at_end": len(still_big),
        "big_mean_wait_s": round(statistics.fmean(big), 1) if big else 0.0,
        "big_max_wait_s": round(max(big), 1) if big else 0.0,
        "small_released": len(small),
        "small_waiting_at_end": fleet.small_waiting,
        "small_mean_wait_s": round(statistics.fmean(small), 1) if small else 0.0,
        "small_p95_wait_s": round(small[int(0.95 * (len(small) - 1))], 1) if small else 0.0,
        "pass_ms_p50": round(1000 * statistics.median(pass_seconds), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--load", type=float, default=0.8, help="small Pods' demand, of the GPUs services leave")
    parser.add_argument("--small-seconds", type=float, default=120.0)
    parser.add_argument("--big-every", type=float, default=900.0)
    parser.add_argument("--big-seconds", type=float, default=600.0)
    parser.add_argument("--service-seconds", type=float, default=1800.0)
    parser.add_argument("--tick", type=float, default=5.0, help="a pass at least this often (simulated seconds)")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for seed in range(1, args.seeds + 1):
        demand, services = arrivals(seed, args)
        for mode, hold_after in MODES.items():
            result = simulate(demand, services, args, hold_after)
            runs[mode].append(result)
            print(f"seed {seed} backfill {mode:>9}: {json.dumps(result)}", flush=True)
    median = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    keys = list(median["off"])
    print(f"\n{'median over ' + str(args.seeds) + ' seeds':<22}" + "".join(f"{m:>12}" for m in MODES))
    for k in keys:
        print(f"{k:<22}" + "".join(f"{median[m][k]:>12}" for m in MODES))
    out = HERE / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "backfill.json").write_text(json.dumps({"args": vars(args), "runs": runs, "median": median}, indent=2))


if __name__ == "__main__":
    main()
