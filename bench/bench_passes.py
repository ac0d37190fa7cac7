"""Benchmark: what a pass of the queue costs with many distinct Pods waiting, parked or decided again.

The leader's pass (webhook.queue.release) keeps the answer of a waiting shape that could not go and
decides it again only when something it read changed (webhook.queue.parking). The baseline is the same
pass deciding every shape again every pass (no parking: what the queue did before), in the same process,
on the same index, the two interleaved round by round.

The fleet: 20 Tesla-T4 nodes of 4 GPUs, all taken by running Pods, and one free NVIDIA-L4 node. Waiting:
`large` Pods, each 2 GPUs on a T4, each a distinct shape (a required node affinity of 10 x 256 values
of 60 characters no node has: 6 x 256 before long value lists were kept as one text, webhook.domain.packed,
about 155 KiB held), so over what a memo entry may weigh (128 KiB) and decided
from scratch whenever decided; or `small` Pods, 2,000 distinct ordinary shapes (gpupool.io/min-memory
varies). For each count it measures, per mode:

- `steady`: a pass with nothing changed (the median of 5): CPU seconds and decisions;
- `victim`: a 1-GPU Pod of another namespace queued for the free L4: the CPU and wall seconds of the
  pass that releases it (what the victim waits for beyond the watch and the PATCH);
- `room`: one GPU frees on one T4 node (not enough for any of them): the next pass's CPU and decisions.

And `queued` Pods (10,000 and 100,000 by default), each a distinct ordinary shape (a toleration of its
own), where deciding every shape again is out of reach (about 0.3 ms a shape). There, by default, the
passes are the leader's runner's (webhook.queue.runner, its writes answered by a stand-in that releases
at once): `whole`, every pass over the whole queue (what the runner did before its passes went on from
the last one's end), against `standing`, going on when it may (webhook.queue.standing); both count the
steps they take (`PassResult.walked`: a Pod decided or passed over, a line left to wait; before lines, a step
was a waiting Pod). With `--queued-modes walk,after`, the pass alone instead: the parking of `--walk-rev` (by
default the commit before the parked shapes were indexed by counter), which takes a parked answer only
after reading its counters, per shape and per pass (`walk`), against the index by counter (`after`);
both count the pass's visits (decisions, and parked answers read).

    .venv/bin/python bench/bench_passes.py [--large 100,200,400] [--small 2000] [--queued 10000,100000]
        [--queued-modes whole,standing] [--rounds 3] [--walk-rev 355b0ea]

Results are printed and written to bench/results/passes-<time>.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.queue.fakes import Inventory, Leading  # noqa: E402
from webhook.admission.core import evaluate  # noqa: E402
from webhook.domain.policy import Policy, load_policy_text  # noqa: E402
from webhook.pools.index import PoolIndex  # noqa: E402
from webhook.pools.kubeobj import pod_from_obj  # noqa: E402
from webhook.queue.outcomes import PassResult  # noqa: E402
from webhook.queue.parking import Parking  # noqa: E402
from webhook.queue.release import Plan, decide_batch, read_batch, settle  # noqa: E402
from webhook.queue.runner import Runner  # noqa: E402
from webhook.queue.waiting import PODS, Waiting  # noqa: E402
from webhook.sources.outcomes import Released  # noqa: E402
from webhook.sources.snapshot import build_index  # noqa: E402

RESULTS = REPO / "bench" / "results"
POLICY = "namespaces:\n  q: {placement: queue}\n  q2: {placement: queue}\n"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
T4_NODES = 20
WALK_REV = "355b0ea"  # the parking before its index by counter (issue 27, finding 4)


def node(name: str, product: str, memory_mib: int) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/cuda.driver-version.full": "535.104.05",
        "gpu.accelerator/class": "medium",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_pod(name: str, namespace: str, gpus: int, annotations: dict[str, str], node_name: str = "") -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "registry.example/train:1.0",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    spec: dict[str, Any] = {"containers": [container], "tolerations": [TOLERATION]}
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }
    if node_name:
        spec["nodeName"] = node_name
        obj["status"] = {"phase": "Running"}
    return obj


def busy(node_name: str, gpus: int) -> dict[str, Any]:
    return gpu_pod(f"busy-{node_name}", "other", gpus, {}, node_name)


def queued(obj: dict[str, Any], policy: Policy, index: PoolIndex, k: int) -> dict[str, Any]:
    """The Pod as kube-apiserver stores it once gpupool queued it."""
    meta = obj["metadata"]
    verdict = evaluate(obj, meta["namespace"], policy, index)
    assert verdict.allowed and verdict.queued, verdict.message
    stored = jsonpatch.apply_patch(copy.deepcopy(obj), list(verdict.patch))
    created = f"2026-12-01T{10 + k // 3600:02d}:{k // 60 % 60:02d}:{k % 60:02d}Z"
    stored["metadata"] |= {
        "uid": f"uid-{meta['namespace']}-{meta['name']}",
        "resourceVersion": "1",
        "creationTimestamp": created,
    }
    return stored


def large(obj: dict[str, Any], seed: int) -> dict[str, Any]:
    values = [f"s{seed}-{k:04d}-".ljust(60, "x") for k in range(10 * 256)]
    expressions = [
        {"key": f"example.com/rack-{e}", "operator": "NotIn", "values": values[e * 256 : (e + 1) * 256]}
        for e in range(10)
    ]
    required = {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
    obj["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    return obj


def setting(kind: str, count: int) -> tuple[Policy, PoolIndex, Waiting]:
    policy = load_policy_text(POLICY)
    nodes = [node(f"t4-{i:02d}", "Tesla-T4", 15360) for i in range(T4_NODES)] + [node("l4-a", "NVIDIA-L4", 23034)]
    index = build_index(nodes + [busy(f"t4-{i:02d}", 4) for i in range(T4_NODES)], policy)
    waiting = Waiting(policy)
    template = queued(gpu_pod("template", "q", 2, {"gpupool.io/gpu-product": "Tesla-T4"}), policy, index, 0)
    for k in range(count):
        if kind == "queued":  # admitted as the template was; a toleration of its own makes it a shape of its own
            obj = copy.deepcopy(template)
            obj["metadata"] |= {"name": f"p{k:06d}", "uid": f"uid-q-p{k:06d}"}
            obj["metadata"]["creationTimestamp"] = (
                f"2026-12-01T{10 + k // 3600 % 14:02d}:{k // 60 % 60:02d}:{k % 60:02d}Z"
            )
            obj["spec"]["tolerations"].append({"key": f"example.com/q{k}", "operator": "Exists"})
        elif kind == "large":
            annotations = {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-product": "Tesla-T4"}
            obj = large(queued(gpu_pod(f"p{k:05d}", "q", 2, annotations), policy, index, k), k)
        else:
            annotations = {"gpupool.io/gpu-product": "Tesla-T4", "gpupool.io/min-memory": f"{k + 1}Mi"}
            obj = queued(gpu_pod(f"p{k:05d}", "q", 2, annotations), policy, index, k)
        index.upsert_pod(pod_from_obj(obj, policy.gpu_resources, policy.partition_prefixes))
        waiting.apply(PODS, "ADDED", obj)
    return policy, index, waiting


def a_pass(policy: Policy, index: PoolIndex, waiting: Waiting, parking: Parking | None) -> tuple[Plan, float, float]:
    """One pass as the runner makes it (its requests read, then decided), with its CPU and wall seconds;
    its visits: those it counts, and with the parking of `--walk-rev` the parked answers whose counters it read."""
    cpu, wall = time.process_time(), time.perf_counter()
    read_before = getattr(parking, "read", 0)
    if parking is not None:
        parking.keep_only({q.digest for q in waiting.ordered()})
    decided = decide_batch(read_batch(waiting.ordered(), policy, parking=parking), index, policy)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return decided._replace(visits=decided.visits + getattr(parking, "read", 0) - read_before), cpu, wall


def walking(rev: str) -> type[Parking]:
    """The Parking of commit `rev` (read with git): the one that reads each parked shape's counters every
    pass. Its `look`, which that commit's decide_batch did not call, does nothing."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:webhook/queue/parking.py"], check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType("parking_walk")
    exec(compile(source, f"{rev}:webhook/queue/parking.py", "exec"), module.__dict__)  # the module of our own history
    old: type[Parking] = module.Parking

    class Walk(old):  # type: ignore[valid-type,misc]
        """Counts the parked answers it took, each after reading the shape's counters (a visit)."""

        read = 0

        def look(self, index: PoolIndex, policy: Policy) -> None:
            return None

        def keep_gangs(self, keys: set[tuple[str, str]]) -> None:  # gangs were parked after that commit
            return None

        def passed(self, now: float | None) -> None:
            return None

        def parked(self, *args: Any, **kw: Any) -> Any:
            answer = super().parked(*args, **kw)
            self.read += answer is not None
            return answer

    return Walk


