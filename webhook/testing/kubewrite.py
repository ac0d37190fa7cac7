"""Writes as kube-apiserver makes them: create, update (PUT), patch and delete, without HTTP.

Each write runs the steps of apiserver's generic registry in its order, holding the store's lock from
the read of the current object to the write of the new one (as etcd's compare-and-swap would make it
atomic): decode (400 for a body the Go types cannot hold), namespace and name agree with the URL (400),
the `resourceVersion` precondition (409 Conflict when it is not the current one; a Lease, which allows
no unconditional update, gets 422 without one), defaulting and admission (webhook.testing.kubepods),
validation (webhook.testing.kubekinds and kubevalidate, 422 Invalid), then the write: a new resourceVersion and one
watch event. An update that changes nothing is not written, as etcd3's store skips it. `dryRun=All`
runs every step but the write.

Finalizers as the generic registry keeps them: a DELETE of an object with `metadata.finalizers` sets its
`deletionTimestamp` (and `deletionGracePeriodSeconds` 0: the simulator plays no kubelet, so a Pod's grace
period is over at once) and keeps it stored, one MODIFIED event; an update keeps both fields, may add no
finalizer, and once it empties the finalizers the object is deleted (one DELETED event). An object
without finalizers is deleted at once, a bound Pod included.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from webhook.testing import kubepatch
from webhook.testing.kubeadmission import ADMIN, UserInfo
from webhook.testing.kubedecode import normalize_micro_times, shape_problem
from webhook.testing.kubefield import FieldError, forbidden, invalid, not_supported, too_long
from webhook.testing.kubekinds import create_errors, update_errors
from webhook.testing.kubepods import prepare_create, prepare_update
from webhook.testing.kubeproto import ApiError, already_exists, conflict, not_found
from webhook.testing.kubeproto import invalid as invalid_error
from webhook.testing.kuberesources import JSON_PATCH, MERGE_PATCH, PATCH_TYPES, STATUS_SUBRESOURCE, Resource, Target
from webhook.testing.kubestore import Store

Obj = dict[str, Any]
Admission = Callable[..., None]  # (new, old, user, *, dry_run): webhook.testing.kubeadmission.ValidatingWebhook
_ADMISSION_TRIES = 5  # an update judged while the object changed is made again, at most this often
# The alphabet of the suffix kube-apiserver appends to metadata.generateName (no vowels, no 0/1/3).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_FIELD_MANAGER = 128
# Kinds whose registry strategy creates on a PUT of a missing object, and refuses an update without a
# resourceVersion (AllowCreateOnUpdate, !AllowUnconditionalUpdate).
# A custom resource (GPUPool) allows no unconditional update either (apiextensions' customResourceStrategy).
_CREATE_ON_UPDATE = ("Lease", "Event")
_CONDITIONAL_ONLY = ("Lease", "GPUPool")
# Kinds whose status a create leaves out: a custom resource with a status subresource starts without one.
_STATUS_DROPPED_ON_CREATE = ("GPUPool",)


class Writer:
    """The write verbs over one store. Every method returns (HTTP status, body) or raises ApiError."""

    def __init__(self, store: Store) -> None:
        self._store = store
        # Called on every Pod update before it commits (KubeSim.validating_webhook); raises ApiError to refuse.
        self.admission: Admission | None = None

    # -- verbs --------------------------------------------------------------------------------------

    def create(self, target: Target, body: bytes, query: Mapping[str, str]) -> tuple[int, bytes]:
        res = target.resource
        dry_run = _options("CreateOptions", query)
        obj = _decode_body(res, body)
        meta = obj["metadata"] = dict(_meta(obj))
        _namespace(res, meta, target.namespace)
        if meta.get("resourceVersion"):
            raise ApiError(400, "resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid_error(res.kind.kind, res.group, "", [_required_name()])
            meta["name"] = str(meta["generateName"]) + "".join(random.choices(_NAME_ALPHABET, k=5))
        return self._create(res, obj, dry_run)

    def update(
        self, target: Target, body: bytes, query: Mapping[str, str], *, user: UserInfo | None = None
    ) -> tuple[int, bytes]:
        res, name = target.resource, _name(target)
        dry_run = _options("UpdateOptions", query)
        obj = _decode_body(res, body)
        meta = obj["metadata"] = dict(_meta(obj))
        _namespace(res, meta, target.namespace)
        _same_name(meta, name)
        with self._store.changed:
            if self._current(res, target) is None:
                if res.kind.kind not in _CREATE_ON_UPDATE or meta.get("resourceVersion"):
                    raise not_found(res.qualified, name)
                return self._create(res, obj, dry_run)
        return self._guaranteed(res, target, lambda current: orjson.loads(orjson.dumps(obj)), dry_run, user)

    def patch(
        self,
        target: Target,
        body: bytes,
        content_type: str,
        query: Mapping[str, str],
        *,
        user: UserInfo | None = None,
    ) -> tuple[int, bytes]:
        res, name = target.resource, _name(target)
        patch_type = content_type.split(";", 1)[0].strip()
        if patch_type not in PATCH_TYPES:
            raise ApiError(
                415,
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(PATCH_TYPES),
            )
        dry_run = _options("PatchOptions", query)
        if query.get("force") not in (None, "", "false"):
            raise invalid_error(
                "PatchOptions", "meta.k8s.io", "", [forbidden("force", "may not be specified for non-apply patch")]
            )
        try:
            patch = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"error decoding patch: {exc}") from None

        def patched(current: Obj) -> Obj:
            served = orjson.loads(res.render(orjson.dumps(current)))
            new = _decode_patched(res, _apply(patch_type, served, patch, res.kind.kind))
            _namespace(res, new["metadata"], target.namespace)
            _same_name(new["metadata"], name)
            return new

        return self._guaranteed(res, target, patched, dry_run, user)

    def delete(self, target: Target, body: bytes, query: Mapping[str, str]) -> tuple[int, bytes]:
        res, name = target.resource, _name(target)
        dry_run = _options("DeleteOptions", query)
        preconditions = _preconditions(body)
        with self._store.changed:
            current = self._current(res, target)
            if current is None:
                raise not_found(res.qualified, name)
            meta = current.get("metadata") or {}
            for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = preconditions.get(field)
                if wanted is not None and wanted != meta.get(field):
                    found = meta.get(field)
                    why = f"Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {found}"
                    raise conflict(res.qualified, name, why)
            if meta.get("finalizers"):
                return self._finalizing(res, current, dry_run)
            if dry_run:
                return 200, res.render(orjson.dumps(current))
            event = self._store.remove(res.kind, target.namespace or "", name)
            return 200, res.render(event.body)

    def _finalizing(self, res: Resource, current: Obj, dry_run: bool) -> tuple[int, bytes]:
        """rest.BeforeDelete for an object finalizers keep: marked as being deleted, not removed; a DELETE
        of one marked already changes nothing."""
        if current["metadata"].get("deletionTimestamp"):
            return 200, res.render(_stored_form(current))
        new = {
            **current,
            "metadata": {**current["metadata"], "deletionTimestamp": _now(), "deletionGracePeriodSeconds": 0},
        }
        return self._commit(res, current, new, dry_run)

    # -- steps --------------------------------------------------------------------------------------

    def _current(self, res: Resource, target: Target) -> Obj | None:
        body = self._store.get(res.kind, target.namespace or "", _name(target))
        return (
            None if body is None else {"kind": res.kind.kind, "apiVersion": res.kind.api_version, **orjson.loads(body)}
        )

    def _create(self, res: Resource, obj: Obj, dry_run: bool) -> tuple[int, bytes]:
        kind, meta = res.kind.kind, obj["metadata"]
        # rest.BeforeCreate: the fields only the server sets (the store gives uid and creationTimestamp).
        for field in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(field, None)
        if kind == "Pod":
            prepare_create(obj)
        elif kind in _STATUS_DROPPED_ON_CREATE:
            obj.pop("status", None)
        errors = create_errors(res, obj)
        if errors:
            raise invalid_error(kind, res.group, meta["name"], errors)
        obj["kind"], obj["apiVersion"] = kind, res.kind.api_version
        with self._store.changed:  # the name check and the write, as one step
            if self._store.get(res.kind, meta.get("namespace", ""), meta["name"]) is not None:
                raise already_exists(res.qualified, meta["name"])
            if dry_run:
                return 201, res.render(_stored_form(obj))
            _, stored = self._store.put(obj, exists=False)
        return 201, res.render(stored)

    def _guaranteed(
        self,
        res: Resource,
        target: Target,
        make: Callable[[Obj], Obj],
        dry_run: bool,
        user: UserInfo | None,
    ) -> tuple[int, bytes]:
        """An update as etcd3's GuaranteedUpdate makes it: the new object made from the current one and
        checked under the store's lock; a Pod's then judged by the validating webhook (`admission`) with
        the lock let go, as kube-apiserver calls webhooks between its read and its compare-and-swap, and
        committed only if the Pod is still as read (else made and judged again)."""
        name = _name(target)
        for _ in range(_ADMISSION_TRIES):
            with self._store.changed:
                current = self._current(res, target)
                if current is None:
                    raise not_found(res.qualified, name)
                new = self._prepared(res, current, make(current), target.subresource)
                if self.admission is None or res.kind.kind != "Pod":
                    return self._commit(res, current, new, dry_run)
            self.admission(_served(res, new), _served(res, current), user or ADMIN, dry_run=dry_run)
            with self._store.changed:
                now = self._current(res, target)
                if now is not None and _version(now) == _version(current):
                    return self._commit(res, current, new, dry_run)
        raise conflict(res.qualified, name, "the object kept changing while admission judged the update")

    def _prepared(self, res: Resource, current: Obj, new: Obj, subresource: str | None = None) -> Obj:
        """The update's object as it would be stored, checked (preconditions, defaults, validation). On
        the `status` subresource only the status changes; on the object of a kind that has one, all but
        the status."""
        kind, old_meta, meta = res.kind.kind, current["metadata"], new["metadata"]
        name = old_meta["name"]
        wanted = meta.get("resourceVersion") or ""
        if not wanted:
            if kind in _CONDITIONAL_ONLY:
                errors = [invalid("metadata.resourceVersion", 0, "must be specified for an update")]
                raise invalid_error(res.plural, res.group, name, errors)
        elif not wanted.isdigit():
            raise ApiError(400, f'invalid resource version "{wanted}"')
        elif wanted != old_meta.get("resourceVersion"):
            raise conflict(res.qualified, name)
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        # rest.BeforeUpdate: the server's fields come from the stored object.
        if not meta.get("uid"):
            meta["uid"] = old_meta.get("uid")
        if old_meta.get("creationTimestamp"):
            meta["creationTimestamp"] = old_meta["creationTimestamp"]
        if "generation" in old_meta:
            meta["generation"] = old_meta["generation"]
        else:
            meta.pop("generation", None)
        # An update can never remove or change a deletion timestamp, nor take a grace period away.
        if old_meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = old_meta["deletionTimestamp"]
        if old_meta.get("deletionGracePeriodSeconds") is not None and meta.get("deletionGracePeriodSeconds") is None:
            meta["deletionGracePeriodSeconds"] = old_meta["deletionGracePeriodSeconds"]
        if subresource == "status":
            new = _status_only(new, current)
        elif kind == "Pod":
            prepare_update(new, current)
        elif kind in STATUS_SUBRESOURCE:
            _take_status(new, current)
        errors = update_errors(res, new, current)
        if errors:
            raise invalid_error(kind, res.group, name, errors)
        new["kind"], new["apiVersion"] = kind, res.kind.api_version
        return new

    def _commit(self, res: Resource, current: Obj, new: Obj, dry_run: bool) -> tuple[int, bytes]:
        if new == current:  # nothing changed: no write, no new resourceVersion, no watch event
            return 200, res.render(_stored_form(current))
        if dry_run:
            return 200, res.render(_stored_form(new))
        if _finalized(current, new):  # the registry's ShouldDeleteDuringUpdate: the last finalizer went
            meta = new["metadata"]
            self._store.remove(res.kind, meta.get("namespace", ""), meta["name"])
            return 200, res.render(_stored_form(new))
        _, stored = self._store.put(new, exists=True)
        return 200, res.render(stored)


# -- decoding -----------------------------------------------------------------------------------------


def _decode_body(res: Resource, body: bytes) -> Obj:
    """The object of a create or update body, in the stored version: 400 for what the Go types refuse."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict | None):
        raise ApiError(400, "the request body is not an object with metadata")
    if obj.get("kind", res.kind.kind) != res.kind.kind:
        raise ApiError(400, f"the kind of the object ({obj.get('kind')}) is not {res.kind.kind}")
    if obj.get("apiVersion", res.api_version) != res.api_version:
        got, want = obj.get("apiVersion"), res.api_version
        raise ApiError(400, f"the API version in the data ({got}) does not match the expected API version ({want})")
    if res.from_view is not None:
        obj = res.from_view(obj)
    obj = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    kind = res.kind.kind
    problem = shape_problem(kind, obj)
    try:
        if problem:
            raise ValueError(problem)
        normalize_micro_times(kind, obj)
    except ValueError as exc:
        raise ApiError(400, f'{kind} in version "{res.version}" cannot be handled as a {kind}: {exc}') from None
    decoded: Obj = omit_empty(obj)
    return decoded


