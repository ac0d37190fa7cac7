"""Denials that say how to fix them: the one annotation value that would place the Pod now.

When no pool takes a Pod, some of the pools the decision (webhook.admission.decision) passed over may
fail only on what one annotation says: a class the namespace allows that the Pod did not ask for, a
device kind it did not list, another product. For the nearest of those, the Pod's request is read again
with that one annotation changed (`gpupool.io/gpu-class`, `gpupool.io/fallback`, `gpupool.io/device`,
`gpupool.io/gpu-product`) and decided as its admission would be, by the one decision
(webhook.admission.choice): the plan, its workload group, every quota. A value is named only when it
places the Pod now, on a node with room for it. Each alternative is decided under the same rules, so a
hint never names a class the namespace does not allow, nor goes over a quota; the Pod's count, memory,
driver, compute capability and CUDA are its needs, never changed.

Bounded, as a denial may be asked for thousands of times a second: at most MAX_TRIES alternatives, their
requests read once per Pod shape (one entry of the shape memo), each decided with one plan lookup (the
index's memo, keyed by the whole request), and none for a request that lists more than
MAX_NEAR_PRODUCTS products or a Pod too large for the shape memo to keep its alternatives. Free GPUs,
groups and quotas are read at every denial, as for every admission.
"""

from __future__ import annotations

from typing import NamedTuple

from webhook.admission.choice import ADMIT, QUEUE, QUOTA_DENIALS, Choice, choose, quota_stop
from webhook.admission.decision import judged
from webhook.admission.device_request import DEVICE
from webhook.admission.misses import CLASS as CLASS_MISS
from webhook.admission.misses import DEVICE as DEVICE_MISS
from webhook.admission.misses import MAX_NEAR_PRODUCTS, Rejection
from webhook.admission.misses import PRODUCT as PRODUCT_MISS
from webhook.admission.pod import PodShape, PodView
from webhook.admission.request import (
    CLASS,
    FALLBACK,
    PRODUCT,
    REQUEST_WEIGHT,
    GpuRequest,
    RequestError,
    parse_request,
)
from webhook.domain.devices import NOUNS, device_kind
from webhook.domain.model import PREFIX, PoolKey
from webhook.domain.policy import Policy
from webhook.domain.products import without_prefixes
from webhook.domain.quantity import format_mib
from webhook.pools.index import PoolIndex
from webhook.pools.memo import ENTRY_SHARE, MEMO_BYTES, NO_MEMO, Memo

MAX_TRIES = 4  # alternative requests decided per denial
MAX_HINTS = 2  # of those, named in the message (besides the fallback)
# A denial with its hints stays within this (the server cuts messages at 2048 characters, so the hints
# at the end are never cut off).
MAX_MESSAGE_CHARS = 1536
HINTED = ("no-match", "no-capacity", "class-quota", "memory-quota", "group")  # denials a hint can fix
MAX_WEIGHT = MEMO_BYTES // ENTRY_SHARE  # the heaviest entry the shape memo keeps


class Alternative(NamedTuple):
    """One annotation (without the prefix) set to another value."""

    key: str
    value: str

    @property
    def setting(self) -> str:
        return f"{PREFIX}{self.key}: {self.value}"


