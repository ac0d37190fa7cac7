"""The decision: which pool a GpuRequest goes to, or why none can take it.

A pure function of the request, the pool index and the policy. Every pool of the Pod's vendor is
judged; each judgement says why the pool was taken or passed over, so `gpupool explain` and denial
messages can show the user the nearest misses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from sys import getsizeof
from typing import NamedTuple, Protocol, TypeVar

from webhook.admission.quotas import class_quota_problem, memory_quota_problem
from webhook.admission.request import REQUEST_WEIGHT, GpuRequest
from webhook.admission.verdict import Reason
from webhook.domain.affinity import PoolConstraint
from webhook.domain.devices import GPU, KINDS, NOUNS, SHARED
from webhook.domain.model import PREFIX, PoolKey, Taint
from webhook.domain.policy import Policy
from webhook.domain.products import Tokens, format_version, matches, tokens, version_at_least
from webhook.domain.quantity import format_mib
from webhook.pools.index import Group, Inseparable, Pool, PoolIndex
from webhook.pools.nodes import NodeFacts


class Candidate(NamedTuple):
    """A pool the Pod may go to. (A NamedTuple: one is built per matching pool for every decision, and a
    frozen dataclass costs several times more to build.)"""

    pool: PoolKey
    resource: str
    constraint: PoolConstraint  # what sends the Pod to exactly the pool's nodes
    gpu_taints: tuple[Taint, ...]  # to tolerate on the Pod's behalf
    memory_mib: int
    max_free: int  # most free GPUs on one usable node the Pod tolerates
    free_total: int
    fits: bool
    fallback: bool  # of a class the Pod did not ask for
    kind: str = GPU  # the pool's devices: gpu, mig or shared
    groups: tuple[Group, ...] = ()  # the pool's node groups the Pod can reach and tolerates


# What a reason is about: the Pod's requirements a pool can fail. Only CLASS, DEVICE and PRODUCT can be
# changed by one annotation without loosening a rule (webhook.admission.hints); CLASS_RULE is the
# namespace's allowedClasses, which no annotation changes.
PIN, RESOURCE, DEVICE, SHARED_COUNT, CLASS_RULE, CLASS, PRODUCT = (
    "pin", "resource", "device", "shared-count", "class-rule", "class", "product"
)  # fmt: skip
MEMORY, DRIVER, COMPUTE, CUDA, PLACE, TAINTS, SIZE, QUOTA = (
    "memory", "driver", "compute", "cuda", "place", "taints", "size", "quota"
)  # fmt: skip
OTHER_PRODUCT = "other-product"  # a product that shares neither a token nor a family with any asked for
FIXABLE = frozenset((CLASS, DEVICE, PRODUCT))
NEAREST = 3  # pools a "no GPU pool matches" denial describes
# A list of more products is not judged for how near each pool's product is (it would cost a pass over
# every product for every pool, for a list no one writes by hand): each counts as one requirement.
MAX_NEAR_PRODUCTS = 8
MAX_DESCRIBED_CHARS = 300  # of one pool's reasons in a denial (a reason may quote the Pod's own values)


class Miss(NamedTuple):
    """One requirement of the Pod a pool fails: what about, the reason, and how far off, in half
    requirements (2 for one requirement; a product counts each token it lacks, 1 when the pool has a
    token of the same family, as H100 for H20)."""

    kind: str
    text: str
    distance: int = 2


class Rejection(NamedTuple):
    """A pool that cannot take the Pod, and why. (A NamedTuple: one is built per pool for every plan.)"""

    pool: PoolKey
    reasons: tuple[str, ...]
    other_device: bool = False  # a kind or resource the Pod does not take: never among the nearest misses
    distance: int = 2  # how far the pool is from taking the Pod (the sum of its misses' distances)
    fix: str = ""  # CLASS, DEVICE or PRODUCT when every miss is of that one kind (one annotation would do)
    complete: bool = True  # False: judged on its key alone (what placing the Pod needs), see `judged`
    kinds: tuple[str, ...] = ()  # what each reason is about, while it is not complete


def _rejection(pool: PoolKey, misses: list[Miss], other_device: bool = False, *, complete: bool = True) -> Rejection:
    kinds, texts, distances = zip(*misses, strict=True)  # one pass in C: one is built per pool per plan
    if not complete:  # only placing the Pod reads it: how near, and what fixes it, are worked out later
        return Rejection(pool, texts, other_device, 2 * len(misses), "", False, kinds)
    first = kinds[0]
    fix = first if first in FIXABLE and all(k == first for k in kinds) else ""
    return Rejection(pool, texts, other_device, sum(distances), fix)


def _nearness(r: Rejection) -> tuple[bool, int, str, str, str, str]:
    """Nearest first; then PoolKey's own ordering, spelt out: comparing strings is far cheaper than
    comparing dataclasses."""
    return (r.other_device, r.distance, r.pool.vendor, r.pool.gpu_class, r.pool.product, r.pool.resource)


def nearest(rejections: Sequence[Rejection]) -> list[Rejection]:
    """The pools nearest to taking the Pod: of the rejections (sorted nearest first), the first few of
    those as near as the nearest one."""
    if not rejections:
        return []
    first = rejections[0]
    return [r for r in rejections[:NEAREST] if (r.other_device, r.distance) == (first.other_device, first.distance)]


def _describe(rejection: Rejection, all_rejections: Sequence[Rejection]) -> str:
    """`NVIDIA-A100-SXM4-40GB: 40Gi < min-memory 80Gi`; the full pool name when the product is ambiguous."""
    same = sum(r.pool.product == rejection.pool.product for r in all_rejections)
    name = rejection.pool.product if same == 1 else str(rejection.pool)
    reasons = ", ".join(rejection.reasons)
    if len(reasons) > MAX_DESCRIBED_CHARS:
        reasons = reasons[: MAX_DESCRIBED_CHARS - 3] + "..."
    return f"{name}: {reasons}"


class Decision(NamedTuple):
    """Either a chosen candidate (with warnings) or a denial message; plus every judgement made.
    (A NamedTuple, like Candidate: one per admission.)"""

    chosen: Candidate | None
    denial: str
    warnings: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    rejections: tuple[Rejection, ...]
    denial_reason: Reason = ""

    def explain(self) -> tuple[str, ...]:
        lines = []
        for c in self.candidates:
            verdict = "chosen" if c == self.chosen else ("fits" if c.fits else "no capacity")
            note = " (fallback)" if c.fallback else ""
            lines.append(
                f"{c.pool}: {verdict}{note}: {format_mib(c.memory_mib)} per {NOUNS[c.kind]}, "
                f"{c.free_total} free, at most {c.max_free} on one node"
            )
        lines.extend(f"{r.pool}: rejected: {'; '.join(r.reasons)}" for r in self.rejections)
        return tuple(lines)


@dataclass(frozen=True, slots=True)
class _Option:
    """A pool the Pod can go to: its constraint, and the node groups the Pod can reach there and tolerates."""

    pool: PoolKey
    resource: str
    constraint: PoolConstraint
    groups: tuple[Group, ...]
    gpu_taints: tuple[Taint, ...]
    memory_mib: int
    fallback: bool
    kind: str


@dataclass(frozen=True, slots=True)
class _Plan:
    """What does not change while the index's nodes stay as they are: every matching pool, and every
    rejection with its reasons. Only free GPUs are read per decision."""

    options: tuple[_Option, ...]
    rejections: tuple[Rejection, ...]


def decide(req: GpuRequest, index: PoolIndex, policy: Policy, *, quotas: bool = True) -> Decision:
    """The pool for the request, or why none. Without `quotas`, pools are not passed over for the class
    and GPU-memory quotas the namespace uses now (a Pod queued at admission holds nothing yet)."""
    requested = req.classes or req.allowed_classes
    # Keyed by the whole request, the plan's only input besides the nodes: nothing it reads is left out.
    plan = index.memo(req, lambda: _plan(req, index, policy), size=lambda plan: _plan_bytes(req, plan))
    candidates = [_candidate(req, option) for option in plan.options]
    over_quota: list[Rejection] = []

    order = {c: i for i, c in enumerate(req.classes)} if req.classes else {c: policy.class_rank(c) for c in requested}
    kinds = {k: i for i, k in enumerate(req.devices)}

    def rank(c: Candidate) -> tuple[int, int, int, int, int, str]:
        tier = order.get(c.pool.gpu_class, len(order) + policy.class_rank(c.pool.gpu_class))
        device = kinds.get(c.kind, len(kinds))
        # Within a requested class the device kinds come in the Pod's order; with no class asked for,
        # the device order comes first (`mig,gpu` means a MIG instance of any class before a GPU).
        first, second = (tier, device) if req.classes else (device, tier)
        return (int(c.fallback), first, second, c.memory_mib, -c.free_total, c.pool.product)

    candidates.sort(key=rank)
    (quota_note, quota_reason), candidates = (
        _class_quota(req, index, policy, candidates, over_quota) if quotas else (("", ""), candidates)
    )
    primary = [c for c in candidates if not c.fallback]
    chosen = next((c for c in candidates if c.fits), None)
    warnings: list[str] = []
    if chosen is not None:
        if chosen.fallback:
            warnings.append(
                f"gpupool: no free {'/'.join(requested)} GPUs; fell back to class {chosen.pool.gpu_class} "
                f"({chosen.pool.product})"
            )
        return Decision(chosen, "", tuple(warnings), tuple(candidates), (*plan.rejections, *over_quota))
    waiting = primary[0] if primary else (candidates[0] if candidates else None)
    if waiting is None or policy.defaults.on_no_capacity == "deny":
        quota = (quota_note, quota_reason)
        return _denied(req, index, policy, waiting, quota=quota, candidates=candidates, over_quota=over_quota)
    devices = "GPUs" if waiting.kind == GPU else f"{NOUNS[waiting.kind]}s"
    warnings.append(
        f"gpupool: no {waiting.pool.product} node has {req.pod_total} free {devices} now; the Pod will wait"
    )
    return Decision(waiting, "", tuple(warnings), tuple(candidates), (*plan.rejections, *over_quota))


def _denied(
    req: GpuRequest,
    index: PoolIndex,
    policy: Policy,
    waiting: Candidate | None,
    *,
    quota: tuple[str, Reason],
    candidates: list[Candidate],
    over_quota: list[Rejection],
) -> Decision:
    """The denial when no candidate fits (and the policy will not let the Pod wait) or none is left: it
    says what the pools lack, each judged on all the Pod asks (worked out only now)."""
    rejections = (*judged(req, index, policy), *over_quota)
    if waiting is None:
        if quota[0]:
            return Decision(None, quota[0], (), (), rejections, quota[1])
        near = "; ".join(_describe(r, rejections) for r in nearest(rejections))
        near = near or f"the inventory has no {req.vendor.name} GPU pools"
        return Decision(None, f"no GPU pool matches the Pod: {near}", (), (), rejections, "no-match")
    need = f"{req.pod_total} free {waiting.resource} on one node"
    return Decision(
        None,
        f"no capacity: no pool that matches has {need} (best match {waiting.pool}, at most "
        f"{waiting.max_free} free on one node); policy onNoCapacity is deny",
        (),
        tuple(candidates),
        rejections,
        "no-capacity",
    )


def _classes(req: GpuRequest, policy: Policy) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The classes the Pod asks for, and those it may fall back to."""
    requested = req.classes or req.allowed_classes
    top = max(policy.class_rank(c) for c in requested)
    fallback = tuple(c for c in req.allowed_classes if policy.class_rank(c) > top) if req.fallback else ()
    return requested, fallback


