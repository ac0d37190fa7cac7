"""The three patch types of kube-apiserver, applied to a stored object as it applies them.

- **JSON Patch** (RFC 6902, `application/json-patch+json`): the `jsonpatch` package; any operation that
  cannot be applied, a failed `test` included, is 422 with kube-apiserver's generic message.
- **JSON Merge Patch** (RFC 7386, `application/merge-patch+json`): objects merge, `null` deletes, any
  other value (lists too) replaces.
- **Strategic Merge Patch** (`application/strategic-merge-patch+json`, what the `kubernetes` client
  sends for a dict body): apimachinery's util/strategicpatch driven by the Go types' `patchStrategy` and
  `patchMergeKey` tags, copied below as `SCHEMAS` (tests check them against the published OpenAPI
  schema). Maps merge and `null` deletes a key; lists with the merge strategy merge their items by the
  merge key (`$patch: delete` removes an item, `$patch: replace` the whole list) or, for scalars, are a
  union (`$deleteFromPrimitiveList/<field>` removes); every other list is replaced whole (tolerations,
  nodeSelectorTerms, matchExpressions); `$patch: replace|delete` in a map, `$retainKeys` and
  `$setElementOrder/<field>` as the Go code does them, item order included.

Like the Go code, a list the original lacks is taken from the patch as it is, directives and all, and the
typed decode that follows drops the unknown `$…` keys: a `$patch: delete` item for a list that does not
exist adds that item.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import jsonpointer

from webhook.testing.kubeproto import ApiError, unprocessable

Obj = dict[str, Any]
MAX_JSON_PATCH_OPERATIONS = 10_000  # maxJSONPatchOperations


@dataclass(frozen=True)
class Field:
    """The patch metadata of one field: its strategy ("merge", "merge,retainKeys" or none), the merge key
    of a list of objects, and the schema of its value's fields (of each item, for a list)."""

    strategy: str = ""
    merge_key: str = ""
    of: Schema = field(default_factory=dict)


Schema = dict[str, Field]

_OBJECT_META: Schema = {"finalizers": Field("merge"), "ownerReferences": Field("merge", "uid")}
_CONTAINER: Schema = {
    "ports": Field("merge", "containerPort"),
    "env": Field("merge", "name"),
    "volumeMounts": Field("merge", "mountPath"),
    "volumeDevices": Field("merge", "devicePath"),
}
_VOLUME: Schema = {"ephemeral": Field(of={"volumeClaimTemplate": Field(of={"metadata": Field(of=_OBJECT_META)})})}
_POD_SPEC: Schema = {
    "volumes": Field("merge,retainKeys", "name", _VOLUME),
    "initContainers": Field("merge", "name", _CONTAINER),
    "containers": Field("merge", "name", _CONTAINER),
    "ephemeralContainers": Field("merge", "name", _CONTAINER),
    "imagePullSecrets": Field("merge", "name"),
    "hostAliases": Field("merge", "ip"),
    "topologySpreadConstraints": Field("merge", "topologyKey"),
    "schedulingGates": Field("merge", "name"),
    "resourceClaims": Field("merge,retainKeys", "name"),
    "evictionResponders": Field("merge", "name"),
}
_CONTAINER_STATUS: Schema = {
    "allocatedResourcesStatus": Field("merge", "name"),
    "volumeMounts": Field("merge", "mountPath"),
}
_POD_STATUS: Schema = {
    "conditions": Field("merge", "type"),
    "podIPs": Field("merge", "ip"),
    "hostIPs": Field("merge", "ip"),
    "resourceClaimStatuses": Field("merge,retainKeys", "name"),
    "nodeAllocatableResourceClaimStatuses": Field(
        "merge", "resourceClaimName", {"mapping": Field("merge", "name"), "overhead": Field("merge", "name")}
    ),
    "containerStatuses": Field(of=_CONTAINER_STATUS),
    "initContainerStatuses": Field(of=_CONTAINER_STATUS),
    "ephemeralContainerStatuses": Field(of=_CONTAINER_STATUS),
    "volumeHealth": Field(of={"healthConditions": Field("merge", "status")}),
}
_META_ONLY: Schema = {"metadata": Field(of=_OBJECT_META)}
SCHEMAS: dict[str, Schema] = {
    "Pod": {"metadata": Field(of=_OBJECT_META), "spec": Field(of=_POD_SPEC), "status": Field(of=_POD_STATUS)},
    "Node": {
        "metadata": Field(of=_OBJECT_META),
        "spec": Field(of={"podCIDRs": Field("merge")}),
        "status": Field(of={"addresses": Field("merge", "type"), "conditions": Field("merge", "type")}),
    },
    "ResourceQuota": _META_ONLY,
    "Event": _META_ONLY,
    "Lease": _META_ONLY,
}


