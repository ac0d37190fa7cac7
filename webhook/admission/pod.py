"""The Pod as the core reads it: the raw object checked and read once, at the edge, into small values.

kube-apiserver decodes every Pod into its typed form before it calls a webhook, so a real review carries
well-formed fields. gpupool does not depend on that: every field the core reads is checked here, and a
Pod whose fields are not what Kubernetes allows is refused (400) with the field's path and what is
accepted. No later step meets a `null` container or an `ownerReferences: 5`, and every path a patch
writes under has a parent.

`PodView.shape` holds exactly what the request (webhook.admission.request) and the patch (webhook.admission.patch) are
derived from: they take the shape and nothing else. So the shape is also the key their memo uses, and a
field the core starts to read is in that key by construction. Identity (name, node, owners, the
workload group) stays outside the shape: the replicas of a Deployment share one shape.
"""

from __future__ import annotations

from hashlib import blake2b
from itertools import chain
from sys import getsizeof
from typing import Any, NamedTuple

from webhook.domain.affinity import NO_AFFINITY_VIEW, AffinityError, AffinityView, NodeRequirements, read_affinity
from webhook.domain.groups import GROUP_ANNOTATION, MAX_OWNERS, WORKLOAD_LABELS, controller_of, workload_group
from webhook.domain.model import PREFIX, Toleration
from webhook.domain.quantity import shown
from webhook.pools.memo import held_bytes

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

# At most this many items of each list the core reads: far more than any real Pod has, and what keeps
# the worst review (two stored Pods of 1.5 MiB, etcd's limit, of one field) at milliseconds. Kubernetes
# sets no such limit; gpupool refuses such a Pod with a message saying so (documented in docs/policy.md).
MAX_CONTAINERS = 256  # each of containers, initContainers and ephemeralContainers
MAX_TOLERATIONS = 1024
MAX_SELECTOR_ENTRIES = 256  # nodeSelector labels
MAX_OWN_ANNOTATIONS = 64  # gpupool.io/ annotations (gpupool knows nine)
MAX_EXTENDED_RESOURCES = 64  # vendor.example/name entries in one container's limits or requests
MAX_GATES = 64  # scheduling gates (a Pod waits for one or two controllers)

Entries = tuple[tuple[str, str], ...]
Quantities = tuple[tuple[str, str | int], ...]  # as the Pod wrote them: kube-apiserver sends strings


class PodError(ValueError):
    """A field of the Pod is not what Kubernetes allows; the message names it and what is accepted."""


class ContainerView(NamedTuple):
    name: str
    has_resources: bool  # a `resources` map exists (else a patch adds one whole)
    limits: Quantities | None  # extended resources only (names with a "/"); None: no `limits` map
    requests: Quantities | None
    sidecar: bool  # restartPolicy Always: an init container that keeps running beside the others
    visible_devices: str | None  # NVIDIA_VISIBLE_DEVICES as the env sets it; None when unset
    visible_devices_from: str  # "" unless NVIDIA_VISIBLE_DEVICES comes from a valueFrom (its source)
    privileged: bool = False  # securityContext.privileged: the container sees every device of the node anyway


class PodShape(NamedTuple):
    """What the request and the patch read: the memo's key."""

    namespace: str
    annotations: Entries | None  # the gpupool.io/ annotations; None when the Pod has no annotations map
    node_selector: Entries | None  # None when the Pod has no nodeSelector map
    tolerations: tuple[Toleration, ...] | None  # None when the Pod has no tolerations list
    containers: tuple[ContainerView, ...]
    init_containers: tuple[ContainerView, ...] | None
    affinity: AffinityView  # its required node affinity, and how much of the path to it exists
    gates: tuple[str, ...] | None = None  # the names of its scheduling gates; None when it has no list

    @property
    def requirements(self) -> NodeRequirements:
        """What the Pod requires of its node: its nodeSelector and its required node-affinity terms."""
        return NodeRequirements(tuple(sorted(self.node_selector or ())), self.affinity.required)


_SHAPE = getsizeof(PodShape("", None, None, None, (), None, NO_AFFINITY_VIEW))
_AFFINITY_LIMIT = 4 * 1024 * 1024
_PAIR = getsizeof(("", ""))
_TOLERATION = getsizeof(Toleration())
_CONTAINER = getsizeof(ContainerView("", False, None, None, False, None, ""))


