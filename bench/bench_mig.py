"""MIG layouts that follow the queue, simulated: an hour of demand shifting between 1g, 3g and 7g Pods on
20 A100-80GB nodes, re-cutting off and on, side by side on the same arrivals.

gpupool's own leader in simulated time: the queue's real release (webhook.queue.runner.Runner, its passes
deciding through webhook.queue.release on a real PoolIndex and Waiting queue) and the real re-cuts
(webhook.queue.reshape.Reshaper: plan, fence, PATCH with a resourceVersion precondition, follow to done)
with the policy's `migReshaping` defaults (idleSeconds 60, maxInFlight 2, timeoutSeconds 900). Around it,
the API simulator's own parts without HTTP, each stepped on the simulated clock: its object store
(webhook.testing.kubestore), its kube-scheduler and kubelet stand-in (webhook.testing.kubescheduler: binds a
released Pod to a node of its pool with room by kube-scheduler's filters, runs it for its run time), and
its mig-manager stand-in (webhook.testing.kubemig: `pending`, the node's MIG resources gone, then GFD's
labels for the new layout after `--recut-seconds`). The leader's writes go to the store through the same
JSON Patches it sends the API server, 409 on a stale resourceVersion included; its watch is the store's
event log, applied to its index and queue before each pass. Real time would make an hour take an hour
(KubeSim's HTTP API and threads check the same rules in tests/queue/test_reshape.py).

Demand: Poisson arrivals for 3600 s in three 20-minute phases, each mostly (80 %) one kind of Pod
(min-memory 8Gi, 35Gi, 70Gi, `gpupool.io/device: mig`, queued as admission queues them: gated, their
device fixed to the smallest profile that fits, a 1g.10gb, a 3g.40gb, a 7g.80gb) and 10 % of each other,
running an exponential time (mean `--run-seconds`), at a rate that asks for about `--load` of the fleet's
GPU memory. The fleet starts cut one third each way (7 nodes all-1g.10gb, 7 all-3g.40gb, 6 all-7g.80gb),
every node opted in (`gpupool.io/mig-reshape=true`).

Reported per seed and as the median over seeds: GPU-memory-hours served within the hour (the memory of the
instance each Pod ran on x its time running), Pods started, mean and p99 wait (creation to bind) of Pods
that started, Pods still waiting at the end, changes asked and their outcomes, Pods bound to a node while
its layout changed (mig-manager's violations) and releases that found no room (released, never bound).
Writes bench/results/mig-<scoring>-<load>.json.

kube-scheduler, not gpupool, picks the node within a pool: `--scoring LeastAllocated` (its default, the
most resources left: Pods spread over the pool's nodes) or `MostAllocated` on the MIG resources (the
bin-packing strategy of NodeResourcesFit, a scheduler configuration GPU clusters use), which leaves more
nodes empty, and so re-cuttable.

    .venv/bin/python bench/bench_mig.py [--seeds 3] [--load 0.7] [--recut-seconds 180] [--scoring MostAllocated]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from tests.builders import policy  # noqa: E402
from tests.mig.configs import OPERATOR_DEFAULT  # noqa: E402
from tests.queue.fakes import Inventory, Leading  # noqa: E402
from tests.queue.migfleet import GATE, a100  # noqa: E402
from webhook.domain.policy import Policy  # noqa: E402
from webhook.mig.geometry import Catalog  # noqa: E402
from webhook.mig.planner import CONFIG_LABEL  # noqa: E402
from webhook.pools.index import PoolIndex  # noqa: E402
from webhook.pools.kubeobj import node_from_obj, pod_from_obj  # noqa: E402
from webhook.queue.ports import NoMetrics  # noqa: E402
from webhook.queue.reshape import Reshaper  # noqa: E402
from webhook.queue.runner import Runner  # noqa: E402
from webhook.queue.waiting import PODS, Waiting  # noqa: E402
from webhook.sources.eventqueue import Event  # noqa: E402
from webhook.sources.outcomes import Conflict, Gone, Released, ReleaseResult  # noqa: E402
from webhook.testing.kubemig import MigManager  # noqa: E402
from webhook.testing.kubepatch import apply_json_patch  # noqa: E402
from webhook.testing.kubescheduler import Scheduler  # noqa: E402
from webhook.testing.kubestore import Store, kind_of  # noqa: E402

PRODUCT = "NVIDIA-A100-SXM4-80GB"
NODES, GPUS, HORIZON, STEP = 20, 8, 3600.0, 5.0
SIZES = {"1g": 8, "3g": 35, "7g": 70}  # GiB of min-memory
PHASES = ("1g", "3g", "7g")
START = ["all-1g.10gb"] * 7 + ["all-3g.40gb"] * 7 + ["all-7g.80gb"] * 6
LAYOUTS = ("all-1g.10gb", "all-3g.40gb", "all-7g.80gb", "all-balanced")
EPOCH = 1_800_000_000.0  # simulated time 0, as a wall clock (the leader's, and the Pods' creation)
NAMESPACE = "q"
_NODES, _PODS = kind_of("nodes"), kind_of("pods")


def policy_text(reshape: bool, drain: bool = False) -> str:
    text = f"namespaces:\n  {NAMESPACE}: {{placement: queue}}\n"
    reshaping = f"migReshaping:\n  configs: [{', '.join(LAYOUTS)}]\n" + ("  drain: true\n" if drain else "")
    return text + (reshaping if reshape else "")


@dataclass(frozen=True)
class Arrival:
    name: str
    gib: int
    arrives: float
    runs: float


def arrivals(seed: int, load: float, run_seconds: float) -> list[Arrival]:
    rng = random.Random(seed)
    fleet_gib = NODES * GPUS * 80
    pods: list[Arrival] = []
    t = 0.0
    while True:
        phase = PHASES[min(int(t // (HORIZON / 3)), 2)]
        weights = [0.8 if p == phase else 0.1 for p in PHASES]
        mean_gib = sum(w * SIZES[p] for w, p in zip(weights, PHASES, strict=True))
        rate = load * fleet_gib / run_seconds / mean_gib  # Pods a second asking `load` of the memory
        t += rng.expovariate(rate)
        if t >= HORIZON:
            return pods
        kind = rng.choices(PHASES, weights)[0]
        pods.append(Arrival(f"p{len(pods)}", SIZES[kind], t, rng.expovariate(1 / run_seconds)))


def queued_pod(a: Arrival) -> dict[str, Any]:
    """The Pod as admission queues it: gated, its MIG resource fixed to the smallest profile that fits."""
    model = Catalog().model_of(PRODUCT)
    profile = model.smallest_fitting(a.gib * 1024) if model is not None else None
    assert profile is not None, a
    created = datetime.fromtimestamp(EPOCH + a.arrives, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    annotations = {"gpupool.io/device": "mig", "gpupool.io/min-memory": f"{a.gib}Gi"}
    annotations["kubesim.io/run-seconds"] = f"{a.runs:.3f}"
    resource = f"nvidia.com/mig-{profile.label_name}"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": a.name, "namespace": NAMESPACE, "creationTimestamp": created, "annotations": annotations},
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {resource: "1"}}}],
        },
        "status": {"phase": "Pending"},
    }


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def wall(self) -> float:
        return EPOCH + self.t

    def __call__(self) -> float:
        return self.t


class StoreApi:
    """The leader's writes, as kube-apiserver would take them, straight into the store: a JSON Patch
    applied to the object stored, refused with a conflict when it pins another resourceVersion."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def _patch(self, kind: Any, namespace: str, name: str, ops: list[dict[str, Any]]) -> ReleaseResult:
        with self._store.changed:
            body = self._store.get(kind, namespace, name)
            if body is None:
                return Gone(f"{kind.kind} {name} not found")
            current = orjson.loads(body)
            patched = apply_json_patch(copy.deepcopy(current), ops)
            if patched["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return Conflict(f"the object has been modified; {kind.kind} {name}")
            patched["kind"] = kind.kind
            _, stored = self._store.put(patched, exists=True)
            return Released({**orjson.loads(stored), "kind": kind.kind})

    # webhook.queue.runner.Releaser
    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        return self._patch(_PODS, namespace, name, patch)

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        body = self._store.get(_PODS, namespace, name)
        return None if body is None else orjson.loads(body)


class StoreNodes:
    """webhook.queue.reshape.NodeApi on the store; notes each layout asked for, and when."""

    def __init__(self, api: StoreApi, store: Store, clock: Clock) -> None:
        self._api, self._store, self._clock = api, store, clock
        self.asked: list[tuple[float, str, str]] = []  # (simulated time, node, layout)

    def read(self, name: str) -> dict[str, Any] | None:
        body = self._store.get(_NODES, "", name)
        return None if body is None else orjson.loads(body)

    def patch(self, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        result = self._api._patch(_NODES, "", name, patch)
        if isinstance(result, Released):
            label = "/metadata/labels/" + CONFIG_LABEL.replace("/", "~1")
            self.asked += [(self._clock.t, name, op["value"]) for op in patch if op["path"] == label]
        return result


class ConfigText:
    def read(self, namespace: str, name: str) -> str:
        return OPERATOR_DEFAULT


class Told:
    def __init__(self) -> None:
        self.reasons: Counter[str] = Counter()

    def record(self, event: Event) -> None:
        self.reasons[event.reason] += 1


class Counted(NoMetrics):
    """webhook.queue.ports.QueueMetrics, keeping only the re-cuts' outcomes."""

    def __init__(self) -> None:
        self.reshapes: Counter[str] = Counter()

    def mig_reshaped(self, outcome: str) -> None:
        self.reshapes[outcome] += 1


@dataclass
class Ran:
    started: float
    mib: int
    ended: float | None = None


def fleet(recut_seconds: float) -> tuple[Store, MigManager]:
    """20 nodes labelled as GFD labels them when cut all-1g.10gb, then re-cut by mig-manager into the
    starting layouts before the hour begins."""
    store = Store()
    nodes = [a100(f"n{i:02}", gpus=GPUS) for i in range(NODES)]
    store.load(nodes)
    mig = MigManager(store, OPERATOR_DEFAULT, delay=recut_seconds)
    for node, layout in zip(nodes, START, strict=True):
        node["metadata"]["labels"][CONFIG_LABEL] = layout
    store.load(nodes)
    mig.step(-2 * recut_seconds)
    mig.step(-recut_seconds)
    return store, mig


def mig_resources() -> tuple[str, ...]:
    """Every MIG resource of the fleet's GPU model, which a bin-packing kube-scheduler scores."""
    model = Catalog().model_of(PRODUCT)
    assert model is not None
    return tuple(f"nvidia.com/mig-{p.label_name}" for p in model.profiles.values())


def simulate(
    pods: list[Arrival], *, reshape: bool, recut_seconds: float, scoring: str, drain: bool = False
) -> dict[str, Any]:
    store, mig = fleet(recut_seconds)
    scored = mig_resources() if scoring == "MostAllocated" else ("cpu", "memory")
    scheduler = Scheduler(store, scoring=scoring, scored=scored)
    clock = Clock()
    pol: Policy = policy(policy_text(reshape, drain))
    index, waiting = PoolIndex(pol), Waiting(pol, clock=clock)
    api, told, counted = StoreApi(store), Told(), Counted()
    nodes = StoreNodes(api, store, clock)
    reshaper = Reshaper(nodes, ConfigText(), told, counted, wall=clock.wall)
    leading: Any = Leading()  # an Elector as far as the Runner asks (leading(), always)
    runner = Runner(
        Inventory(index), waiting, leading, api, events=told, metrics=counted, clock=clock, reshaper=reshaper
    )
    ran: dict[str, Ran] = {}
    released: dict[str, float] = {}
    created: dict[str, float] = {a.name: a.arrives for a in pods}
    following = store.oldest_rv
    next_arrival = 0

    def follow() -> None:
        """The leader's watch: every write since the last look, applied to its index and queue."""
        nonlocal following
        while True:
            events, following = store.events_after(following, 10_000)
            if not events:
                return
            for e in events:
                obj = {**orjson.loads(e.body), "kind": e.kind.kind}
                name = obj["metadata"]["name"]
                if e.kind is _NODES:
                    index.upsert_node(node_from_obj(obj, pol.gpu_resources, pol.partition_prefixes))
                    continue
                key = (NAMESPACE, name)
                if e.type == "DELETED":
                    index.remove_pod(key)
                else:
                    index.upsert_pod(pod_from_obj(obj, pol.gpu_resources, pol.partition_prefixes), key)
                waiting.apply(PODS, e.type, obj)
                spec, phase = obj.get("spec") or {}, (obj.get("status") or {}).get("phase")
                if not spec.get("schedulingGates") and name not in released:
                    released[name] = clock.t
                if spec.get("nodeName") and name not in ran:
                    node = store.get(_NODES, "", spec["nodeName"])
                    labels = orjson.loads(node or b"{}").get("metadata", {}).get("labels", {})
                    (resource,) = spec["containers"][0]["resources"]["limits"]
                    ran[name] = Ran(clock.t, int(labels.get(f"{resource}.memory", "0")))
                if phase == "Succeeded" and name in ran and ran[name].ended is None:
                    ran[name].ended = clock.t

    started_at = time.perf_counter()
    try:
        while clock.t <= HORIZON:
            while next_arrival < len(pods) and pods[next_arrival].arrives <= clock.t:
                store.put(queued_pod(pods[next_arrival]), exists=False)
                next_arrival += 1
            scheduler.step(clock.t)
            mig.step(clock.t)
            follow()
            for name, r in list(ran.items()):  # a finished Pod goes (its Job's controller would delete it)
                if r.ended is not None and store.get(_PODS, NAMESPACE, name) is not None:
                    store.remove(_PODS, NAMESPACE, name)
            follow()
            runner.run_pass()
            follow()
            clock.t += STEP
    finally:
        runner.stop()
    waits = sorted(r.started - created[name] for name, r in ran.items())
    served = sum(
        r.mib / 1024 * (min(r.ended if r.ended is not None else HORIZON, HORIZON) - r.started) for r in ran.values()
    )
    return {
        "gpu_memory_hours": round(served / 3600, 1),
        "pods": len(pods),
        "started": len(ran),
        "waiting_at_end": len(pods) - len(ran),
        "mean_wait_s": round(statistics.fmean(waits), 1) if waits else 0.0,
        "p99_wait_s": round(waits[int(0.99 * (len(waits) - 1))], 1) if waits else 0.0,
        "changes": counted.reshapes["asked"],
        "outcomes": dict(sorted(counted.reshapes.items())),
        "asked": [f"{t:.0f}s {node} {layout}" for t, node, layout in nodes.asked],
        "violations": len(mig.violations),
        # Released and not bound within two steps (the scheduler binds at the step after the release).
        "released_no_room": sum(
            1 for n, at in released.items() if (ran[n].started if n in ran else HORIZON + STEP) - at > 2 * STEP
        ),
        "seconds": round(time.perf_counter() - started_at, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--run-seconds", type=float, default=300.0)
    parser.add_argument("--recut-seconds", type=float, default=180.0)
    parser.add_argument(
        "--scoring",
        choices=("LeastAllocated", "MostAllocated"),
        default="LeastAllocated",
        help="kube-scheduler's NodeResourcesFit strategy: its default (spreads), or bin-packing on the MIG resources",
    )
    parser.add_argument(
        "--drain", action="store_true", help="re-cutting on with migReshaping.drain: true (drain by not filling)"
    )
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for seed in range(1, args.seeds + 1):
        pods = arrivals(seed, args.load, args.run_seconds)
        for mode, results in runs.items():
            on = mode == "on"
            result = simulate(
                pods, reshape=on, recut_seconds=args.recut_seconds, scoring=args.scoring, drain=on and args.drain
            )
            results.append(result)
            print(f"seed {seed} re-cutting {mode:>3}: {json.dumps(result)}", flush=True)
    numeric = [k for k, v in runs["off"][0].items() if isinstance(v, int | float)]
    median = {m: {k: statistics.median(r[k] for r in rs) for k in numeric} for m, rs in runs.items()}
    for mode, figures in median.items():
        print(f"median re-cutting {mode:>3}: {json.dumps(figures)}")
    out = HERE / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"mig-{args.scoring}-{args.load}.json").write_text(
        json.dumps({"args": vars(args), "runs": runs, "median": median}, indent=2)
    )


if __name__ == "__main__":
    main()