Step = Callable[[], tuple[Any, float, float]]  # one pass: what it did (a Plan or a PassResult), CPU and wall seconds


def scenario(index: PoolIndex, waiting: Waiting, victim: dict[str, Any], step: Step) -> tuple[dict[str, Any], Any]:
    """The passes every mode is measured by, each made by `step`: the first, 5 with nothing changed, the one
    after `victim` (a 1-GPU Pod of another namespace for the free L4) is queued, the one after it leaves, and
    the one after a GPU frees on a T4 node (not enough for any waiting Pod). Their figures, and the victim's
    pass's result."""
    policy = index.policy
    first, first_cpu, _ = step()
    steady = [step() for _ in range(5)]
    index.upsert_pod(pod_from_obj(victim, policy.gpu_resources, policy.partition_prefixes))
    waiting.apply(PODS, "ADDED", victim)
    released, victim_cpu, victim_wall = step()
    waiting.apply(PODS, "DELETED", victim)
    step()  # the release, shown (or applied to the index): re-decides nothing it took from
    index.upsert_pod(pod_from_obj(busy("t4-00", 3), policy.gpu_resources, policy.partition_prefixes))
    room, room_cpu, _ = step()
    last = steady[-1][0]
    return {
        "first_cpu_s": first_cpu,
        "first_decisions": first.decisions,
        "steady_cpu_s": statistics.median(s[1] for s in steady),
        "steady_decisions": last.decisions,
        "steady_visits": last.visits,
        "steady_walked": last.walked,
        "victim_cpu_s": victim_cpu,
        "victim_wall_s": victim_wall,
        "victim_decisions": released.decisions,
        "victim_walked": released.walked,
        "room_cpu_s": room_cpu,
        "room_decisions": room.decisions,
        "room_visits": room.visits,
        "room_released": len(room.releases) if isinstance(room, Plan) else room.released,
    }, released


