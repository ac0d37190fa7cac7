"""What a Pod requires of its node, and what gpupool adds so that it reaches exactly one pool's nodes.

kube-scheduler runs a Pod only on a node that has every `nodeSelector` label and satisfies at least one
term of its required node affinity (`requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`):
the terms are ORed, the requirements inside a term are ANDed, and a term with no requirement matches no
node. `NodeRequirements.matches` is that rule (k8s.io/component-helpers/scheduling/corev1/nodeaffinity),
`Requirement.matches` the one for each operator (apimachinery's labels.Requirement), so every part of
gpupool that asks "can this Pod land on that node" asks it the way the scheduler will.

A `PoolConstraint` is what gpupool adds to a Pod to send it to a pool: nodeSelector entries for what is
plain equality, and requirements (`NotIn`, `DoesNotExist`, `In` over several values) that a nodeSelector
cannot say. The requirements are ANDed into every term the Pod already has (the scheduler ORs terms, so a
term left without them would reach other nodes), or form the one term of a Pod that has none: that is
`NodeRequirements.within`, and exactly what the patch writes (webhook.admission.patch) and the queue's
release appends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from webhook.domain.packed import packed

Entries = tuple[tuple[str, str], ...]

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT)
NODE_NAME_FIELD = "metadata.name"  # the one field matchFields may name
HOSTNAME_LABEL = "kubernetes.io/hostname"  # the kubelet labels every node with it
_INT64 = 2**63


class Requirement(NamedTuple):
    """One `matchExpressions` (or `matchFields`) entry. (A NamedTuple: Pods carry several, each read on
    admission, and it is far cheaper to build than a frozen dataclass.)"""

    key: str
    operator: str
    values: Sequence[str] = ()  # a tuple, or a long list as one PackedValues shared by equal lists (packed)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Does a node with these labels satisfy it? `NotIn` and `DoesNotExist` hold where the label is
        absent; `Gt`/`Lt` compare base-10 integers and hold for no label that is not one."""
        op = self.operator
        value = labels.get(self.key)
        if op == IN:
            return value is not None and value in self.values
        if op == NOT_IN:
            return value is None or value not in self.values
        if op == EXISTS:
            return value is not None
        if op == DOES_NOT_EXIST:
            return value is None
        if op in (GT, LT) and value is not None and len(self.values) == 1:
            have, bound = parse_int64(value), parse_int64(self.values[0])
            if have is None or bound is None:
                return False
            return have > bound if op == GT else have < bound
        return False

    def as_json(self) -> dict[str, object]:
        if self.operator in (EXISTS, DOES_NOT_EXIST):
            return {"key": self.key, "operator": self.operator}
        return {"key": self.key, "operator": self.operator, "values": list(self.values)}

    def text(self) -> str:
        """In kubectl's label-selector words: `k in (a,b)`, `k notin (a)`, `k`, `!k`; `k > 5` for Gt."""
        listed = ",".join(self.values)
        return {
            IN: f"{self.key} in ({listed})",
            NOT_IN: f"{self.key} notin ({listed})",
            EXISTS: self.key,
            DOES_NOT_EXIST: f"!{self.key}",
            GT: f"{self.key} > {listed}",
            LT: f"{self.key} < {listed}",
        }.get(self.operator, f"{self.key} {self.operator} ({listed})")


def parse_int64(text: str) -> int | None:
    """A base-10 int64 as Go's strconv.ParseInt reads it (optional sign, ASCII digits, nothing else)."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or len(digits) > 19 or not (digits.isascii() and digits.isdigit()):
        return None
    value = int(text)
    return value if -_INT64 <= value < _INT64 else None


class Term(NamedTuple):
    """One nodeSelectorTerm: its requirements ANDed. A term with none matches no node."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()  # matchFields: on metadata.name, the node's name

    def __bool__(self) -> bool:
        """False for a term with no requirement (it matches no node)."""
        return bool(self.expressions or self.fields)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.expressions and not self.fields:
            return False
        return all(r.matches(labels) for r in self.expressions) and all(
            r.matches({NODE_NAME_FIELD: name}) for r in self.fields
        )

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.expressions:
            out["matchExpressions"] = [r.as_json() for r in self.expressions]
        if self.fields:
            out["matchFields"] = [r.as_json() for r in self.fields]
        return out


