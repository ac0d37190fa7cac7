"""MIG layouts that follow the queue, simulated: an hour of demand shifting between 1g, 3g and 7g Pods on
20 A100-80GB nodes, re-cutting off and on, side by side on the same arrivals.

A discrete-event simulation in simulated time over gpupool's real MIG code: the GPU Operator's
mig-parted config (the extract in tests/mig/configs.py) read by webhook.mig.config, what each layout
yields from webhook.mig.layouts, and every re-cut decided by webhook.mig.planner.plan with the policy's
defaults (idleSeconds 60, maxInFlight 2). What it stands in for: the queue's release (each pass, the
waiting Pods in order take the smallest free instance that fits them, none jumping an earlier Pod
that wants the same profile) and mig-manager (a change takes `--recut-seconds`, during which the node
offers nothing). The real-time simulator (KubeSim with its mig-manager stand-in) checks the rules; an
hour of demand there would take an hour, and speeding up its clocks would shrink the API's latencies
against the simulated minutes, so the figures here come from simulated time.

Demand: Poisson arrivals for 3600 s in three 20-minute phases, each mostly (80 %) one profile's Pods
(min-memory 8Gi, 35Gi, 70Gi: a 1g.10gb, a 3g.40gb, a 7g.80gb) and 10 % of each other, running an
exponential time (mean `--run-seconds`), at a rate that asks for about `--load` of the fleet's GPU
memory. The fleet starts cut one third each way (7 nodes all-1g.10gb, 7 all-3g.40gb, 6 all-7g.80gb).

Reported per seed and as the median over seeds: GPU-memory-hours served within the hour (the memory
of the instance each Pod ran on x its time running), Pods started, mean and p99 wait of Pods that
started, Pods still waiting at the end, and changes made. Writes bench/results/mig.json.

    .venv/bin/python bench/bench_mig.py [--seeds 3] [--load 0.7] [--recut-seconds 180]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from tests.mig.configs import OPERATOR_DEFAULT  # noqa: E402
from webhook.domain.policy_model import MigReshaping  # noqa: E402
from webhook.mig.config import parse_config  # noqa: E402
from webhook.mig.layouts import Layouts, Yield  # noqa: E402
from webhook.mig.planner import Candidate, Free, Waiting, plan  # noqa: E402

PRODUCT = "NVIDIA-A100-SXM4-80GB"
MODEL = "A100-80GB"
NODES, GPUS, HORIZON, STEP = 20, 8, 3600.0, 10.0
SIZES = {"1g": 8, "3g": 35, "7g": 70}  # GiB of min-memory
PHASES = ("1g", "3g", "7g")
START = ["all-1g.10gb"] * 7 + ["all-3g.40gb"] * 7 + ["all-7g.80gb"] * 6


@dataclass
class Pod:
    name: str
    memory_mib: int
    arrives: float
    runs: float
    started: float | None = None
    node: str = ""
    profile: str = ""
    instance_mib: int = 0


@dataclass
class Node:
    name: str
    layout: str
    free: dict[str, int] = field(default_factory=dict)  # profile -> free instances
    memory: dict[str, int] = field(default_factory=dict)  # profile -> MiB
    running: int = 0
    idle_since: float = -3600.0
    ready_at: float = 0.0  # a re-cut under way until then
    changing: str = ""
    changed_at: float | None = None


def arrivals(seed: int, load: float, run_seconds: float) -> list[Pod]:
    rng = random.Random(seed)
    fleet_gib = NODES * GPUS * 80
    pods: list[Pod] = []
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
        pods.append(Pod(f"p{len(pods)}", SIZES[kind] * 1024, t, rng.expovariate(1 / run_seconds)))


def cut(node: Node, layouts: Layouts) -> None:
    chosen = layouts.on(PRODUCT, GPUS)[node.layout]
    assert isinstance(chosen, Yield), chosen
    node.free = {p.name: n for p, n in chosen.instances}
    node.memory = {p.name: p.memory_mib for p, _ in chosen.instances}


def simulate(pods: list[Pod], *, reshape: bool, recut_seconds: float) -> dict[str, Any]:
    layouts = Layouts.choosable(
        parse_config(OPERATOR_DEFAULT), ("all-1g.10gb", "all-3g.40gb", "all-7g.80gb", "all-balanced")
    )
    settings = MigReshaping()
    nodes = [Node(f"n{i:02}", layout) for i, layout in enumerate(START)]
    for n in nodes:
        cut(n, layouts)
    by_name = {n.name: n for n in nodes}
    pods = [Pod(p.name, p.memory_mib, p.arrives, p.runs) for p in pods]
    ending: list[tuple[float, str]] = []
    by_pod = {p.name: p for p in pods}
    waiting: list[Pod] = []
    next_arrival = 0
    changes = 0
    t = 0.0
    while t <= HORIZON:
        while ending and ending[0][0] <= t:
            _, name = heapq.heappop(ending)
            p = by_pod[name]
            n = by_name[p.node]
            n.free[p.profile] += 1
            n.running -= 1
            if n.running == 0:
                n.idle_since = t
        for n in nodes:
            if n.changing and t >= n.ready_at:
                n.layout, n.changing = n.changing, ""
                cut(n, layouts)
                n.idle_since = t
        while next_arrival < len(pods) and pods[next_arrival].arrives <= t:
            waiting.append(pods[next_arrival])
            next_arrival += 1
        # The queue's release: in order, the smallest free instance that fits, on a node not being re-cut.
        still: list[Pod] = []
        blocked: set[int] = set()  # memory sizes an earlier Pod waits for: no later one takes their room
        for p in waiting:
            best = None
            if p.memory_mib not in blocked:
                for n in nodes:
                    if n.changing:
                        continue
                    for profile, free in n.free.items():
                        if free and n.memory[profile] >= p.memory_mib:
                            key = (n.memory[profile], n.name, profile)
                            if best is None or key < best:
                                best = key
            if best is None:
                blocked.add(p.memory_mib)
                still.append(p)
                continue
            mib, node, profile = best
            n = by_name[node]
            n.free[profile] -= 1
            n.running += 1
            p.started, p.node, p.profile, p.instance_mib = t, node, profile, mib
            heapq.heappush(ending, (t + p.runs, p.name))
        waiting = still
        if reshape and waiting:
            free = [
                Free(n.name, MODEL, prof, n.memory[prof], c)
                for n in nodes
                if not n.changing
                for prof, c in n.free.items()
                if c
            ]
            candidates = [
                Candidate(
                    n.name,
                    PRODUCT,
                    GPUS,
                    True,
                    n.layout,
                    "pending" if n.changing else "success",
                    n.running > 0,
                    n.idle_since,
                    n.changed_at,
                    n.changing,
                )
                for n in nodes
            ]
            result = plan(
                [Waiting(p.name, p.memory_mib) for p in waiting],
                free,
                candidates,
                layouts=layouts,
                settings=settings,
                now=t,
            )
            for change in result.changes:
                n = by_name[change.node]
                n.changing, n.changed_at, n.ready_at = change.to_layout, t, t + recut_seconds
                n.free = {}
                changes += 1
        t += STEP
    started = [p for p in pods if p.started is not None]
    waits = sorted(p.started - p.arrives for p in started)  # type: ignore[operator]
    served = sum(p.instance_mib / 1024 * (min(p.started + p.runs, HORIZON) - p.started) / 3600 for p in started)  # type: ignore[operator]
    return {
        "gpu_memory_hours": round(served, 1),
        "pods": len(pods),
        "started": len(started),
        "waiting_at_end": len(pods) - len(started),
        "mean_wait_s": round(statistics.fmean(waits), 1) if waits else 0.0,
        "p99_wait_s": round(waits[int(0.99 * (len(waits) - 1))], 1) if waits else 0.0,
        "changes": changes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--run-seconds", type=float, default=300.0)
    parser.add_argument("--recut-seconds", type=float, default=180.0)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for seed in range(1, args.seeds + 1):
        pods = arrivals(seed, args.load, args.run_seconds)
        for mode, results in runs.items():
            result = simulate(pods, reshape=mode == "on", recut_seconds=args.recut_seconds)
            results.append(result)
            print(f"seed {seed} re-cutting {mode:>3}: {json.dumps(result)}", flush=True)
    median = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    for mode, figures in median.items():
        print(f"median re-cutting {mode:>3}: {json.dumps(figures)}")
    out = HERE / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "mig.json").write_text(json.dumps({"args": vars(args), "runs": runs, "median": median}, indent=2))


if __name__ == "__main__":
    main()