class PatchError(Exception):
    """A strategic merge patch the Go code refuses; `code` is what kube-apiserver answers with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- JSON Patch and JSON Merge Patch -------------------------------------------------------------


def apply_json_patch(obj: Obj, operations: Any) -> Any:
    """RFC 6902. 400 for a body that is not a list of operations, 413 beyond 10,000 operations, 422 for
    any operation that cannot be applied (kube-apiserver's generic message, as it answers)."""
    if not isinstance(operations, list):
        raise ApiError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    if len(operations) > MAX_JSON_PATCH_OPERATIONS:
        raise ApiError(
            413,
            "Request entity too large: The allowed maximum operations in a JSON patch is "
            f"{MAX_JSON_PATCH_OPERATIONS}, got {len(operations)}",
        )
    try:
        return jsonpatch.JsonPatch(operations).apply(obj)
    # The package's errors for an operation that does not apply (a missing path, a failed test, a
    # malformed operation); TypeError and the lookups for values of the wrong type along a path.
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, KeyError, IndexError):
        raise unprocessable() from None


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


# -- Strategic Merge Patch -----------------------------------------------------------------------

_DIRECTIVE = "$patch"
_RETAIN_KEYS = "$retainKeys"
_DELETE_FROM = "$deleteFromPrimitiveList/"
_SET_ORDER = "$setElementOrder/"


def apply_strategic_merge_patch(obj: Obj, patch: Any, kind: str) -> Obj:
    """StrategicMergeMapPatch for a stored object of `kind`, then the typed decode's dropping of `$…`
    keys. 400 for a body that is not an object; PatchError for what the Go code refuses."""
    if not isinstance(patch, dict):
        raise ApiError(400, "json: cannot unmarshal array into Go value of type map[string]interface {}")
    merged = _merge_map(copy.deepcopy(obj), copy.deepcopy(patch), SCHEMAS.get(kind, _META_ONLY))
    return _strip_directives(merged)  # type: ignore[no-any-return]


def _merge_map(original: Obj, patch: Obj, schema: Schema) -> Obj:
    if _DIRECTIVE in patch:
        directive = patch.pop(_DIRECTIVE)
        if directive == "replace":
            return patch
        if directive == "delete":
            return {}
        raise PatchError(400, f"Unknown patch type: {directive} in map: {patch}")
    _retain_keys(original, patch)
    _set_element_orders(original, patch, schema)
    for name, value in patch.items():
        deleting = name.startswith(_DELETE_FROM)
        key = name[len(_DELETE_FROM) :] if deleting else name
        if value is None:
            original.pop(key, None)
            continue
        if key not in original:
            original[key] = value
            continue
        current, meta = original[key], schema.get(key, Field())
        if type(current) is not type(value):
            original[key] = value
        elif isinstance(value, dict):
            original[key] = _merge_map(current, value, meta.of)
        elif isinstance(value, list):
            original[key] = _merge_list(current, value, meta, deleting)
        else:
            original[key] = value
    return original


def _merge_list(original: list[Any], patch: list[Any], meta: Field, deleting: bool) -> list[Any]:
    if "merge" not in meta.strategy.split(","):
        return patch  # the default for lists: replace
    if not original and not patch:
        return original
    scalar = _element_kind(original + patch)
    if scalar:
        if deleting:
            return [v for v in original if v not in patch]
        merged = _dedupe(original + patch)
        patch_items = sorted((v for v in merged if v in patch), key=patch.index)
        server_only = [v for v in merged if v not in patch]
        return _interleave(server_only, patch_items, original, "")
    key = meta.merge_key
    if not key:
        raise PatchError(500, "cannot merge lists without merge key for type map")
    original, patch = _special_items(original, patch, key)
    live = list(original)  # the order items had, before new ones are appended
    for item in patch:
        if key not in item:
            raise PatchError(500, f"map: {item} does not contain declared merge key: {key}")
        found = _find(original, key, item[key])
        if found is None:
            original.append(item)
        else:
            original[found] = _merge_map(original[found], item, meta.of)
    patch_keys = [item[key] for item in patch]
    patch_items = sorted((v for v in original if v.get(key) in patch_keys), key=lambda v: patch_keys.index(v[key]))
    server_only = [v for v in original if v.get(key) not in patch_keys]
    return _interleave(server_only, patch_items, live, key)


def _element_kind(items: list[Any]) -> bool:
    """True for a list of scalars, False for a list of objects (sliceElementType: one type throughout)."""
    kinds = {type(v) for v in items}
    if len(kinds) != 1:
        raise PatchError(500, f"list element types are not identical: {items}")
    kind = kinds.pop()
    if kind is list:
        raise PatchError(422, "lists of lists are not supported")
    return kind is not dict


