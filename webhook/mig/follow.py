"""Where a change gpupool asked for stands, from the node's labels: under way, done, failed or stuck.

mig-manager sets `nvidia.com/mig.config.state` to `pending` once it starts, then `success` or `failed`;
if the layout was already in place it sets `success` without `pending`, and until it notices the label
the state is still the last change's. So `success` alone does not say the change is done: it is done
when GPU Feature Discovery's labels and the node's allocatable show the new layout (`shows`). Until
then, and while `pending` or `rebooting`, the change is under way (the leader releases nothing to the
node); after `timeout_seconds` it is stuck; `failed` is failed; and a label no longer naming what
gpupool asked for means someone else changed it (superseded: gpupool leaves the node to them).

What gpupool asked for lives on the node, so that a new leader after failover carries on: it writes
`gpupool.io/mig-reshape-asked: "<layout>@<RFC 3339 time>"` with the label, in the same PATCH, and
`gpupool.io/mig-reshape-outcome: "<outcome>@<time>"` once the change ended (done, failed, stuck,
superseded). A node whose asked change has no outcome yet is being re-cut (`under_way`): no Pod is
released to it (webhook.pools.nodes counts it not usable), whatever its labels say meanwhile.

A change written `stuck` holds the node (`stuck_hold`): gpupool asks nothing more of it while its label
still names the layout asked for, since mig-manager acts only on a change of the value and asking again
would time out again. The hold ends when the node shows that layout with `success` after all
(`done_late`: mig-manager or GFD were slower than `timeoutSeconds`; the leader then writes `done`), or
when someone labels another layout (an admin who fixed the cause).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NamedTuple

from webhook.mig.layouts import Layouts, Yield, gpu_count
from webhook.mig.planner import CONFIG_LABEL, STATE_LABEL

IN_FLIGHT, DONE, FAILED, STUCK, SUPERSEDED = "in-flight", "done", "failed", "stuck", "superseded"
STRATEGY_LABEL = "nvidia.com/mig.strategy"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_PREFIX = "nvidia.com/mig-"
ANNOTATIONS = "gpupool.io/mig-reshape-"  # the prefix of gpupool's own annotations on a node
ASKED_ANNOTATION = "gpupool.io/mig-reshape-asked"
OUTCOME_ANNOTATION = "gpupool.io/mig-reshape-outcome"


class Asked(NamedTuple):
    """A change gpupool asked for: the layout name it set and when (its monotonic or wall clock, as `now`)."""

    layout: str
    at: float


def asked_text(layout: str, at: float) -> str:
    """The value of ASKED_ANNOTATION (or OUTCOME_ANNOTATION, with an outcome) for `layout` at `at` (epoch seconds)."""
    return f"{layout}@{datetime.fromtimestamp(at, UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def read_asked(text: str) -> Asked | None:
    """An annotation's `<name>@<RFC 3339 time>` (epoch seconds); None when it is not one."""
    name, sep, when = text.rpartition("@")
    if not sep or not name or len(text) > 256:
        return None
    try:
        at = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return None
    return Asked(name, (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp())


def asked_of(annotations: Mapping[str, str]) -> Asked | None:
    """The change gpupool last asked for on the node, from its annotations; None when none (or unreadable)."""
    return read_asked(annotations.get(ASKED_ANNOTATION, ""))


def under_way(annotations: Mapping[str, str]) -> bool:
    """Is a change gpupool asked for under way on the node (asked, and no outcome written since)? Then
    nothing is released to it."""
    return asked_of(annotations) is not None and OUTCOME_ANNOTATION not in annotations


def recorded(annotations: Mapping[str, str]) -> str:
    """The outcome written for gpupool's last change of the node ("" when none is)."""
    found = read_asked(annotations.get(OUTCOME_ANNOTATION, ""))
    return found.layout if found is not None else ""


def shows_named(layout: str, labels: Mapping[str, str], allocatable: Mapping[str, int], layouts: Layouts) -> bool:
    """Do the node's labels and allocatable show the named `layout`, as it yields on the node's GPUs?"""
    gpus = gpu_count(labels, layouts.config, layouts.catalog)
    coming = layouts.on(labels.get(PRODUCT_LABEL, ""), gpus).get(layout)
    return isinstance(coming, Yield) and shows(coming, labels, allocatable)


def done_late(
    annotations: Mapping[str, str], labels: Mapping[str, str], allocatable: Mapping[str, int], layouts: Layouts
) -> bool:
    """Was the node's last change written `stuck`, and does it now show the layout asked, with `success`?"""
    asked = asked_of(annotations)
    return (
        asked is not None
        and recorded(annotations) == STUCK
        and labels.get(CONFIG_LABEL, "") == asked.layout
        and labels.get(STATE_LABEL, "") == "success"
        and shows_named(asked.layout, labels, allocatable, layouts)
    )


def stuck_hold(
    annotations: Mapping[str, str], labels: Mapping[str, str], allocatable: Mapping[str, int], layouts: Layouts
) -> str:
    """Why gpupool leaves the node alone after its change was written `stuck` ("" when it does not): its
    label still names the layout asked for, which the node does not show (see the module's docstring)."""
    asked = asked_of(annotations)
    if asked is None or recorded(annotations) != STUCK or labels.get(CONFIG_LABEL, "") != asked.layout:
        return ""
    if done_late(annotations, labels, allocatable, layouts):
        return ""
    return (
        f"its change to {asked.layout} was stuck: gpupool asks nothing more of it until it shows that layout "
        f"or an admin labels another {CONFIG_LABEL}"
    )


def status(
    asked: Asked,
    *,
    label: str,
    state: str,
    shown: bool,
    now: float,
    timeout_seconds: float,
) -> str:
    """The change `asked` for, as the node's `nvidia.com/mig.config`
    (`label`), its state and whether its labels show the new layout (`shown`) say it stands."""
    requested, requested_at = asked
    if label != requested:
        return SUPERSEDED
    if state == "failed":
        return FAILED
    if state == "success" and shown:
        return DONE
    return STUCK if now - requested_at > timeout_seconds else IN_FLIGHT


def shows(layout: Yield, labels: Mapping[str, str], allocatable: Mapping[str, int]) -> bool:
    """Do the node's GFD labels and allocatable show `layout`'s instances, and only those? Mixed
    strategy: allocatable `nvidia.com/mig-<profile>` per profile; single: one profile, in the product
    label, with allocatable `nvidia.com/gpu` the instances."""
    wanted = {p.label_name: n for p, n in layout.instances}
    if labels.get(STRATEGY_LABEL) == "single":
        product = labels.get(PRODUCT_LABEL, "")
        if len(wanted) != 1:
            return False
        ((profile, count),) = wanted.items()
        return product.endswith(f"-MIG-{profile}") and allocatable.get("nvidia.com/gpu", 0) == count
    offered = {
        r[len(MIG_PREFIX) :]: n
        for r, n in allocatable.items()
        if r.startswith(MIG_PREFIX) and n > 0 and not r.endswith(".shared")
    }
    return offered == wanted and allocatable.get("nvidia.com/gpu", 0) == layout.whole_gpus