def _plan(req: GpuRequest, index: PoolIndex, policy: Policy) -> _Plan:
    requested, fallback_classes = _classes(req, policy)
    options: list[_Option] = []
    rejections: list[Rejection] = []
    for pool in index.pools(req.vendor.name):
        misses = _key_misses(req, pool, requested, fallback_classes)
        if misses:
            rejections.append(_rejection(pool.key, misses, _other_device(req, pool), complete=False))
            continue
        option = _option(req, pool, pool.key.gpu_class in fallback_classes, index)
        if isinstance(option, _Option):
            options.append(option)
        else:
            rejections.append(_rejection(pool.key, option))
    rejections.sort(key=_nearness)
    return _Plan(tuple(options), tuple(rejections))


def _plan_bytes(req: GpuRequest, plan: _Plan) -> int:
    """What a plan's memo entry holds: its request (REQUEST_WEIGHT times the shape it is read from, whose
    strings it keeps), each option (its own tuples; its pool, selector and groups are the index's) and
    each rejection's reasons. An estimate at or above what they hold (tests/pools/test_memo.py)."""
    return REQUEST_WEIGHT * req.shape_bytes + _OPTION_BYTES * len(plan.options) + _rejections_bytes(plan.rejections)


def _rejections_bytes(rejections: Sequence[Rejection]) -> int:
    """What rejections hold: each its tuples (itself, its reasons, what they are about) and its reasons'
    strings; its pool is the index's."""
    return sum(_REJECTION_BYTES + sum(map(getsizeof, r.reasons)) for r in rejections)