class PodView(NamedTuple):
    """Who the Pod is and where it is headed, and its shape."""

    namespace: str
    name: str
    generate_name: str
    node_name: str
    mirror: bool  # created by the kubelet for a static Pod
    daemonset: bool  # its controller owner (controller: true) is a DaemonSet, which places it itself
    shape: PodShape
    group: str = ""  # its workload group (webhook.domain.groups), "" when it has none

    @property
    def ref(self) -> str:
        """`namespace/name`, or `namespace/generateName` before the name is generated."""
        return f"{self.namespace}/{self.name or self.generate_name}"


def shape_digest(shape: PodShape) -> bytes:
    """16 bytes that stand for the shape: equal for equal shapes, and (BLAKE2b over the shape's repr, which
    writes out every field of every value in it) different for different ones but by a collision no one
    can find. What the queue keeps a shape's decision by (webhook.queue.parking), where keeping the shape
    would keep what a hostile Pod sent."""
    return blake2b(repr(shape).encode(), digest_size=16).digest()


def shape_bytes(shape: PodShape) -> int:
    """The bytes a shape holds (every tuple and string in it, as sys.getsizeof counts them): what the memo
    weighs its entries by. Exact for what it counts; small ints, None and booleans are shared objects.
    (Summed with map over chains: this runs for every Pod of a shape not seen before.)"""
    total = _SHAPE + getsizeof(shape.namespace)
    for entries in (shape.annotations, shape.node_selector):
        if entries:
            total += getsizeof(entries) + _PAIR * len(entries) + sum(map(getsizeof, chain.from_iterable(entries)))
    tolerations = shape.tolerations
    if tolerations:
        total += getsizeof(tolerations) + _TOLERATION * len(tolerations)
        total += sum(map(getsizeof, chain.from_iterable(tolerations)))
    for containers in (shape.containers, shape.init_containers):
        if containers:
            total += getsizeof(containers) + _CONTAINER * len(containers)
            for c in containers:
                total += getsizeof(c.name) + getsizeof(c.visible_devices) + getsizeof(c.visible_devices_from)
                for quantities in (c.limits, c.requests):
                    if quantities:
                        total += getsizeof(quantities) + _PAIR * len(quantities)
                        total += sum(map(getsizeof, chain.from_iterable(quantities)))
    if shape.affinity.terms:  # terms of requirements of values: walked, up to more than any entry may weigh
        total += held_bytes(shape.affinity, limit=_AFFINITY_LIMIT)
    return total


def read_pod(obj: Any, namespace: str = "") -> PodView:
    """The view of a raw Pod in `namespace` (the caller's choice: the server passes the Pod's own, else
    the request's); with no `namespace`, the Pod's own."""
    if not isinstance(obj, dict):
        raise PodError(f"the object is not a Pod: expected an object, got {shown(obj)}")
    meta = _object(obj, "metadata")
    spec = _object(obj, "spec")
    namespace = namespace or _text(meta, "namespace", "metadata.namespace")
    if not namespace:
        raise PodError("metadata.namespace: the Pod has no namespace and neither has the request")
    annotations = _map(meta, "annotations", "metadata.annotations")
    ours: Entries | None = None
    mirror = False
    if annotations is not None:
        found = []
        for key, value in annotations.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise PodError(f"metadata.annotations.{shown(key)}: expected a string value, got {shown(value)}")
            if key.startswith(PREFIX):
                found.append((key, value))
                if len(found) > MAX_OWN_ANNOTATIONS:
                    raise PodError(
                        f"metadata.annotations: more than {MAX_OWN_ANNOTATIONS} {PREFIX} annotations; gpupool reads "
                        f"at most {MAX_OWN_ANNOTATIONS}"
                    )
            elif key == MIRROR_ANNOTATION:
                mirror = True
        ours = tuple(found)
    owners = _bounded(meta, "ownerReferences", "metadata.ownerReferences", "owner references", MAX_OWNERS) or []
    daemonset = False
    for i, owner in enumerate(owners):
        if not isinstance(owner, dict):
            raise PodError(
                f"metadata.ownerReferences[{i}]: expected an owner reference (an object), got {shown(owner)}"
            )
        kind = _text(owner, "kind", f"metadata.ownerReferences[{i}].kind")
        _text(owner, "name", f"metadata.ownerReferences[{i}].name")
        controller = owner.get("controller")
        if controller not in (None, True, False):
            raise PodError(f"metadata.ownerReferences[{i}].controller: expected true or false, got {shown(controller)}")
        # Only the controller places the Pod: a reference that is not the controller's grants nothing.
        daemonset = daemonset or (kind == "DaemonSet" and controller is True)
    labels = _workload_labels(meta)
    containers = _containers(spec, "containers")
    inits = _containers(spec, "initContainers") if spec.get("initContainers") is not None else None
    shape = PodShape(
        namespace=namespace,
        annotations=ours,
        node_selector=_node_selector(spec),
        tolerations=_tolerations(spec),
        containers=containers or (),
        init_containers=inits,
        affinity=_affinity(spec),
        gates=_gates(spec),
    )
    return PodView(
        namespace=namespace,
        name=_text(meta, "name", "metadata.name"),
        generate_name=_text(meta, "generateName", "metadata.generateName"),
        node_name=_text(spec, "nodeName", "spec.nodeName"),
        mirror=mirror,
        daemonset=daemonset,
        shape=shape,
        group=workload_group(annotations.get(GROUP_ANNOTATION) if annotations else None, labels, controller_of(owners)),
    )