def hinted(
    choice: Choice,
    req: GpuRequest,
    view: PodView,
    index: PoolIndex,
    policy: Policy,
    *,
    shapes: Memo = NO_MEMO,
) -> str:
    """The choice's denial, followed by the annotation values that would place the Pod now (if any),
    or else the first value only a quota stops now, with the quota's denial. Each value is decided in the
    choice's mode: for a Pod queued at admission (QUEUE, policy `placement: queue`), a value is named when
    it would queue the Pod: some pool matches it within every quota's hard limit."""
    # A long list of products gets none: each value decided would be a plan over all of them (a hostile
    # list of 100 costs a millisecond a plan), and no one writes such a list by hand. Nor does a Pod too
    # large for the requests of its values to be remembered: they would be read again at every denial.
    if (
        choice.reason not in HINTED
        or len(req.products) > MAX_NEAR_PRODUCTS
        or _weight(req.shape_bytes, MAX_TRIES) > MAX_WEIGHT
    ):
        return choice.denial
    found: list[tuple[Alternative, Outcome]] = []
    stopped: tuple[Alternative, Outcome] | None = None  # the first value a quota alone stops now
    tried = alternatives(judged(req, index, policy), req, policy)
    for alt, again in zip(tried, _reread(view.shape, req.shape_bytes, policy, tried, shapes), strict=True):
        # (The fallback reaches a class stopped alike; a Pod a quota stops already learns nothing from
        # another value a quota stops.)
        wanted = stopped is None and alt.key != FALLBACK and choice.reason not in QUOTA_DENIALS
        outcome = _outcome(again, view, index, policy, queued=choice.mode.kind == "queue", stopped=wanted)
        # (A class named that falls back to another is not what the hint would say.)
        if outcome is None or (alt.key == CLASS and outcome.pool.gpu_class != alt.value):
            continue
        if not outcome.stopped_by:
            found.append((alt, outcome))
            if sum(a.key != FALLBACK for a, _ in found) == MAX_HINTS:  # the fallback goes in parentheses
                break
        else:
            stopped = (alt, outcome)
    hint = _say(found, req) or (_say_stopped(*stopped, req) if stopped else "")
    if not hint:
        return choice.denial
    room = MAX_MESSAGE_CHARS - len(hint) - 2
    denial = choice.denial if len(choice.denial) <= room else choice.denial[: room - 3] + "..."
    return f"{denial}. {hint}"


def alternatives(rejections: tuple[Rejection, ...], req: GpuRequest, policy: Policy) -> list[Alternative]:
    """The values worth deciding again with: for each pool (`judged`, nearest first) passed over only
    for its class (one the namespace allows), only for its device kind or only for its product, the value
    that makes it a candidate. Classes first, more capable ones first and the nearest of those first (with
    `fallback: true` after the first one), then less capable ones; then devices, nearest pool first; then
    products related to one asked for (a token or a family in common: H100 or H200 for an H20, never an
    RTX 3060), only as near as the nearest of them. At most MAX_TRIES."""
    top = max(policy.class_rank(c) for c in req.classes or req.allowed_classes)
    classes: set[str] = set()
    found: dict[str, list[Alternative]] = {DEVICE: [], PRODUCT: []}
    product_distance = 0  # of the nearest pool that lacks only its product
    for r in rejections:
        if r.fix == CLASS_MISS:
            classes.add(r.pool.gpu_class)
        elif r.fix == DEVICE_MISS:
            found[DEVICE].append(Alternative(DEVICE, device_kind(r.pool.product)))
        elif r.fix == PRODUCT_MISS and r.distance == (product_distance or r.distance):
            product_distance = r.distance
            found[PRODUCT].append(Alternative(PRODUCT, without_prefixes(r.pool.product, req.vendor.product_prefixes)))
    ranked = sorted(classes, key=lambda c: (policy.class_rank(c) < top, abs(policy.class_rank(c) - top)))
    tried = [Alternative(CLASS, c) for c in ranked]
    if ranked and policy.class_rank(ranked[0]) > top and not req.fallback:
        tried.insert(1, Alternative(FALLBACK, "true"))
    ordered = dict.fromkeys([*tried, *found[DEVICE], *found[PRODUCT]])  # each once, in order
    return list(ordered)[:MAX_TRIES]


def _reread(
    shape: PodShape, shape_bytes: int, policy: Policy, tried: list[Alternative], shapes: Memo
) -> tuple[GpuRequest | None, ...]:
    """The requests of the Pod with each one annotation changed (None where that is refused). They
    depend on the shape and the policy alone, so the shape memo keeps them: one entry per denied shape."""
    if not tried:
        return ()
    return shapes.get(
        ("hints", shape, tuple(tried)),
        lambda: tuple(_parsed(shape, policy, alt) for alt in tried),
        size=lambda requests: _weight(shape_bytes, len(requests)),
    )