# A rejection's own tuples: 7 fields, and two of up to 7 reasons and kinds (96 + 2 x 96 bytes).
_OPTION_BYTES, _REJECTION_BYTES = 512, 320


def judged(req: GpuRequest, index: PoolIndex, policy: Policy) -> tuple[Rejection, ...]:
    """Every pool that cannot take the Pod, nearest first, each with all it lacks: for a pool its key
    rules out (class, device, product), also what its nodes have alike (memory, driver, compute
    capability, CUDA, taints, size; no node is walked, no constraint worked out), and how near its product
    is to the one asked for. What a denial shows and a hint (webhook.admission.hints) starts from; worked
    out only for denials, since placing a Pod needs none of it, and remembered per request until a node
    changes."""
    return index.memo(
        ("judged", req),
        lambda: _judged(req, index, policy),
        size=lambda judged: REQUEST_WEIGHT * req.shape_bytes + _rejections_bytes(judged),
    )


def _judged(req: GpuRequest, index: PoolIndex, policy: Policy) -> tuple[Rejection, ...]:
    plan: _Plan = index.memo(req, lambda: _plan(req, index, policy), size=lambda plan: _plan_bytes(req, plan))
    pools = {pool.key: pool for pool in index.pools(req.vendor.name)}
    queries = _with_families(req.products) if len(req.products) <= MAX_NEAR_PRODUCTS else ()  # once per request
    rejections = []
    for r in plan.rejections:
        if r.complete or r.pool not in pools:
            rejections.append(r)
            continue
        pool = pools[r.pool]
        misses = [Miss(kind, text) for kind, text in zip(r.kinds, r.reasons, strict=True)]
        for i, miss in enumerate(misses):
            if miss.kind == PRODUCT and queries:
                distance, related = _product_nearness(queries, tokens(pool.key.product, req.vendor.product_prefixes))
                misses[i] = Miss(PRODUCT if related else OTHER_PRODUCT, miss.text, distance)
        misses += _fit_misses(req, index.memo(("alike", pool.key), partial(_alike, pool)))[1]
        rejections.append(_rejection(pool.key, misses, r.other_device))
    rejections.sort(key=_nearness)
    return tuple(rejections)


