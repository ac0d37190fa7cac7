"""Nodes and Pods for the planner's tests, real-shaped: GPU products as GFD names them."""

from __future__ import annotations

from dataclasses import replace

from tests.mig.configs import A100_80, operator_layouts
from webhook.domain.policy_model import MigReshaping
from webhook.mig.planner import Candidate, Free, Plan, Waiting, plan

GI = 1024
NOW = 10_000.0
SETTINGS = MigReshaping(idle_seconds=60.0, max_in_flight=2, drain=True)
LAYOUTS = operator_layouts()


def node(name: str, product: str = A100_80, gpus: int = 2, **kw: object) -> Candidate:
    fields: dict[str, object] = {
        "opted_in": True,
        "layout": "all-1g.10gb",
        "state": "success",
        "busy": False,
        "idle_since": NOW - 3600,
        "changed_at": None,
    }
    fields.update(kw)
    return Candidate(name, product, gpus, **fields)  # type: ignore[arg-type]


def pods(n: int, gib: int, prefix: str = "p", **kw: object) -> list[Waiting]:
    return [Waiting(f"team-a/{prefix}{i}", gib * GI, **kw) for i in range(n)]  # type: ignore[arg-type]


def free_1g(name: str, count: int = 14) -> Free:
    return Free(name, "A100-80GB", "1g.10gb", 9728, count)


def run(
    demand: list[Waiting],
    nodes: list[Candidate],
    free: list[Free] | None = None,
    *,
    now: float = NOW,
    settings: MigReshaping = SETTINGS,
) -> Plan:
    return plan(demand, free or [], nodes, layouts=LAYOUTS, settings=settings, now=now)


def applied(nodes: list[Candidate], result: Plan, now: float) -> list[Candidate]:
    """The nodes after the leader asked for the plan's changes (each changing, changed now)."""
    chosen = {c.node: c.to_layout for c in result.changes}
    return [replace(n, changing=chosen[n.name], changed_at=now) if n.name in chosen else n for n in nodes]


def finished(nodes: list[Candidate], name: str, now: float) -> list[Candidate]:
    """The nodes after mig-manager finished `name`'s change: the new layout, success, idle from now."""
    return [
        replace(n, layout=n.changing, changing="", state="success", idle_since=now) if n.name == name else n
        for n in nodes
    ]
