"""What a patch does to a Pod, piece by piece: each RFC 6902 op with what it adds (or takes away).

The patch builders (webhook.admission.patch) make a `PodPatch`, and everything else reads it rather than
its JSON: the answer sends its `ops`; validation (webhook.admission.validation) names the pieces a
stored Pod still lacks; and `patched_info` applies the pieces to the Pod as the pool index counts it,
so what the queue's index believes of a released Pod is the very patch sent, never rebuilt beside it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, NamedTuple

from webhook.domain.affinity import Entries, NodeRequirements, Requirement, Term
from webhook.domain.model import POOL_ANNOTATION, PodInfo, Toleration, Tolerations

Op = dict[str, Any]
NEW_TERM = -1  # the term a patch adds to a Pod that requires no node affinity


class SelectorAdded(NamedTuple):
    """nodeSelector entries (the whole map, when the Pod has none)."""

    entries: Entries
    op: Op


class RequirementsAdded(NamedTuple):
    """Node-affinity requirements ANDed into one term of the Pod's (`term`), or its one new term (NEW_TERM)."""

    requirements: tuple[Requirement, ...]
    term: int
    op: Op


class TolerationsAdded(NamedTuple):
    """Tolerations (the whole list, when the Pod has none)."""

    tolerations: tuple[Toleration, ...]
    op: Op


class ResourcesAdded(NamedTuple):
    """Device limits or requests of one container: (resource, count) entries."""

    container: int
    name: str  # the container's
    part: Literal["limits", "requests"]
    entries: Entries
    op: Op


class AnnotationsAdded(NamedTuple):
    """Annotations (the whole map, when the Pod has none)."""

    entries: Entries
    op: Op


class GateAdded(NamedTuple):
    """A scheduling gate."""

    name: str
    op: Op


class GateRemoved(NamedTuple):
    """A scheduling gate taken away."""

    name: str
    op: Op


class VersionPinned(NamedTuple):
    """The resourceVersion the patch was decided on: kube-apiserver's precondition (409 when stale)."""

    resource_version: str
    op: Op


Piece = (
    SelectorAdded
    | RequirementsAdded
    | TolerationsAdded
    | ResourcesAdded
    | AnnotationsAdded
    | GateAdded
    | GateRemoved
    | VersionPinned
)


class PodPatch:
    """A patch: its pieces in order, and their ops (the RFC 6902 patch sent). Immutable by convention, as
    its parts are; equal to another with equal pieces. (A plain class: one is built per patch worked out,
    and a frozen dataclass costs several times more to build.)"""

    __slots__ = ("ops", "pieces")

    def __init__(self, pieces: tuple[Piece, ...] = ()) -> None:
        self.pieces = pieces
        self.ops: tuple[Op, ...] = tuple([p.op for p in pieces])

    def __bool__(self) -> bool:
        return bool(self.pieces)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PodPatch) and self.pieces == other.pieces

    def __hash__(self) -> int:  # its ops are dicts: hashed by their paths, which equal patches share
        return hash(tuple(op["path"] for op in self.ops))

    def __repr__(self) -> str:
        return f"PodPatch({self.pieces!r})"


NO_PATCH = PodPatch()


def patched_info(info: PodInfo, patch: PodPatch) -> PodInfo:
    """The Pod as the index counts it once `patch` is applied: its nodeSelector, node-affinity terms,
    tolerations, gpupool.io/pool and scheduling gates as the pieces leave them. Only for a patch of a Pod
    that exists (the queue's release): Kubernetes allows no change to its resources, so a patch that sets
    them is refused (ValueError)."""
    selector = dict(info.node_selector)
    terms = info.requirements.terms
    tolerations = list(info.tolerations.items if info.tolerations is not None else ())
    pool = info.pool
    gates = list(info.gates)
    for piece in patch.pieces:
        if isinstance(piece, SelectorAdded):
            selector.update(piece.entries)
        elif isinstance(piece, RequirementsAdded):
            terms = _with_requirements(terms, piece)
        elif isinstance(piece, TolerationsAdded):
            tolerations.extend(piece.tolerations)
        elif isinstance(piece, AnnotationsAdded):
            pool = dict(piece.entries).get(POOL_ANNOTATION, pool)
        elif isinstance(piece, GateAdded):
            gates.append(piece.name)
        elif isinstance(piece, GateRemoved):
            gates.remove(piece.name)
        elif isinstance(piece, ResourcesAdded):
            raise ValueError(f"a patch of an existing Pod cannot set the {piece.part} of container {piece.name}")
    return replace(
        info,
        pool=pool,
        node_selector=selector,
        requirements=NodeRequirements(tuple(sorted(selector.items())), terms),
        tolerations=Tolerations(tuple(tolerations)),
        gates=tuple(gates),
    )


def _with_requirements(terms: tuple[Term, ...] | None, piece: RequirementsAdded) -> tuple[Term, ...]:
    if piece.term == NEW_TERM:
        return (Term(piece.requirements),)
    listed = list(terms or ())
    term = listed[piece.term]
    listed[piece.term] = term._replace(expressions=(*term.expressions, *piece.requirements))
    return tuple(listed)