def _decode_patched(res: Resource, patched: Any) -> Obj:
    """A patched object, decoded as the typed object kube-apiserver turns it into: 422 on `patch`."""
    kind = res.kind.kind

    def refuse(problem: str) -> ApiError:
        shown = orjson.dumps(patched).decode()
        shown = shown if len(shown) <= 2000 else shown[:2000] + "..."
        return invalid_error("", "", "", [invalid("patch", shown, problem)])

    if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
        raise refuse("the patched object is not an object with metadata")
    if patched.get("kind", kind) != kind or patched.get("apiVersion", res.api_version) != res.api_version:
        raise refuse(f"the patched object is not a {res.api_version} {kind}")
    obj = patched if res.from_view is None else res.from_view(patched)
    obj = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    obj["metadata"] = dict(obj["metadata"])
    problem = shape_problem(kind, obj)
    try:
        if problem:
            raise ValueError(problem)
        normalize_micro_times(kind, obj)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    decoded: Obj = omit_empty(obj)
    return decoded


def _apply(patch_type: str, served: Obj, patch: Any, kind: str) -> Any:
    if patch_type == JSON_PATCH:
        return kubepatch.apply_json_patch(served, patch)
    if patch_type == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise ApiError(400, "error decoding patch: a merge patch must be a JSON object")
        return kubepatch.apply_merge_patch(served, patch)
    try:
        return kubepatch.apply_strategic_merge_patch(served, patch, kind)
    except kubepatch.PatchError as exc:
        raise ApiError(exc.code, str(exc) if exc.code != 500 else f"Internal error occurred: {exc}") from None