def _key_misses(req: GpuRequest, pool: Pool, requested: tuple[str, ...], fallback: tuple[str, ...]) -> list[Miss]:
    """Why the pool cannot take the Pod, from its key alone."""
    misses = _pool_misses(req, pool.key, pool.kind, requested, fallback, devices=req.devices)
    if not misses and pool.kind == SHARED and req.count > 1:  # in a list of devices: skipped
        text = f"a shared replica is not a GPU: {PREFIX}gpu-count {req.count} needs gpu or mig"
        misses = [Miss(SHARED_COUNT, text)]
    return misses


def _other_device(req: GpuRequest, pool: Pool) -> bool:
    """A kind or resource the Pod does not take: never among the nearest misses."""
    return pool.kind not in req.devices or bool(req.resource and pool.resource != req.resource)


def _pool_misses(
    req: GpuRequest,
    key: PoolKey,
    kind: str,
    requested: tuple[str, ...],
    fallback: tuple[str, ...],
    *,
    devices: tuple[str, ...],
) -> list[Miss]:
    """Why a pool (of devices of `kind`) cannot take the Pod at all, from its key alone (not counting its
    nodes or capacity); empty when it can. (How near a product that does not match is, `judged` works
    out: placing the Pod does not need it.)"""
    misses = []
    if req.pool_pin is not None and req.pool_pin != key:
        misses.append(Miss(PIN, f"{PREFIX}pool pins {req.pool_pin}"))
    resource = key.resource or req.vendor.resource
    if req.resource and resource != req.resource:
        misses.append(Miss(RESOURCE, f"its devices are {resource}, the Pod requests {req.resource}"))
    elif kind not in devices:
        misses.append(Miss(DEVICE, f"device {kind} not in {','.join(devices)} ({req.device_source})"))
    if key.gpu_class not in req.allowed_classes:
        misses.append(Miss(CLASS_RULE, f"class {key.gpu_class} is not allowed in namespace {req.namespace}"))
    elif key.gpu_class not in requested and key.gpu_class not in fallback:
        misses.append(Miss(CLASS, f"class {key.gpu_class} not in {'/'.join(requested)} ({req.class_source})"))
    if req.products:
        product = tokens(key.product, req.vendor.product_prefixes)
        if not any(matches(q, product) for q in req.products):
            text = f"product {key.product} does not match {PREFIX}gpu-product {req.product_text}"
            misses.append(Miss(PRODUCT, text))
    return misses


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def product_distance(queries: tuple[Tokens, ...], product: Tokens) -> int:
    """How far a product is from one a query matches (the nearest query), in half tokens: 2 for each
    query token it lacks, 1 when it has a token of the same family (the same leading letters: `h100` for
    `h20`, `a100` for `a10`); at least 1 (every token there, but out of order). Linear in the tokens."""
    return _product_nearness(_with_families(queries), product)[0]