def victim_of(policy: Policy, index: PoolIndex) -> dict[str, Any]:
    return queued(gpu_pod("victim", "q2", 1, {"gpupool.io/gpu-product": "NVIDIA-L4"}), policy, index, 10**5)


def measure(kind: str, count: int, mode: str, walk: type[Parking] | None = None) -> dict[str, Any]:
    """`scenario` for the pass alone: `before` without parking, `walk` with the parking of `--walk-rev`,
    `after` with the parking of this tree."""
    policy, index, waiting = setting(kind, count)
    parking = None if mode == "before" else walk() if mode == "walk" and walk is not None else Parking()
    passes = lambda: a_pass(policy, index, waiting, parking)  # noqa: E731 (the scenario's step)
    figures, victim = scenario(index, waiting, victim_of(policy, index), passes)
    assert [r.queued.key for r in victim.releases] == [("q2", "victim")], victim.releases
    assert not figures["room_released"]
    for release in victim.releases:
        settle(index, release, None)
    return figures


class _Api:
    """Releases every Pod it is asked to (no round trip); Events go nowhere."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}

    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> Released:
        return Released(jsonpatch.apply_patch(copy.deepcopy(self.pods[(namespace, name)]), patch))

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))

    def record(self, event: Any) -> None:
        return None


class _Whole(Runner):
    """The runner as it was before its passes went on from the last one's end: every pass decides the
    whole queue (the one switch the benchmark turns: the runner's own test of whether it may go on)."""

    def _may_go_on(self, policy: Policy) -> bool:
        return False


def runner_pass(runner: Runner) -> tuple[PassResult, float, float]:
    """One pass of the leader's runner (its writes answered), with its CPU and wall seconds."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = runner.run_pass()
    return result, time.process_time() - cpu, time.perf_counter() - wall


def measure_runner(kind: str, count: int, mode: str) -> dict[str, Any]:
    """`scenario` for the leader's runner: `whole` decides the whole queue every pass, `standing` goes on
    from the last pass's end when it may (webhook.queue.standing)."""
    policy, index, waiting = setting(kind, count)
    api = _Api()
    runner = (_Whole if mode == "whole" else Runner)(Inventory(index), waiting, Leading(), api, events=api)
    api.pods[("q2", "victim")] = victim = victim_of(policy, index)
    figures, released = scenario(index, waiting, victim, lambda: runner_pass(runner))
    assert released.released == 1, released
    assert not figures["room_released"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", default="100,200,400", help="counts of large distinct waiting Pods")
    parser.add_argument("--small", default="2000", help="counts of small distinct waiting Pods")
    parser.add_argument("--queued", default="10000,100000", help="counts of queued distinct Pods (walk vs after)")
    parser.add_argument("--walk-rev", default=WALK_REV, help="the commit whose parking reads every shape's counters")
    parser.add_argument(
        "--queued-modes",
        default="whole,standing",
        help="for --queued: walk and after (the pass alone, parking of --walk-rev against by counter), whole and"
        " standing (the leader's runner, every pass over the whole queue against going on from the last one)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs = [(kind, int(n)) for kind in ("large", "small", "queued") for n in getattr(args, kind).split(",") if n]
    queued_modes = tuple(args.queued_modes.split(","))
    walk = walking(args.walk_rev) if any(kind == "queued" for kind, _ in runs) and "walk" in queued_modes else None
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for kind, count in runs:
        modes = queued_modes if kind == "queued" else ("before", "after")
        per = results.setdefault(f"{kind}-{count}", {mode: [] for mode in modes})
        for _ in range(args.rounds):  # interleaved: the machine is shared
            for mode in modes:
                runner = mode in ("whole", "standing")
                per[mode].append(measure_runner(kind, count, mode) if runner else measure(kind, count, mode, walk))
        print(f"{kind} x {count}:")
        for mode in modes:
            rows = per[mode]
            med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            ms = {key: value * 1000 for key, value in med.items() if key.endswith("_s")}
            print(
                f"  {mode:6}  steady pass {ms['steady_cpu_s']:8.2f} ms CPU, {med['steady_decisions']:5.0f} decisions,"
                f" {med['steady_visits']:6.0f} visits, {med['steady_walked']:6.0f} steps"
                f" | victim's pass {ms['victim_cpu_s']:8.2f} ms CPU"
                f" ({ms['victim_wall_s']:8.2f} ms wall), {med['victim_decisions']:5.0f} decisions"
                f" | a T4 GPU frees: {ms['room_cpu_s']:8.2f} ms, {med['room_decisions']:5.0f} decisions,"
                f" {med['room_visits']:6.0f} visits"
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"passes-{time.strftime('%Y%m%dT%H%M%S')}.json"
    meta = {"python": platform.python_version(), "rounds": args.rounds, "t4_nodes": T4_NODES, "walk_rev": args.walk_rev}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