# Fields that are Go maps (omitted when empty); other empty objects may be pointers to empty structs,
# which Go keeps (`securityContext: {}`).
_MAP_FIELDS = frozenset(
    ("labels", "annotations", "nodeSelector", "limits", "requests", "overhead", "hard", "allocatable", "capacity")
)


def omit_empty(value: Any) -> Any:
    """What a decode into Go structs and an encode back leave of a value: no nulls, no empty lists and no
    empty maps (they decode to zero values, which `omitempty` leaves out), e.g. no `schedulingGates: []`
    once the last gate is removed."""
    if isinstance(value, dict):
        kept = {key: omit_empty(item) for key, item in value.items()}
        return {
            key: item
            for key, item in kept.items()
            if item is not None and item != [] and not (item == {} and key in _MAP_FIELDS)
        }
    if isinstance(value, list):
        return [omit_empty(item) for item in value]
    return value


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _served(res: Resource, obj: Obj) -> Obj:
    """An object as the API serves it (and sends it to webhooks): with kind and apiVersion."""
    served: Obj = orjson.loads(res.render(_stored_form(obj)))
    return served


def _version(obj: Obj) -> Any:
    return (obj.get("metadata") or {}).get("resourceVersion")


def _stored_form(obj: Obj) -> bytes:
    """An object as the store keeps it: without kind and apiVersion."""
    return orjson.dumps({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})


