"""What a pool lacks for a request: each requirement it fails (a Miss), the rejection they make, how
near that leaves the pool, and the nearest pools a "no GPU pool matches" denial describes.

Pure functions of the request and what a pool's key and nodes say, shared by the decision
(webhook.admission.decision: a pool's key and nodes judged for a plan, every pool judged in full for a
denial), the check of a Pod that names its node (`pool_misses`) and the hints that say how to fix a
denial (webhook.admission.hints: which misses one annotation can change).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar

from webhook.admission.request import GpuRequest
from webhook.domain.devices import SHARED
from webhook.domain.memory import memory_shortfall
from webhook.domain.model import PREFIX, PoolKey, Taint
from webhook.domain.products import Tokens, format_version, matches, tokens, version_at_least
from webhook.pools.index import Group, Pool

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


def rejection(pool: PoolKey, misses: list[Miss], other_device: bool = False, *, complete: bool = True) -> Rejection:
    kinds, texts, distances = zip(*misses, strict=True)  # one pass in C: one is built per pool per plan
    if not complete:  # only placing the Pod reads it: how near, and what fixes it, are worked out later
        return Rejection(pool, texts, other_device, 2 * len(misses), "", False, kinds)
    first = kinds[0]
    fix = first if first in FIXABLE and all(k == first for k in kinds) else ""
    return Rejection(pool, texts, other_device, sum(distances), fix)


def nearness(r: Rejection) -> tuple[bool, int, str, str, str, str]:
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


def describe(rejection: Rejection, all_rejections: Sequence[Rejection]) -> str:
    """`NVIDIA-A100-SXM4-40GB: 40Gi < min-memory 80Gi`; the full pool name when the product is ambiguous."""
    same = sum(r.pool.product == rejection.pool.product for r in all_rejections)
    name = rejection.pool.product if same == 1 else str(rejection.pool)
    reasons = ", ".join(rejection.reasons)
    if len(reasons) > MAX_DESCRIBED_CHARS:
        reasons = reasons[: MAX_DESCRIBED_CHARS - 3] + "..."
    return f"{name}: {reasons}"


def key_misses(req: GpuRequest, pool: Pool, requested: tuple[str, ...], fallback: tuple[str, ...]) -> list[Miss]:
    """Why the pool cannot take the Pod, from its key alone."""
    misses = pool_misses(req, pool.key, pool.kind, requested, fallback, devices=req.devices)
    if not misses and pool.kind == SHARED and req.count > 1:  # in a list of devices: skipped
        text = f"a shared replica is not a GPU: {PREFIX}gpu-count {req.count} needs gpu or mig"
        misses = [Miss(SHARED_COUNT, text)]
    return misses


def other_device(req: GpuRequest, pool: Pool) -> bool:
    """A kind or resource the Pod does not take: never among the nearest misses."""
    return pool.kind not in req.devices or bool(req.resource and pool.resource != req.resource)


def pool_misses(
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
    return product_nearness(with_families(queries), product)[0]


_Families = tuple[tuple[tuple[str, str], ...], ...]  # per query, each token with its family


def with_families(queries: tuple[Tokens, ...]) -> _Families:
    return tuple(tuple((t, _family(t)) for t in q) for q in queries)


def product_nearness(queries: _Families, product: Tokens) -> tuple[int, bool]:
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


class _Judged(Protocol):
    """What judging a Pod's requirements reads of nodes alike: a Group, or several merged (_Alike)."""

    @property
    def other_taints(self) -> tuple[Taint, ...]: ...
    def min_memory_mib(self) -> int: ...
    def min_sold_mib(self) -> int: ...
    def min_offered_mib(self) -> int: ...
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
    sold: int
    offered: int
    driver: tuple[int, ...] | None
    compute: tuple[int, ...] | None
    cuda: tuple[int, ...] | None
    largest: int

    def min_memory_mib(self) -> int:
        return self.memory

    def min_sold_mib(self) -> int:
        return self.sold

    def min_offered_mib(self) -> int:
        return self.offered

    def min_driver(self) -> tuple[int, ...] | None:
        return self.driver

    def min_compute(self) -> tuple[int, ...] | None:
        return self.compute

    def min_cuda(self) -> tuple[int, ...] | None:
        return self.cuda

    def largest_node(self) -> int:
        return self.largest


def alike(pool: Pool) -> tuple[_Alike, ...]:
    by_taints: dict[tuple[Taint, ...], list[Group]] = {}
    for g in pool.ordered():
        by_taints.setdefault(g.other_taints, []).append(g)
    return tuple(
        _Alike(
            other_taints=taints,
            memory=min(g.min_memory_mib() for g in groups),
            sold=min(g.min_sold_mib() for g in groups),
            offered=min(g.min_offered_mib() for g in groups),
            driver=least([g.min_driver() for g in groups]),
            compute=least([g.min_compute() for g in groups]),
            cuda=least([g.min_cuda() for g in groups]),
            largest=max(g.largest_node() for g in groups),
        )
        for taints, groups in by_taints.items()
    )


def least(versions: list[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    """The oldest version; None when any is unknown (as Group.min_driver says it)."""
    return None if any(v is None for v in versions) else min(v for v in versions if v is not None)


J = TypeVar("J", bound=_Judged)


def fit_misses(req: GpuRequest, groups: Sequence[J]) -> tuple[list[J], list[Miss]]:
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


def _group_misses(req: GpuRequest, groups: Sequence[_Judged]) -> list[Miss]:
    """Memory, driver, compute capability and CUDA must hold on every node the selector can reach, since
    the scheduler may pick any: each one that does not. (Only what the Pod asks for is read.)"""
    misses = []
    if req.min_memory_mib:  # judged on the nodes that offer least (webhook.domain.memory)
        offers = min(groups, key=lambda g: g.min_offered_mib())
        short = memory_shortfall(req.min_memory_mib, offers.min_sold_mib(), offers.min_memory_mib())
        if short:
            misses.append(Miss(MEMORY, short))
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
