"""Reading a manifest for `gpupool explain`: its objects (the items of a `List` in their place), the
`PodTemplate` each of its Pod templates becomes, and the `Workload` view through which each kind's
function (webhook.commands.workloads) reads an object: checked fields that name the object and the
field when wrong, counts, and the Pod a controller makes of a template.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from webhook.domain.errors import ConfigError

MAX_LIST_DEPTH = 4  # a List of Lists of ...
STANDIN_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what Kubernetes draws generated name suffixes from


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """One Pod template of an object read, and the Pod its controller makes of it."""

    kind: str  # of the object read: Pod, Job, JobSet...
    name: str
    namespace: str  # the object's own metadata.namespace, "" when it has none
    path: str  # where the template is in the object: "" for a Pod, spec.template, ...
    pod: dict[str, Any]  # the Pod as its controller creates it, before admission
    role: str = ""  # which of the object's templates: the replica type, replicated job or group
    pods: int | None = 1  # Pods of this template at the workload's full size; None when not known
    owner: str = ""  # Kind/name of the Pod's controller owner, "" for none
    note: str = ""  # what is a stand-in, or why the Pod is not decided here
    decided: bool = True  # False for a DaemonSet's: its controller binds each Pod to a node

    def in_namespace(self, namespace: str) -> PodTemplate:
        """The same, its Pod created in `namespace` (where its controller creates it: the object's)."""
        return replace(self, pod={**self.pod, "metadata": {**self.pod["metadata"], "namespace": namespace}})


def objects_in(documents: list[Any], source: str) -> list[dict[str, Any]]:
    """The objects of a file's YAML documents, with the items of a `List` (kubectl's `-o yaml` of
    several objects) in their place."""
    found: list[dict[str, Any]] = []

    def add(obj: Any, where: str, depth: int) -> None:
        if not isinstance(obj, dict):
            raise ConfigError(f"{source}: {where}: expected a Kubernetes object (a mapping), found {_type(obj)}")
        kind = obj.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and "items" in obj:
            if depth >= MAX_LIST_DEPTH:
                raise ConfigError(f"{source}: {where}: Lists nested more than {MAX_LIST_DEPTH} deep")
            items = obj["items"]
            if not isinstance(items, list):
                raise ConfigError(f"{source}: {where}: items: expected a list, found {_type(items)}")
            for i, item in enumerate(items):
                add(item, f"{where} items[{i}]", depth + 1)
            return
        found.append(obj)

    for i, doc in enumerate(documents):
        add(doc, f"document {i + 1}", 0)
    return found


@dataclass(frozen=True, slots=True)
class Workload:
    """An object being read, and what every kind's function needs of it."""

    obj: Mapping[str, Any]
    kind: str
    api_version: str
    name: str
    meta: Mapping[str, Any]
    where: str  # names the object in errors

    @property
    def namespace(self) -> str:
        ns = self.meta.get("namespace")
        return ns if isinstance(ns, str) else ""

    @property
    def ref(self) -> tuple[str, str, str]:
        return self.api_version, self.kind, self.name

    def spec(self) -> dict[str, Any]:
        return field_map(self.obj, "spec", self.where, "")

    def template(self, parent: Mapping[str, Any], path: str, key: str = "template") -> tuple[dict[str, Any], str]:
        """The Pod template `parent[key]` (at `path`), which must have a `spec` mapping."""
        template = field_map(parent, key, self.where, path, required=True)
        at = _join(path, key)
        field_map(template, "spec", self.where, at, required=True)
        return template, at

    def count(self, parent: Mapping[str, Any], key: str, path: str, default: int | None = 1) -> int | None:
        value = parent.get(key, default)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{self.where}: {path}.{key}: expected a whole number >= 0, found {value!r}")
        return value

    def made(  # noqa: PLR0913 (a Pod template's fields, by keyword, from every workload kind)
        self,
        template: Mapping[str, Any],
        path: str,
        *,
        owner: tuple[str, str, str] | None,
        name: str = "",
        generate_name: str = "",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        role: str = "",
        pods: int | None = 1,
        note: str = "",
        decided: bool = True,
    ) -> PodTemplate:
        """The Pod a controller makes of `template`: its labels and annotations over the template's (the
        controllers' own keys are never the user's to set), owned by `owner` (apiVersion, kind, name)."""
        tmeta = field_map(template, "metadata", self.where, path)
        meta: dict[str, Any] = {}
        if name:
            meta["name"] = name
        else:
            meta["generateName"] = generate_name
        if self.namespace:
            meta["namespace"] = self.namespace
        meta["labels"] = {**field_map(tmeta, "labels", self.where, _join(path, "metadata")), **(labels or {})}
        meta["annotations"] = {
            **field_map(tmeta, "annotations", self.where, _join(path, "metadata")),
            **(annotations or {}),
        }
        for key in ("labels", "annotations"):
            if not meta[key]:
                del meta[key]
        if owner is not None:
            api_version, kind, owner_name = owner
            meta["ownerReferences"] = [
                {
                    "apiVersion": api_version,
                    "kind": kind,
                    "name": owner_name,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(template["spec"])}
        return PodTemplate(
            kind=self.kind,
            name=self.name,
            namespace=self.namespace,
            path=path,
            pod=pod,
            role=role,
            pods=pods,
            owner=f"{owner[1]}/{owner[2]}" if owner else "",
            note=note,
            decided=decided,
        )


def owner_of(w: Workload) -> str:
    owners = w.meta.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, dict) and owner.get("controller") is True:
            return f"{owner.get('kind')}/{owner.get('name')}"
    return ""


def standin(value: Any, length: int) -> str:
    """A name suffix in Kubernetes' alphabet, the same for the same input: a stand-in for one that a
    controller generates (a hash, or random)."""
    digest = zlib.crc32(orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str))
    text = ""
    for _ in range(length):
        digest, rest = divmod(digest, len(STANDIN_ALPHABET))
        text += STANDIN_ALPHABET[rest]
        digest = digest or 0x9E3779B9
    return text


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def field_map(parent: Mapping[str, Any], key: str, where: str, path: str, *, required: bool = False) -> dict[str, Any]:
    """`parent[key]`, a mapping (`{}` when absent and not `required`); `where` names the object and `path`
    the parent in it, for the error."""
    value = parent.get(key)
    if value is None and not required:
        return {}
    if value is None:
        raise ConfigError(f"{where}: {path or 'the object'} has no {key}")
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {_join(path, key)}: expected a mapping, found {_type(value)}")
    return value


def field_list(parent: Mapping[str, Any], key: str, where: str, path: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {_join(path, key)}: expected a list, found {_type(value)}")
    return value


def _type(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"