def _weight(shape_bytes: int, requests: int) -> int:
    """What the memo entry of a shape's `requests` alternatives holds: each request mirrors the shape
    (REQUEST_WEIGHT times it, as webhook.admission.core weighs one), with one value changed (at most
    _VALUE_BYTES more); the key is the shape, which the shape memo holds anyway."""
    return requests * (REQUEST_WEIGHT * shape_bytes + _VALUE_BYTES)


_VALUE_BYTES = 1024  # a value named (at most a product's name, 63 characters) and its tokens, in a request


def _parsed(shape: PodShape, policy: Policy, alt: Alternative) -> GpuRequest | None:
    name = PREFIX + alt.key
    annotations = (*((k, v) for k, v in shape.annotations or () if k != name), (name, alt.value))
    try:
        return parse_request(shape._replace(annotations=annotations), policy)
    except RequestError:
        return None


class Outcome(NamedTuple):
    """What an alternative request gets: the pool it goes to, its devices' kind, and the denial of the
    quota that stops it there now ("" when it is placed now)."""

    pool: PoolKey
    kind: str
    stopped_by: str = ""


def _outcome(
    req: GpuRequest | None, pod: PodView, index: PoolIndex, policy: Policy, *, queued: bool, stopped: bool
) -> Outcome | None:
    """Where the request goes, as its admission would decide it (the one decision, ADMIT or QUEUE), or
    None when it is not placed on a node with room now (nor, when `stopped` is asked for, stopped only by
    what a quota holds now, within its hard limit: webhook.admission.choice.quota_stop). Queued: the
    first pool that matches within every quota's hard limit, as webhook.admission.queued holds a queued
    Pod to."""
    if req is None:
        return None
    if queued:
        chosen = choose(req, pod, index, policy, QUEUE).chosen
        return Outcome(chosen.pool, chosen.kind) if chosen is not None else None
    choice = choose(req, pod, index, policy, ADMIT)
    chosen = choice.chosen
    if chosen is not None:
        return Outcome(chosen.pool, chosen.kind) if chosen.fits else None
    stop = quota_stop(choice, req, index, policy) if stopped else None
    return Outcome(stop.pool, stop.kind, stop.denial) if stop is not None else None


def _say(found: list[tuple[Alternative, Outcome]], req: GpuRequest) -> str:
    """`class high fits 2 x 40Gi and team-a allows it: set gpupool.io/gpu-class: high`, and the next one.
    The fallback reaches a class: in parentheses after that class's own hint, if there is one."""
    said: list[str] = []
    classes: dict[str, int] = {}  # a class named, and where
    for alt, got in sorted(found, key=lambda found: found[0].key == FALLBACK):
        what = _what(req, got.kind)
        where = got.pool.gpu_class
        if alt.key == FALLBACK and where in classes:
            said[classes[where]] += f" (or {alt.setting})"
        elif alt.key == FALLBACK:
            said.append(f"class {where} fits {what} and {req.namespace} allows it as a fallback: set {alt.setting}")
        elif alt.key == CLASS:
            classes[where] = len(said)
            said.append(f"class {where} fits {what} and {req.namespace} allows it: set {alt.setting}")
        else:
            said.append(f"{got.pool.product} fits {what}: set {alt.setting}")
    return "; or ".join(said)


def _say_stopped(alt: Alternative, got: Outcome, req: GpuRequest) -> str:
    """`class high fits 2 x 40Gi and team-a allows it with gpupool.io/gpu-class: high, but not now: ...`:
    the value is the Pod's to set, the quota is what stops it (never worded as a fix to set now)."""
    what = _what(req, got.kind)
    if alt.key == CLASS:
        fits = f"class {got.pool.gpu_class} fits {what} and {req.namespace} allows it"
    else:
        fits = f"{got.pool.product} fits {what}"
    return f"{fits} with {alt.setting}, but not now: {got.stopped_by}"


def _what(req: GpuRequest, kind: str) -> str:
    """The Pod's devices as a hint says them: `2 x 40Gi`, `1 MIG instance`."""
    if req.min_memory_mib:
        return f"{req.pod_total} x {format_mib(req.min_memory_mib)}"
    return f"{req.pod_total} {NOUNS[kind]}{'s' if req.pod_total != 1 else ''}"