def _name(target: Target) -> str:
    assert target.name is not None  # routed here only with a name
    return target.name


def _namespace(res: Resource, meta: Obj, namespace: str | None) -> None:
    """EnsureObjectNamespaceMatchesRequestNamespace."""
    if not res.kind.namespaced:
        meta.pop("namespace", None)
        return
    if meta.get("namespace", namespace) not in (namespace, "", None):
        raise ApiError(400, "the namespace of the provided object does not match the namespace sent on the request")
    meta["namespace"] = namespace


def _same_name(meta: Obj, name: str) -> None:
    if meta.get("name", name) != name:
        raise ApiError(400, f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})")
    meta["name"] = name


def _required_name() -> FieldError:
    return FieldError("FieldValueRequired", "metadata.name", None, "name or generateName is required")


def _options(kind: str, query: Mapping[str, str]) -> bool:
    """The options every write takes (dryRun, fieldManager, fieldValidation); True for a dry run."""
    errors: list[FieldError] = []
    dry_run = query.get("dryRun")
    if dry_run not in (None, "All"):
        errors.append(not_supported("dryRun", [dry_run], ("All",)))
    manager = query.get("fieldManager") or ""
    if len(manager) > _MAX_FIELD_MANAGER:
        errors.append(too_long("fieldManager", _MAX_FIELD_MANAGER))
    elif not manager.isprintable():
        errors.append(invalid("fieldManager", manager, "must only contain printable characters"))
    validation = query.get("fieldValidation")
    if validation not in (None, "", "Ignore", "Warn", "Strict"):
        errors.append(not_supported("fieldValidation", validation, ("Ignore", "Strict", "Warn")))
    if errors:
        raise invalid_error(kind, "meta.k8s.io", "", errors)
    return dry_run == "All"


def _preconditions(body: bytes) -> Mapping[str, Any]:
    if not body.strip():
        return {}
    try:
        options = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not JSON: {exc}") from None
    found = options.get("preconditions") if isinstance(options, dict) else None
    return found if isinstance(found, dict) else {}


def _status_only(new: Obj, current: Obj) -> Obj:
    """A status subresource's update: the stored object with the new status (statusStrategy.PrepareForUpdate,
    which copies the old object into the new one but for its status)."""
    kept: Obj = orjson.loads(orjson.dumps(current))
    if "status" in new:
        kept["status"] = new["status"]
    else:
        kept.pop("status", None)
    return kept


def _take_status(new: Obj, current: Obj) -> None:
    if "status" in current:
        new["status"] = current["status"]
    else:
        new.pop("status", None)


def _now() -> str:
    """The deletion's time, as metav1.Time writes it (RFC 3339, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _finalized(current: Obj, new: Obj) -> bool:
    """Does the update of an object being deleted (grace period over) take away its last finalizer?"""
    old_meta, meta = current["metadata"], new["metadata"]
    return (
        bool(old_meta.get("deletionTimestamp"))
        and old_meta.get("deletionGracePeriodSeconds") == 0
        and not meta.get("finalizers")
    )