def _workload_labels(meta: dict[str, Any]) -> dict[str, Any]:
    """The Pod's labels, of which only the few that name a workload are read (and checked)."""
    labels = _map(meta, "labels", "metadata.labels") or {}
    for key, _ in WORKLOAD_LABELS:
        if key in labels:
            _text(labels, key, f"metadata.labels.{key}")
    return labels


def _object(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        raise PodError(f"{key}: expected an object, got {shown(value)}")
    return value


def _map(parent: dict[str, Any], key: str, path: str) -> dict[str, Any] | None:
    value = parent.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise PodError(f"{path}: expected an object, got {shown(value)}")


def _list(parent: dict[str, Any], key: str, path: str, what: str) -> list[Any] | None:
    value = parent.get(key)
    if value is None or isinstance(value, list):
        return value
    raise PodError(f"{path}: expected a list of {what}, got {shown(value)}")


def _text(parent: dict[str, Any], key: str, path: str) -> str:
    value = parent.get(key)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise PodError(f"{path}: expected a string, got {shown(value)}")


def _node_selector(spec: dict[str, Any]) -> Entries | None:
    selector = _map(spec, "nodeSelector", "spec.nodeSelector")
    if selector is None:
        return None
    if len(selector) > MAX_SELECTOR_ENTRIES:
        raise PodError(f"spec.nodeSelector: {len(selector)} labels; gpupool reads at most {MAX_SELECTOR_ENTRIES}")
    for key, value in selector.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PodError(f"spec.nodeSelector.{shown(key)}: expected a string value, got {shown(value)}")
    return tuple(selector.items())


def _tolerations(spec: dict[str, Any]) -> tuple[Toleration, ...] | None:
    items = _bounded(spec, "tolerations", "spec.tolerations", "tolerations", MAX_TOLERATIONS)
    if items is None:
        return None
    tolerations = []
    for i, t in enumerate(items):
        if not isinstance(t, dict):
            raise PodError(f"spec.tolerations[{i}]: expected a toleration (an object), got {shown(t)}")
        key, operator, value, effect = t.get("key"), t.get("operator"), t.get("value"), t.get("effect")
        # One inline check on the common path (this runs for every toleration of every admission); the
        # field-by-field one only to name what is wrong.
        if not (
            (key is None or type(key) is str)
            and (operator is None or type(operator) is str)
            and (value is None or type(value) is str)
            and (effect is None or type(effect) is str)
        ):
            for name in ("key", "operator", "value", "effect"):
                _text(t, name, f"spec.tolerations[{i}].{name}")
        tolerations.append(Toleration(key or "", operator or "Equal", value or "", effect or ""))
    return tuple(tolerations)


def _containers(spec: dict[str, Any], field: str) -> tuple[ContainerView, ...] | None:
    items = _bounded(spec, field, f"spec.{field}", "containers", MAX_CONTAINERS)
    if items is None:
        return None
    return tuple(_container(c, field, i) for i, c in enumerate(items))


def _bounded(parent: dict[str, Any], key: str, path: str, what: str, limit: int) -> list[Any] | None:
    items = _list(parent, key, path, what)
    if items is not None and len(items) > limit:
        raise PodError(f"{path}: {len(items)} {what}; gpupool reads at most {limit}")
    return items


def _container(c: Any, field: str, i: int) -> ContainerView:
    if not isinstance(c, dict):
        raise PodError(f"spec.{field}[{i}]: expected a container (an object), got {shown(c)}")
    path = f"spec.{field}[{i}]"
    resources = _map(c, "resources", f"{path}.resources")
    limits = requests = None
    if resources is not None:
        limits = _quantities(resources, "limits", f"{path}.resources.limits")
        requests = _quantities(resources, "requests", f"{path}.resources.requests")
    devices, source = _visible_devices(c, path) if "env" in c else (None, "")
    return ContainerView(
        name=_text(c, "name", f"{path}.name"),
        has_resources=resources is not None,
        limits=limits,
        requests=requests,
        sidecar=_text(c, "restartPolicy", f"{path}.restartPolicy") == "Always",
        visible_devices=devices,
        visible_devices_from=source,
        privileged=_privileged(c, path) if "securityContext" in c else False,
    )


def _privileged(c: dict[str, Any], path: str) -> bool:
    context = _map(c, "securityContext", f"{path}.securityContext") or {}
    value = context.get("privileged")
    if value is None or isinstance(value, bool):
        return value is True
    raise PodError(f"{path}.securityContext.privileged: expected true or false, got {shown(value)}")


def read_ephemeral_containers(obj: Any, old: Any = None) -> tuple[ContainerView, ...]:
    """The ephemeral containers an update of `pods/ephemeralcontainers` adds: those of the Pod `obj`
    whose names the Pod before the update, `old`, does not have (an ephemeral container can be neither
    changed nor removed once added). Each is checked as a container is; with no readable `old`, all of
    them are new."""
    if not isinstance(obj, dict):
        raise PodError(f"the object is not a Pod: expected an object, got {shown(obj)}")
    containers = _containers(_object(obj, "spec"), "ephemeralContainers") or ()
    before = _ephemeral_names(old)
    return tuple(c for c in containers if c.name not in before)


def _ephemeral_names(old: Any) -> frozenset[str]:
    """The names of the ephemeral containers of the Pod before the update; kube-apiserver sends it, so
    it is read as it comes, without refusing anything."""
    spec = old.get("spec") if isinstance(old, dict) else None
    items = spec.get("ephemeralContainers") if isinstance(spec, dict) else None
    if not isinstance(items, list):
        return frozenset()
    return frozenset(
        c["name"] for c in items[:MAX_CONTAINERS] if isinstance(c, dict) and isinstance(c.get("name"), str)
    )


def _quantities(resources: dict[str, Any], key: str, path: str) -> Quantities | None:
    """The extended resources (`vendor.example/name`) of a limits or requests map; cpu and memory are
    never read, so a YAML float there (`cpu: 0.5`) is nobody's problem."""
    values = _map(resources, key, path)
    if values is None:
        return None
    found: list[tuple[str, str | int]] = []
    for name, value in values.items():
        if not isinstance(name, str):
            raise PodError(f"{path}: expected resource names (strings), got {shown(name)}")
        if "/" not in name:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, str | int)
            or (isinstance(value, int) and abs(value) > 2**63)
        ):
            raise PodError(f'{path}.{shown(name)}: expected a quantity such as "1", got {shown(value)}')
        found.append((name, value))
    if len(found) > MAX_EXTENDED_RESOURCES:
        raise PodError(f"{path}: {len(found)} extended resources; gpupool reads at most {MAX_EXTENDED_RESOURCES}")
    return tuple(found)