class NodeRequirements(NamedTuple):
    """What a Pod requires of its node: its nodeSelector and its required node-affinity terms."""

    selector: Entries = ()
    terms: tuple[Term, ...] | None = None  # None: no required node affinity (any node)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """kube-scheduler's rule: every nodeSelector label, and at least one term."""
        for key, value in self.selector:
            if labels.get(key) != value:
                return False
        return self.terms is None or any(t.matches(name, labels) for t in self.terms)

    @property
    def constrained(self) -> bool:
        """False when any node will do."""
        return bool(self.selector) or self.terms is not None

    def named_nodes(self) -> frozenset[str]:
        """Every node name a term's `metadata.name In` names: nodes it can reach that gpupool may not know."""
        return frozenset(
            v
            for t in self.terms or ()
            for r in t.fields
            if r.key == NODE_NAME_FIELD and r.operator == IN
            for v in r.values
        )

    def within(self, pool: PoolConstraint) -> NodeRequirements:
        """The requirements once `pool` is added as the patch adds it: its nodeSelector entries merged in,
        its requirements appended to every term (leaving out those a term has already and those the Pod's
        own nodeSelector satisfies), or one term of them for a Pod that has none. A term with no
        requirement, which matches no node, is left as it is: requirements would make it match."""
        own = dict(self.selector)
        needed = tuple(r for r in pool.expressions if not (r.key in own and r.matches(own)))
        merged = tuple(sorted({**own, **dict(pool.selector)}.items()))
        if not needed:
            return NodeRequirements(merged, self.terms)
        if self.terms is None:
            return NodeRequirements(merged, (Term(needed),))
        terms = tuple(
            t._replace(expressions=(*t.expressions, *(r for r in needed if r not in t.expressions))) if t else t
            for t in self.terms
        )
        return NodeRequirements(merged, terms)


class PoolConstraint(NamedTuple):
    """What sends a Pod to one pool's nodes: nodeSelector entries and requirements ANDed with them."""

    selector: Entries = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.selector:
            if labels.get(key) != value:
                return False
        return all(r.matches(labels) for r in self.expressions)

    def text(self) -> str:
        """In kubectl's words: `nvidia.com/gpu.product=Tesla-T4, gpu.accelerator/class notin (high,low)`."""
        return ", ".join([*(f"{k}={v}" for k, v in self.selector), *(r.text() for r in self.expressions)])

    def as_json(self) -> dict[str, object]:
        return {
            "nodeSelector": dict(self.selector),
            "matchExpressions": [r.as_json() for r in self.expressions],
        }


# Bounds on what is read of a Pod's node affinity: far more than any real Pod has (the DaemonSet
# controller writes one term of one field), and what keeps a hostile Pod's affinity at microseconds.
# Kubernetes sets none; a Pod past them is refused with a message saying so (docs/policy.md).
MAX_TERMS = 64  # nodeSelectorTerms
MAX_TERM_REQUIREMENTS = 64  # matchExpressions plus matchFields of one term
MAX_VALUES = 256  # values of one requirement

# How much of `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution` a Pod has:
# what a patch must add whole when it adds node-affinity requirements.
NO_AFFINITY, AFFINITY, NODE_AFFINITY, REQUIRED = range(4)


class AffinityError(ValueError):
    """A node-affinity field is not what Kubernetes allows; the message names it and what is accepted."""


class AffinityView(NamedTuple):
    """A Pod's required node affinity as read: how deep the path to it goes (`level`), its terms, and for
    each term whether it has a `matchExpressions` list (else a patch adds the list whole)."""

    level: int = NO_AFFINITY
    terms: tuple[Term, ...] = ()
    listed: tuple[bool, ...] = ()

    @property
    def required(self) -> tuple[Term, ...] | None:
        """The terms, or None when the Pod requires no node affinity."""
        return self.terms if self.level == REQUIRED else None


