"""The snapshot inventory: a file in the format of `kubectl get nodes,pods,resourcequotas -A -o yaml`.

So a user can capture a real cluster and replay it (`-o json` works too). The file is read once at
start into the same PoolIndex the live cache keeps; reservations made by admissions still count
against it until they expire, as they would on a live cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import yaml

from webhook.domain.errors import ConfigError, read_user_file, yaml_problem
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.inventory import LockedIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj, quota_from_obj

if TYPE_CHECKING:
    from webhook.sources.live import Observer

# ConfigMap: mig-parted's, which the policy's migReshaping names (webhook.pools.migconfig); any other is skipped.
_KINDS = ("Node", "Pod", "ResourceQuota", "ConfigMap")
# The kinds as the live inventory names them to its observers (webhook.sources.live).
_RESOURCES = {"Node": "nodes", "Pod": "pods", "ResourceQuota": "resourcequotas"}
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster


class InventoryFileError(ConfigError):
    """The inventory file cannot be used; the message names the file and the problem."""


def parse_objects(text: str | bytes, source: str) -> list[Mapping[str, Any]]:
    """The objects of a kubectl List (YAML or JSON), or of a YAML stream of objects."""
    try:
        docs = [orjson.loads(text)] if text.lstrip()[:1] in ("{", b"{") else list(yaml.load_all(text, _Loader))
    except orjson.JSONDecodeError as exc:
        raise InventoryFileError(f"{source}: not valid JSON: {exc}") from None
    except yaml.YAMLError as exc:
        raise InventoryFileError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None
    objects: list[Mapping[str, Any]] = []
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise InventoryFileError(f"{source}: expected Kubernetes objects, got {type(doc).__name__}")
        if isinstance(doc.get("items"), list):
            objects.extend(doc["items"])
        elif doc.get("kind") in _KINDS:
            objects.append(doc)
        else:
            raise InventoryFileError(
                f"{source}: expected a List with items (kubectl get nodes,pods,resourcequotas -A -o yaml) "
                "or Kubernetes objects"
            )
    for i, obj in enumerate(objects):
        if not isinstance(obj, Mapping) or not isinstance(obj.get("kind"), str):
            raise InventoryFileError(f"{source}: item {i} is not a Kubernetes object (no kind)")
        if obj["kind"] not in _KINDS:
            raise InventoryFileError(
                f"{source}: item {i} is a {obj['kind']}; expected only Node, Pod and ResourceQuota (and ConfigMap) "
                "(kubectl get nodes,pods,resourcequotas -A -o yaml)"
            )
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or not meta.get("name"):
            raise InventoryFileError(f"{source}: item {i} ({obj['kind']}) has no metadata.name")
    return objects


def build_index(objects: Sequence[Mapping[str, Any]], policy: Policy, source: str = "inventory") -> PoolIndex:
    index = PoolIndex(policy)
    resources = policy.gpu_resources
    kinds = dict.fromkeys(_KINDS, 0)
    # Nodes first, so Pods and their placements find their pools.
    for obj in sorted(objects, key=lambda o: _KINDS.index(o["kind"]) if o["kind"] in _KINDS else len(_KINDS)):
        kind = obj["kind"]
        if kind == "Node":
            index.upsert_node(node_from_obj(obj, resources, policy.partition_prefixes))
        elif kind == "Pod":
            meta = obj["metadata"]
            if not meta.get("namespace"):
                raise InventoryFileError(f"{source}: Pod {meta['name']} has no metadata.namespace")
            index.upsert_pod(
                pod_from_obj(obj, resources, policy.partition_prefixes), key=(meta["namespace"], meta["name"])
            )
        elif kind == "ResourceQuota":
            meta = obj["metadata"]
            index.upsert_quota(
                quota_from_obj(obj, resources, policy.partition_prefixes), meta.get("namespace", ""), meta["name"]
            )
        elif kind == "ConfigMap":
            meta = obj["metadata"]
            if index.mig.names(meta.get("namespace", ""), meta["name"]):
                index.see_mig_config(dict(obj))
        else:
            continue
        kinds[kind] += 1
    if not kinds["Node"]:
        raise InventoryFileError(
            f"{source}: no Node objects; capture with kubectl get nodes,pods,resourcequotas -A -o yaml"
        )
    return index


class SnapshotInventory(LockedIndex):
    """An Inventory read from a file once."""

    def __init__(self, index: PoolIndex, source: str) -> None:
        super().__init__(index)
        self.source = source

    @classmethod
    def from_file(cls, path: str, policy: Policy, observers: Sequence[Observer] = ()) -> SnapshotInventory:
        """The file's index; each of `observers` is given the file's objects of each kind as one full list,
        as the live inventory gives its first list."""
        _, text = read_user_file(path, InventoryFileError, "inventory file")
        objects = parse_objects(text, path)
        inventory = cls(build_index(objects, policy, path), path)
        for kind, resource in _RESOURCES.items():
            of_kind = [o for o in objects if o["kind"] == kind]
            for observer in observers:
                observer.replace(resource, of_kind, True, True)
        return inventory

    @property
    def ready(self) -> bool:
        return True

    def age_seconds(self) -> float:
        return 0.0

    def current_since(self) -> float | None:
        return None  # a file never shows the Pods it admits: reservations wait out reservationSeconds

    def close(self) -> None:
        return None
