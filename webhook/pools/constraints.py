"""The constraints that send a Pod to exactly one pool's nodes: data in, constraints out.

A pool's nodes are "this product and this class", where the class comes from the node's class label or,
without one, from the product table; "whole GPUs" leaves out nodes whose replicas are shared; "usable"
leaves out nodes whose MIG layout is changing or invalid. A nodeSelector can only require labels to be
equal, so gpupool says the rest with node-affinity requirements (webhook.domain.affinity):

1. **What every member's pinning labels share** (the labels webhook.pools.node_devices and nodes use to pin a
   device: its product label, its class label when it has one, the replica count of replicas GFD did not
   suffix): a label all members have with one value is a nodeSelector entry (so simple pools look as they
   always did); one all members have with several values is `In` over them; one only some members have
   (a class label on part of a half-labelled fleet) says nothing yet.
2. **What still reaches other nodes**: every node that offers the pool's resource but is not a member
   (another class of the same product, replicas beside whole GPUs, a MIG layout being changed, an invalid
   class label) and satisfies step 1 is left out by a requirement on the first label, in a fixed order,
   whose value on it no member shares: `NotIn` (for the class label: every other class of the policy and
   the values seen; for the MIG state: every changing state; for the sharing strategy: time-slicing and
   mps), or, for another label no member has at all, `DoesNotExist`.
3. **Checked**: every member satisfies the result and no other node does; a node no label tells apart
   (it differs from a member only in what labels cannot say) makes the pool `Inseparable`, with the
   reason, and no Pod is placed on it.

Step 2 looks only at the nodes gpupool knows now; the result is worked out again whenever a node changes
(webhook.pools.capacity remembers it until then), so each admission gets the constraints of the fleet
it was decided on. The queue's release (a Pod gated at admission) appends the very same requirements.

4. **Excluded nodes.** The queue's leader may keep some of a pool's nodes from new Pods (a node it drains
   for a MIG re-cut, or holds for a Pod that waits long: webhook.queue): those members are left out by
   `kubernetes.io/hostname NotIn [...]`, their hostname labels (the kubelet sets it; a node without one is
   named by its name), added to the pool's requirements and so to every term of the Pod's node affinity
   (kube-scheduler ANDs the requirements of a term and ORs the terms).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from webhook.domain.affinity import DOES_NOT_EXIST, HOSTNAME_LABEL, IN, NOT_IN, PoolConstraint, Requirement
from webhook.domain.model import Selector

Labels = Mapping[str, str]


class Member(NamedTuple):
    """A node of the pool: its labels, and the labels that pin its device (its facts' selector)."""

    name: str
    labels: Labels
    pins: Selector


class Keys(NamedTuple):
    """The labels that may tell a pool's nodes from other nodes of its resource, in the order tried."""

    class_label: str  # its values: the policy's classes
    classes: tuple[str, ...]  # every class of the policy
    gpu_class: str  # the pool's
    order: tuple[str, ...]  # every other label to try, in this order
    exclusive: Mapping[str, tuple[str, ...]]  # for some labels, values to leave out whenever one is (MIG states)


class Inseparable(NamedTuple):
    """No constraint reaches the pool's nodes and no other: the nodes that cannot be left out."""

    nodes: tuple[str, ...]

    @property
    def reason(self) -> str:
        shown = ", ".join(self.nodes[:3]) + (f" and {len(self.nodes) - 3} more" if len(self.nodes) > 3 else "")
        return (
            f"no node label tells its nodes from {shown}, which offer the same resource but are not in the pool "
            "(label the nodes with their class, or the others with a label that tells them apart)"
        )


def pool_constraint(
    members: Sequence[Member],
    others: Iterable[tuple[str, Labels]],
    keys: Keys,
    excluded: Collection[str] = frozenset(),
) -> PoolConstraint | Inseparable:
    """The constraints that reach exactly `members` among `members` and `others` (every other node that
    offers the pool's resource), or why there are none; less the members named in `excluded` (step 4).
    See the module docstring for the rule."""
    found = _reaching(members, others, keys)
    if isinstance(found, Inseparable):
        return found
    return excluding(found, [m for m in members if m.name in excluded])


def excluding(constraint: PoolConstraint, nodes: Sequence[Member]) -> PoolConstraint:
    """`constraint` that no longer reaches `nodes` (step 4): one `kubernetes.io/hostname NotIn` requirement."""
    if not nodes:
        return constraint
    names = tuple(sorted({m.labels.get(HOSTNAME_LABEL, m.name) for m in nodes}))
    return constraint._replace(expressions=(*constraint.expressions, Requirement(HOSTNAME_LABEL, NOT_IN, names)))


def _reaching(
    members: Sequence[Member], others: Iterable[tuple[str, Labels]], keys: Keys
) -> PoolConstraint | Inseparable:
    """Steps 1 to 3."""
    base = _shared(members)
    strays = [(name, labels) for name, labels in others if base.matches(labels)]
    if not strays:
        return base
    left_out: dict[str, set[str]] = {}  # label -> values to leave out
    absent: set[str] = set()  # labels no member has, left out by DoesNotExist
    stuck: list[str] = []
    for name, labels in strays:
        key = _telling_label(labels, members, keys)
        if key is None:
            stuck.append(name)
        elif not any(key in m.labels for m in members) and key != keys.class_label and key not in keys.exclusive:
            absent.add(key)
        else:
            left_out.setdefault(key, set()).add(labels[key])
    if stuck:
        return Inseparable(tuple(sorted(stuck)))
    expressions = list(base.expressions)
    for key in (keys.class_label, *keys.order):
        if key in absent:
            expressions.append(Requirement(key, DOES_NOT_EXIST))
        elif key in left_out:
            member_values = {m.labels[key] for m in members if key in m.labels}
            values = set(left_out[key]) | set(keys.exclusive.get(key, ()))
            if key == keys.class_label:
                values = (values | set(keys.classes)) - {keys.gpu_class}
            expressions.append(Requirement(key, NOT_IN, tuple(sorted(values - member_values))))
    constraint = base._replace(expressions=tuple(expressions))
    missed = [m.name for m in members if not constraint.matches(m.labels)]
    reached = [name for name, labels in strays if constraint.matches(labels)]
    return Inseparable(tuple(sorted(reached or missed))) if reached or missed else constraint


def _shared(members: Sequence[Member]) -> PoolConstraint:
    """Step 1: what every member's pinning labels say alike."""
    pins = [dict(m.pins) for m in members]
    selector: list[tuple[str, str]] = []
    expressions: list[Requirement] = []
    for key in sorted(pins[0]) if pins else ():
        values = {p.get(key) for p in pins}
        if None in values:
            continue  # some members lack it: it cannot be required
        if len(values) == 1:
            selector.append((key, pins[0][key]))
        else:
            expressions.append(Requirement(key, IN, tuple(sorted(v for v in values if v is not None))))
    return PoolConstraint(tuple(selector), tuple(expressions))


def _telling_label(labels: Labels, members: Sequence[Member], keys: Keys) -> str | None:
    """The first label, in order, whose value (or presence) on a stray node no member shares."""
    for key in (keys.class_label, *keys.order):
        value = labels.get(key)
        if value is None:
            continue  # NotIn and DoesNotExist both hold where the label is absent: it cannot tell them apart
        if key == keys.class_label and value == keys.gpu_class:
            continue
        if all(m.labels.get(key) != value for m in members):
            return key
    return None