NO_AFFINITY_VIEW = AffinityView()
NO_REQUIREMENTS = NodeRequirements()
NO_CONSTRAINT = PoolConstraint()
_PATH = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def read_affinity(spec: Mapping[str, object]) -> AffinityView:
    """The Pod's required node affinity, checked as kube-apiserver checks it (operators, values per
    operator, matchFields on metadata.name only) and bounded; AffinityError naming the field."""
    affinity = _object(spec.get("affinity"), "spec.affinity")
    if affinity is None:
        return NO_AFFINITY_VIEW
    node_affinity = _object(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    if node_affinity is None:
        return AffinityView(AFFINITY)
    required = _object(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), _PATH)
    if required is None:
        return AffinityView(NODE_AFFINITY)
    raw_terms = required.get("nodeSelectorTerms")
    if not isinstance(raw_terms, list) or not raw_terms:
        raise AffinityError(f"{_PATH}.nodeSelectorTerms: expected a list of at least one term, as Kubernetes requires")
    if len(raw_terms) > MAX_TERMS:
        raise AffinityError(f"{_PATH}.nodeSelectorTerms: {len(raw_terms)} terms; gpupool reads at most {MAX_TERMS}")
    terms, listed = [], []
    for i, raw in enumerate(raw_terms):
        path = f"{_PATH}.nodeSelectorTerms[{i}]"
        term = _object(raw, path) or {}
        expressions = _requirements(term.get("matchExpressions"), f"{path}.matchExpressions", fields=False)
        fields = _requirements(term.get("matchFields"), f"{path}.matchFields", fields=True)
        if len(expressions) + len(fields) > MAX_TERM_REQUIREMENTS:
            raise AffinityError(
                f"{path}: more than {MAX_TERM_REQUIREMENTS} requirements; gpupool reads at most that many"
            )
        terms.append(Term(expressions, fields))
        listed.append(isinstance(term.get("matchExpressions"), list))
    return AffinityView(REQUIRED, tuple(terms), tuple(listed))


def _object(value: object, path: str) -> Mapping[str, object] | None:
    if value is None or isinstance(value, dict):
        return value
    raise AffinityError(f"{path}: expected an object, got {type(value).__name__}")


def _requirements(value: object, path: str, *, fields: bool) -> tuple[Requirement, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise AffinityError(f"{path}: expected a list of requirements, got {type(value).__name__}")
    if len(value) > MAX_TERM_REQUIREMENTS:
        raise AffinityError(f"{path}: {len(value)} requirements; gpupool reads at most {MAX_TERM_REQUIREMENTS}")
    return tuple(_requirement(item, f"{path}[{i}]", fields=fields) for i, item in enumerate(value))


def _requirement(item: object, path: str, *, fields: bool) -> Requirement:
    raw = _object(item, path) or {}
    key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values")
    if not isinstance(key, str) or not key:
        raise AffinityError(f"{path}.key: expected a label key (a non-empty string)")
    accepted = (IN, NOT_IN) if fields else OPERATORS
    if operator not in accepted:
        raise AffinityError(f"{path}.operator: expected one of {', '.join(accepted)}")
    if fields and key != NODE_NAME_FIELD:
        raise AffinityError(f"{path}.key: matchFields may only name {NODE_NAME_FIELD}")
    if values is None:
        values = []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise AffinityError(f"{path}.values: expected a list of strings")
    if len(values) > MAX_VALUES:
        raise AffinityError(f"{path}.values: {len(values)} values; gpupool reads at most {MAX_VALUES}")
    if operator in (IN, NOT_IN) and not values:
        raise AffinityError(f"{path}.values: {operator} needs at least one value")
    if fields and len(values) != 1:
        raise AffinityError(f"{path}.values: matchFields on {NODE_NAME_FIELD} take exactly one value")
    if operator in (EXISTS, DOES_NOT_EXIST) and values:
        raise AffinityError(f"{path}.values: {operator} takes no values")
    if operator in (GT, LT) and (len(values) != 1 or parse_int64(values[0]) is None):
        raise AffinityError(f"{path}.values: {operator} takes exactly one whole number")
    return Requirement(key, str(operator), packed(tuple(values)))