_Families = tuple[tuple[tuple[str, str], ...], ...]  # per query, each token with its family


def _with_families(queries: tuple[Tokens, ...]) -> _Families:
    return tuple(tuple((t, _family(t)) for t in q) for q in queries)


def _product_nearness(queries: _Families, product: Tokens) -> tuple[int, bool]:
    """The product's distance (`product_distance`), and whether it is related to one asked for: it has a
    token, or a token of the family, of some query (an H100 for `H20`, an A100-40GB for `A100-80GB`; not
    an RTX 3060 for `H20`)."""
    have = set(product)
    families = {f for p in product if (f := _family(p))}
    distances = [(sum(1 if f in families else 2 for t, f in q if t not in have), len(q)) for q in queries]
    related = any(d < 2 * n for d, n in distances)
    return max(1, min((d for d, _ in distances), default=2)), related


def _family(token: str) -> str:
    """A product token's leading letters (`h` of `h100`, `rtx`, `mi` of `mi300x`); "" for `3060` or `80gb`.
    (Tokens are lower case.)"""
    return token[: len(token) - len(token.lstrip(_LETTERS))]


def _option(req: GpuRequest, pool: Pool, fallback: bool, index: PoolIndex) -> _Option | list[Miss]:
    """The pool as the Pod can use it (its constraint and the node groups the Pod reaches and tolerates),
    or why it cannot."""
    place = _place(req, pool, index)
    if not isinstance(place, tuple):
        return [Miss(PLACE, place)]
    constraint, groups = place
    tolerated, misses = _fit_misses(req, groups)
    if misses:
        return misses
    return _Option(
        pool=pool.key,
        resource=pool.resource,
        constraint=constraint,
        groups=tuple(tolerated),
        gpu_taints=tuple(sorted({t for g in tolerated for t in g.gpu_taints}, key=lambda t: (t.key, t.effect))),
        memory_mib=min(g.min_memory_mib() for g in tolerated),
        fallback=fallback,
        kind=pool.kind,
    )


