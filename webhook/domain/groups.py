"""Workload groups: which Pods belong together, so gpupool can keep them on one pool.

A Pod's group is worked out by one rule (`workload_group`), used both when a Pod is admitted
(webhook.admission.pod reads the raw Pod into a view) and when the inventory projects the Pods it
watches (webhook.pools.kubeobj), so a Pod is in the same group whether gpupool admits it or sees it:

1. `gpupool.io/group`: a name the user sets in the Pod template;
2. else the label a multi-Job workload puts on all its Pods: `jobset.sigs.k8s.io/jobset-name`,
   `training.kubeflow.org/job-name`, `leaderworkerset.sigs.k8s.io/name`, `ray.io/cluster`;
3. else the Pod's controller owner (the `ownerReferences` entry with `controller: true`): the Job,
   ReplicaSet or StatefulSet that created it.

The labels come before the controller owner because the Pods of those workloads always have one too,
and it names only a part of the workload: a JobSet's Pods are owned by one Job per replicated job, a
LeaderWorkerSet's by a leader and a worker StatefulSet. Grouping them by owner would split exactly the
workloads the labels are there to keep together. (For a Kubeflow job or a Ray cluster the label and the
owner name the same object.)

Groups are namespace-scoped: the same name in two namespaces is two groups. The group is who the Pod
is, not what it asks for, so it is never part of a memo key of Pod shapes or plans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from webhook.domain.model import PREFIX

GROUP_ANNOTATION = f"{PREFIX}group"
# The well-known labels of multi-Job workloads, in the order they are looked at, and how a group taken
# from each is shown.
WORKLOAD_LABELS: tuple[tuple[str, str], ...] = (
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("training.kubeflow.org/job-name", "KubeflowJob"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("ray.io/cluster", "RayCluster"),
)
MAX_NAME_CHARS = 63  # a label value's limit: a group name can be copied into a label and back
MAX_OWNER_NAME_CHARS = 253  # an object name's limit
MAX_KIND_CHARS = 63
MAX_OWNERS = 64  # ownerReferences read per Pod (Kubernetes objects have one or two)

GroupPolicy = Literal["prefer", "strict"]
GROUP_POLICIES: tuple[GroupPolicy, ...] = ("prefer", "strict")
MAX_GROUP_SIZE = 4096

_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_CHARS = _ALNUM | frozenset("-_.")


class GroupRule(NamedTuple):
    """What a Pod asks of its group (`gpupool.io/group-policy`, `gpupool.io/group-size`)."""

    policy: GroupPolicy = "prefer"  # prefer: split the group rather than wait; strict: keep it together
    size: int = 0  # the group's first Pod goes only where this many Pods of its shape fit at once; 0: any


NO_GROUP_RULE = GroupRule()


def valid_name(value: str, limit: int = MAX_NAME_CHARS) -> bool:
    """A name as a label value is written: 1 to `limit` ASCII letters, digits, '-', '_' or '.', starting
    and ending with a letter or digit. One pass over at most `limit` characters."""
    return (
        0 < len(value) <= limit and value[0] in _ALNUM and value[-1] in _ALNUM and all(c in _NAME_CHARS for c in value)
    )


def _valid_kind(value: str) -> bool:
    return 0 < len(value) <= MAX_KIND_CHARS and all(c in _ALNUM for c in value)


def workload_group(annotation: object, labels: Mapping[str, Any], controller: tuple[object, object] | None) -> str:
    """The Pod's group, "" when it has none: the `gpupool.io/group` annotation's value (shown as is), else
    `JobSet/<name>` and the like from a workload label, else `<Kind>/<name>` of its controller owner
    (`controller` is its (kind, name), None when it has none).

    Values that are not well-formed names are passed over, so a group never takes more than a few
    hundred characters and the forms cannot collide (only the annotation's form has no '/')."""
    if isinstance(annotation, str) and valid_name(annotation):
        return annotation
    for label, shown_as in WORKLOAD_LABELS:
        value = labels.get(label)
        if isinstance(value, str) and valid_name(value):
            return f"{shown_as}/{value}"
    if controller is not None:
        kind, name = controller
        if (
            isinstance(kind, str)
            and isinstance(name, str)
            and _valid_kind(kind)
            and valid_name(name, MAX_OWNER_NAME_CHARS)
        ):
            return f"{kind}/{name}"
    return ""


def controller_of(owners: object) -> tuple[object, object] | None:
    """(kind, name) of the `ownerReferences` entry with `controller: true`; None when there is none (or
    `owners` is not a list). Kubernetes allows at most one such entry; the first one is taken, among the
    first MAX_OWNERS (admission refuses a Pod with more)."""
    if not isinstance(owners, list):
        return None
    for owner in owners[:MAX_OWNERS]:
        if isinstance(owner, dict) and owner.get("controller") is True:
            return owner.get("kind"), owner.get("name")
    return None