def _special_items(original: list[Obj], patch: list[Obj], key: str) -> tuple[list[Obj], list[Obj]]:
    """mergeSliceWithSpecialElements: `$patch: delete` items remove their match from the original,
    `$patch: replace` makes the rest of the patch the whole list."""
    kept: list[Obj] = []
    replace = False
    for item in patch:
        directive = item.get(_DIRECTIVE)
        if directive is None:
            kept.append(item)
        elif directive == "delete":
            if key not in item:
                raise PatchError(500, f"map: {item} does not contain declared merge key: {key}")
            original = [v for v in original if v.get(key) != item[key]]
        elif directive == "replace":
            replace = True
        elif directive == "merge":
            raise PatchError(500, "merging lists cannot yet be specified in the patch")
        else:
            raise PatchError(400, f"Unknown patch type: {directive} in map: {item}")
    return (kept, []) if replace else (original, kept)


def _find(items: list[Obj], key: str, value: Any) -> int | None:
    return next((i for i, v in enumerate(items) if key in v and v[key] == value), None)


def _dedupe(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in items:
        if v not in out:
            out.append(v)
    return out


def _interleave(server_only: list[Any], patch_items: list[Any], order: list[Any], key: str) -> list[Any]:
    """mergeSortedSlice: server-only items are inserted into the patch's items by their place in the live
    list; an item the live list does not know (a new one) goes before them."""

    def position(item: Any) -> int:
        want = item.get(key) if key else item
        return next((i for i, v in enumerate(order) if (v.get(key) if key else v) == want), -1)

    out: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(patch_items):
        if j >= len(patch_items):
            out.append(server_only[i])
            i += 1
        elif i >= len(server_only):
            out.append(patch_items[j])
            j += 1
        else:
            left, right = position(server_only[i]), position(patch_items[j])
            if left >= 0 and right >= 0 and left < right:
                out.append(server_only[i])
                i += 1
            else:
                out.append(patch_items[j])
                j += 1
    return out


def _retain_keys(original: Obj, patch: Obj) -> None:
    """applyRetainKeysDirective: clear the original's fields that `$retainKeys` does not name."""
    if _RETAIN_KEYS not in patch:
        return
    keep = patch.pop(_RETAIN_KEYS)
    if not isinstance(keep, list):
        raise PatchError(400, "invalid patch format of retainKeys")
    for key, value in patch.items():
        if value is not None and not key.startswith(("$", _DELETE_FROM)) and key not in keep:
            raise PatchError(400, "invalid patch format of retainKeys")
    for key in [k for k in original if k not in keep]:
        del original[key]


def _set_element_orders(original: Obj, patch: Obj, schema: Schema) -> None:
    """mergePatchIntoOriginal: a `$setElementOrder/<field>` list merges that field's patch list now and
    orders the result by it (patch items in its order, server-only items where they were)."""
    for directive in [k for k in patch if k.startswith(_SET_ORDER)]:
        order = patch.pop(directive)
        key = directive[len(_SET_ORDER) :]
        if not isinstance(order, list):
            raise PatchError(400, "invalid patch format of setElementOrder list")
        meta = schema.get(key, Field())
        current, change = original.get(key), patch.pop(key, None)
        if current is None and change is None:
            continue
        if (current is not None and not isinstance(current, list)) or (
            change is not None and not isinstance(change, list)
        ):
            raise PatchError(400, "invalid patch format of setElementOrder list")
        if current is None:
            merged: list[Any] = list(change or [])
        elif change is None:
            merged = list(current)
        else:
            merged = _merge_list(list(current), change, meta, False)
        mk = meta.merge_key
        if mk and not all(isinstance(v, dict) and mk in v for v in [*merged, *order]):
            raise PatchError(500, f"map does not contain declared merge key: {mk}")
        wanted = [v[mk] for v in order] if mk else order
        in_order = sorted(
            (v for v in merged if (v[mk] if mk else v) in wanted), key=lambda v: wanted.index(v[mk] if mk else v)
        )
        rest = [v for v in merged if (v[mk] if mk else v) not in wanted]
        original[key] = _interleave(rest, in_order, list(current or []), mk)


def _strip_directives(value: Any) -> Any:
    """The typed decode after the merge keeps only known fields: `$…` keys go."""
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not (isinstance(k, str) and k.startswith("$"))}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def patch_paths(schema: Mapping[str, Field], prefix: str = "") -> dict[str, tuple[str, str]]:
    """Every field path with a patch strategy under `schema`: `.spec.containers` -> ("merge", "name")."""
    out: dict[str, tuple[str, str]] = {}
    for name, meta in schema.items():
        path = f"{prefix}.{name}"
        if meta.strategy:
            out[path] = (meta.strategy, meta.merge_key)
        out |= patch_paths(meta.of, path)
    return out