def _place(req: GpuRequest, pool: Pool, index: PoolIndex) -> tuple[PoolConstraint, tuple[Group, ...]] | str:
    """The pool's constraint and its node groups the Pod's own nodeSelector and node affinity reach, or
    why the Pod cannot get there at all."""
    constraint = index.constraint(pool.key)
    if isinstance(constraint, Inseparable):
        return constraint.reason
    # The Pod's own nodeSelector pins those labels on every node it reaches: they must satisfy the pool's.
    pinned = dict(req.node_selector)
    clash = [f"nodeSelector {k}={pinned[k]}" for k, v in constraint.selector if k in pinned and pinned[k] != v]
    clash += [
        f"nodeSelector {r.key}={pinned[r.key]}"
        for r in constraint.expressions
        if r.key in pinned and not r.matches(pinned)
    ]
    if clash:
        return f"{', '.join(clash)} excludes it"
    groups = pool.ordered()
    if req.requirements.terms is not None or len(req.requirements.selector) > len(_pinned(req, constraint)):
        reached = _reached(req, pool, index)
        if not reached:
            return _unreached(req, pool, index)
        groups = tuple(g for g in groups if g in reached)
    if not groups:
        return "no nodes"
    return constraint, groups


class _Judged(Protocol):
    """What judging a Pod's requirements reads of nodes alike: a Group, or several merged (_Alike)."""

    @property
    def other_taints(self) -> tuple[Taint, ...]: ...
    def min_memory_mib(self) -> int: ...
    def min_driver(self) -> tuple[int, ...] | None: ...
    def min_compute(self) -> tuple[int, ...] | None: ...
    def min_cuda(self) -> tuple[int, ...] | None: ...
    def largest_node(self) -> int: ...


@dataclass(frozen=True, slots=True)
class _Alike:
    """A pool's groups that carry the same other taints, merged: what the requirements of a Pod the pool
    is passed over for anyway are judged on (one per taint set, remembered until a node changes)."""

    other_taints: tuple[Taint, ...]
    memory: int
    driver: tuple[int, ...] | None
    compute: tuple[int, ...] | None
    cuda: tuple[int, ...] | None
    largest: int

    def min_memory_mib(self) -> int:
        return self.memory

    def min_driver(self) -> tuple[int, ...] | None:
        return self.driver

    def min_compute(self) -> tuple[int, ...] | None:
        return self.compute

    def min_cuda(self) -> tuple[int, ...] | None:
        return self.cuda

    def largest_node(self) -> int:
        return self.largest


def _alike(pool: Pool) -> tuple[_Alike, ...]:
    by_taints: dict[tuple[Taint, ...], list[Group]] = {}
    for g in pool.ordered():
        by_taints.setdefault(g.other_taints, []).append(g)
    return tuple(
        _Alike(
            other_taints=taints,
            memory=min(g.min_memory_mib() for g in groups),
            driver=_least([g.min_driver() for g in groups]),
            compute=_least([g.min_compute() for g in groups]),
            cuda=_least([g.min_cuda() for g in groups]),
            largest=max(g.largest_node() for g in groups),
        )
        for taints, groups in by_taints.items()
    )