def _visible_devices(c: dict[str, Any], path: str) -> tuple[str | None, str]:
    """NVIDIA_VISIBLE_DEVICES as the container's env sets it (the last entry wins, as in Kubernetes)."""
    env = _list(c, "env", f"{path}.env", "environment variables") or []
    value: str | None = None
    source = ""
    for i, e in enumerate(env):
        if not isinstance(e, dict):
            raise PodError(f"{path}.env[{i}]: expected an environment variable (an object), got {shown(e)}")
        if e.get("name") != VISIBLE_DEVICES:
            continue
        value_from = _map(e, "valueFrom", f"{path}.env[{i}].valueFrom")
        if value_from:
            value, source = "", next(iter(value_from))
        else:
            value, source = _text(e, "value", f"{path}.env[{i}].value"), ""
    return value, source


def _gates(spec: dict[str, Any]) -> tuple[str, ...] | None:
    items = _bounded(spec, "schedulingGates", "spec.schedulingGates", "scheduling gates", MAX_GATES)
    if items is None:
        return None
    names = []
    for i, gate in enumerate(items):
        if not isinstance(gate, dict):
            raise PodError(f"spec.schedulingGates[{i}]: expected a scheduling gate (an object), got {shown(gate)}")
        names.append(_text(gate, "name", f"spec.schedulingGates[{i}].name"))
    return tuple(names)


def _affinity(spec: dict[str, Any]) -> AffinityView:
    try:
        return read_affinity(spec)
    except AffinityError as exc:
        raise PodError(str(exc)) from None