def _least(versions: list[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    """The oldest version; None when any is unknown (as Group.min_driver says it)."""
    return None if any(v is None for v in versions) else min(v for v in versions if v is not None)


J = TypeVar("J", bound=_Judged)


def _fit_misses(req: GpuRequest, groups: Sequence[J]) -> tuple[list[J], list[Miss]]:
    """The groups the Pod tolerates, and every requirement their nodes fail: taints, memory, driver,
    compute capability, CUDA, size. (Judged on all `groups` when the Pod tolerates none.)"""
    if not groups:
        return [], []
    misses = []
    tolerated = [g for g in groups if all(req.tolerations.tolerates(t) for t in g.other_taints)]
    if not tolerated:
        taints = {
            f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
            for g in groups
            for t in g.other_taints
        }
        misses.append(Miss(TAINTS, f"every node has taints the Pod does not tolerate: {', '.join(sorted(taints))}"))
    # The scheduler may pick any node the constraint reaches that the Pod tolerates: each must hold.
    judged = tolerated or list(groups)
    misses += _group_misses(req, judged)
    largest = max(g.largest_node() for g in judged)
    if largest < req.pod_total:
        misses.append(Miss(SIZE, f"no node has {req.pod_total} GPUs (the largest has {largest})"))
    return tolerated, misses


def _pinned(req: GpuRequest, constraint: PoolConstraint) -> list[tuple[str, str]]:
    """The Pod's nodeSelector entries the pool's constraint already says (they narrow nothing)."""
    return [(k, v) for k, v in req.node_selector if (k, v) in constraint.selector]


def _reached(req: GpuRequest, pool: Pool, index: PoolIndex) -> set[Group]:
    """The pool's node groups with a node the Pod's own nodeSelector and node affinity let it run on."""
    requirements = req.requirements
    reached: set[Group] = set()
    for group in pool.ordered():
        for name in group.nodes:
            node = index.node(name)
            if node is not None and requirements.matches(name, node.labels):
                reached.add(group)
                break
    return reached


def _unreached(req: GpuRequest, pool: Pool, index: PoolIndex) -> str:
    """Why the Pod's own constraints reach no node of the pool: the nodeSelector entries no node of it
    has, else its node affinity."""
    labels = [node.labels for g in pool.ordered() for name in g.nodes if (node := index.node(name)) is not None]
    missing = [f"nodeSelector {k}={v}" for k, v in req.node_selector if all(n.get(k) != v for n in labels)]
    if missing:
        return f"{', '.join(missing)} excludes it"
    if not any(all(n.get(k) == v for k, v in req.node_selector) for n in labels):
        return "the Pod's nodeSelector excludes every node of the pool"
    return "the Pod's required node affinity excludes every node of the pool"


def _candidate(req: GpuRequest, o: _Option) -> Candidate:
    """The pool's candidacy with its free GPUs read now."""
    max_free = max(g.max_free() for g in o.groups)
    return Candidate(
        o.pool,
        o.resource,
        o.constraint,
        o.gpu_taints,
        o.memory_mib,
        max_free,
        sum(g.free_total for g in o.groups),
        max_free >= req.pod_total,
        o.fallback,
        o.kind,
        o.groups,
    )


def _group_misses(req: GpuRequest, groups: Sequence[_Judged]) -> list[Miss]:
    """Memory, driver, compute capability and CUDA must hold on every node the selector can reach, since
    the scheduler may pick any: each one that does not. (Only what the Pod asks for is read.)"""
    misses = []
    if req.min_memory_mib:
        memory = min(g.min_memory_mib() for g in groups)
        if memory < req.min_memory_mib:
            have = format_mib(memory) if memory else "unknown memory"
            misses.append(Miss(MEMORY, f"{have} < min-memory {format_mib(req.min_memory_mib)}"))
    for need, kind, name, what, unknown in (
        (req.min_driver, DRIVER, "min-driver", "driver", "driver version"),
        (req.min_compute, COMPUTE, "min-compute-capability", "compute capability", "compute capability"),
        (req.min_cuda, CUDA, "min-cuda", "CUDA", "CUDA version"),
    ):
        if need is None:
            continue
        versions = [_VERSIONS[kind](g) for g in groups]
        if any(v is None for v in versions):
            misses.append(Miss(kind, f"{unknown} unknown on some nodes ({name} {format_version(need)})"))
            continue
        oldest = min(v for v in versions if v is not None)
        if not version_at_least(oldest, need):
            misses.append(Miss(kind, f"{what} {format_version(oldest)} < {name} {format_version(need)}"))
    return misses


_VERSIONS: dict[str, Callable[[_Judged], tuple[int, ...] | None]] = {
    DRIVER: lambda g: g.min_driver(),
    COMPUTE: lambda g: g.min_compute(),
    CUDA: lambda g: g.min_cuda(),
}


def _class_quota(
    req: GpuRequest, index: PoolIndex, policy: Policy, candidates: list[Candidate], rejections: list[Rejection]
) -> tuple[tuple[str, Reason], list[Candidate]]:
    """Drop candidates whose class would exceed the namespace's per-class quota, or whose GPUs its GPU
    memory quota (each one is added to `rejections`, saying so); the first note, and why, is the denial
    when none is left."""
    rule = policy.namespace(req.namespace)
    if not rule.class_quota and rule.memory_quota_mib is None:
        return ("", ""), candidates
    kept, notes = [], []
    for c in candidates:
        note = pool_quota_problem(req, c.pool, index, policy)
        if note[0]:
            notes.append(note)
            rejections.append(Rejection(c.pool, (note[0],)))
        else:
            kept.append(c)
    return (notes[0] if notes else ("", "")), kept


def pool_quota_problem(req: GpuRequest, pool: PoolKey, index: PoolIndex, policy: Policy) -> tuple[str, Reason]:
    """Why placing the request in `pool` would exceed the namespace's per-class or GPU-memory quota, and
    which one; ("", "") when it would not."""
    note = class_quota_problem(req.namespace, pool.gpu_class, req.pod_total, index, policy)
    if note:
        return note, "class-quota"
    note = memory_quota_problem(
        req.namespace, req.pod_total, index.pool_memory_mib(pool), index, policy, where=str(pool)
    )
    return (note, "memory-quota") if note else ("", "")


def bound_problem(req: GpuRequest, facts: NodeFacts) -> str:
    """Why a Pod that names its node breaks its namespace's rules or its own annotations there ("" when
    it does not). A namespace's default class is only a default: any allowed class may be named."""
    requested = req.classes if req.class_source == "annotation" else req.allowed_classes
    # Likewise the namespace's device default: a Pod on a node may use what the node offers.
    devices = req.devices if req.device_source == "annotation" else KINDS
    reasons = [m.text for m in _pool_misses(req, facts.pool, facts.kind, requested, (), devices=devices)]
    if req.min_memory_mib and facts.memory_mib < req.min_memory_mib:
        have = format_mib(facts.memory_mib) if facts.memory_mib else "unknown memory"
        reasons.append(f"{have} < min-memory {format_mib(req.min_memory_mib)}")
    for need, name, what, have_version in (
        (req.min_driver, "min-driver", "driver", facts.driver),
        (req.min_compute, "min-compute-capability", "compute capability", facts.compute),
        (req.min_cuda, "min-cuda", "CUDA", facts.cuda),
    ):
        if need is not None and (have_version is None or not version_at_least(have_version, need)):
            have = format_version(have_version) if have_version else "unknown"
            reasons.append(f"{what} {have} < {name} {format_version(need)}")
    return f"node {facts.node} is in pool {facts.pool}: {'; '.join(reasons)}" if reasons else ""
