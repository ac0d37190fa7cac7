"""The simulator's storage: one etcd-like, multi-version store for every kind it serves.

Every write takes the next value of one global resourceVersion (as etcd's revision does across all
kinds) and appends one event to a bounded history. The history is what makes the two consistency
promises of the real API possible: a watch resumes by replaying it, and every page of a paginated list
is served from the state as of its first page, rebuilt by undoing the history written since. Anything
older than the history is "compacted" and answers 410 Gone, as etcd does after compaction.

Objects are kept as pre-encoded JSON (without `kind`/`apiVersion`, which the real API also leaves out
of list items), so a page of 500 Pods is one `b",".join` and never a re-encoding.
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Kind:
    """One stored resource type, in the API version it is stored in (events.k8s.io/v1 Events are a
    view of the core ones, as in kube-apiserver: see webhook.testing.kuberesources)."""

    kind: str
    plural: str
    namespaced: bool
    api_version: str = "v1"

    @property
    def event_prefix(self) -> bytes:
        """The start of an object in a watch event, where `kind` and `apiVersion` are present."""
        return b'{"kind":"' + self.kind.encode() + b'","apiVersion":"' + self.api_version.encode() + b'",'


KINDS: tuple[Kind, ...] = (
    Kind("Node", "nodes", namespaced=False),
    Kind("Pod", "pods", namespaced=True),
    Kind("ResourceQuota", "resourcequotas", namespaced=True),
    Kind("Event", "events", namespaced=True),
    Kind("Lease", "leases", namespaced=True, api_version="coordination.k8s.io/v1"),
    Kind("ConfigMap", "configmaps", namespaced=True),  # mig-parted's config, which the leader reads
    # gpupool's own CustomResource (manifests/base/crd.yaml): the pools' status the leader writes
    Kind("GPUPool", "gpupools", namespaced=False, api_version="gpupool.io/v1alpha1"),
)
_BY_NAME: dict[str, Kind] = {k.kind.lower(): k for k in KINDS} | {k.plural: k for k in KINDS}


def kind_of(name: str) -> Kind:
    """The Kind for `Pod`, `pod` or `pods`; KeyError for kinds the simulator does not serve."""
    try:
        return _BY_NAME[name.lower()]
    except KeyError:
        served = ", ".join(k.plural for k in KINDS)
        raise KeyError(f"kubesim serves only {served}, not {name!r}") from None


class Expired(Exception):
    """The asked-for resourceVersion is older than the retained history (HTTP 410, reason Expired)."""


class TooLarge(Exception):
    """The asked-for resourceVersion is newer than the store (HTTP 504, as kube-apiserver answers)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One write. `body` is the object after it (for DELETED: its last state at the deletion's
    resourceVersion); `prev` is the stored body before it, kept to rebuild older snapshots."""

    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    kind: Kind
    namespace: str
    key: str
    body: bytes
    prev: bytes | None
    # time.monotonic() when the write was stored (CLOCK_MONOTONIC: on Linux one clock for every process of
    # the machine), so a benchmark can time a client's reaction from the cluster's side (kubeaudit).
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """All objects of one kind at one resourceVersion, sorted by key like etcd's range reads."""

    rv: int
    keys: list[str]
    bodies: list[bytes]

    def bounds(self, namespace: str | None) -> tuple[int, int]:
        """Index range of one namespace (keys are `namespace/name`), or of everything."""
        if namespace is None:
            return 0, len(self.keys)
        # "0" is the character after "/", so this range holds exactly the keys under "namespace/".
        return bisect_left(self.keys, namespace + "/"), bisect_left(self.keys, namespace + "0")


def object_key(kind: Kind, namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if kind.namespaced else name


def encode_continue(rv: int, last_key: str) -> str:
    """A continue token in kube-apiserver's shape: the snapshot revision and where to start."""
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": last_key + "\x00"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    """(revision, first key to return); ValueError for a token this simulator did not make."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
        rv, start = data["rv"], data["start"]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError("continue key is not valid") from exc
    if data.get("v") != "meta.k8s.io/v1" or not isinstance(rv, int) or not isinstance(start, str):
        raise ValueError("continue key is not valid")
    return rv, start


def _compact(encoded: bytes) -> bytes:
    """An exact-size copy. Kept as they come from orjson, 150,000 Pods of about 2 KB took 1.3 GB of
    RSS (the allocator does not reuse what their buffers were shrunk from); copied, 0.38 GB."""
    return bytes(memoryview(encoded))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Store:
    """The versioned object store. Thread-safe; `changed` is notified after every write, so watch
    streams can wait on it (the simulator also notifies it when a fault needs watchers to wake)."""

    def __init__(self, history_limit: int = 100_000, first_rv: int = 1000, snapshot_cache: int = 8) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self.changed = threading.Condition(threading.RLock())
        self._limit = history_limit
        self._cache_size = snapshot_cache
        self._rv = first_rv
        self._objects: dict[Kind, dict[str, bytes]] = {k: {} for k in KINDS}
        # Invariant: _history[i].rv == _base + i. Every write takes exactly one revision, so a
        # watch finds where to resume by subtraction.
        self._history: list[Event] = []
        self._base = first_rv + 1
        self._snapshots: OrderedDict[tuple[Kind, int], Snapshot] = OrderedDict()

    @property
    def rv(self) -> int:
        """The newest resourceVersion."""
        with self.changed:
            return self._rv

    @property
    def oldest_rv(self) -> int:
        """The oldest resourceVersion that a watch can resume from or a list can be read at."""
        with self.changed:
            return self._base - 1

    # -- writes ---------------------------------------------------------------------------------

    def put(self, obj: Mapping[str, Any], *, exists: bool | None) -> tuple[Event, bytes]:
        """Add or replace one object; `exists` True requires it to exist, False requires it not to,
        None accepts both. Returns the event and the stored body."""
        with self.changed:
            event = self._put(obj, exists, _now())
            self._after_writes()
            return event, event.body

    def load(self, objects: Iterable[Mapping[str, Any]]) -> int:
        """Add or replace many objects under one lock hold; returns the newest resourceVersion."""
        created = _now()
        with self.changed:
            for obj in objects:
                self._put(obj, None, created)
            self._after_writes()
            return self._rv

    def remove(self, kind: Kind, namespace: str, name: str) -> Event:
        """Delete one object; KeyError when it does not exist."""
        key = object_key(kind, namespace, name)
        with self.changed:
            current = self._objects[kind].pop(key)
            self._rv += 1
            last = orjson.loads(current)
            last["metadata"]["resourceVersion"] = str(self._rv)
            body = _compact(orjson.dumps(last))
            event = Event(self._rv, "DELETED", kind, namespace, key, body, current, time.monotonic())
            self._history.append(event)
            self._after_writes()
            return event

    def _put(self, obj: Mapping[str, Any], exists: bool | None, created: str) -> Event:
        kind = kind_of(str(obj.get("kind", "")))
        stored = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        meta = dict(stored.get("metadata") or {})
        name = meta.get("name")
        namespace = meta.get("namespace", "") if kind.namespaced else ""
        if not name or (kind.namespaced and not namespace):
            raise ValueError(f"{kind.kind} needs metadata.name" + (" and namespace" if kind.namespaced else ""))
        key = object_key(kind, namespace, name)
        objects = self._objects[kind]
        prev = objects.get(key)
        if exists is True and prev is None:
            raise KeyError(f"{kind.kind} {key} does not exist")
        if exists is False and prev is not None:
            raise ValueError(f"{kind.kind} {key} already exists")
        if prev is not None and ("uid" not in meta or "creationTimestamp" not in meta):
            # An update keeps the identity the API server gave the object when it was created.
            old = orjson.loads(prev)["metadata"]
            meta.setdefault("uid", old.get("uid"))
            meta.setdefault("creationTimestamp", old.get("creationTimestamp"))
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", created)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        stored["metadata"] = meta
        body = _compact(orjson.dumps(stored))
        objects[key] = body
        event = Event(self._rv, "MODIFIED" if prev else "ADDED", kind, namespace, key, body, prev, time.monotonic())
        self._history.append(event)
        return event

    def _after_writes(self) -> None:
        # Trim in slices of a quarter of the limit so that appending stays amortised O(1).
        excess = len(self._history) - self._limit
        if excess > self._limit // 4:
            del self._history[:excess]
            self._base += excess
            self._forget_snapshots()
        self.changed.notify_all()

    def compact(self) -> None:
        """Forget all history: every older resourceVersion and continue token now gives 410."""
        with self.changed:
            self._history.clear()
            self._base = self._rv + 1
            self._snapshots.clear()
            self.changed.notify_all()

    def _forget_snapshots(self) -> None:
        for key in [k for k in self._snapshots if k[1] < self._base - 1]:
            del self._snapshots[key]

    # -- reads ----------------------------------------------------------------------------------

    def get(self, kind: Kind, namespace: str, name: str) -> bytes | None:
        with self.changed:
            return self._objects[kind].get(object_key(kind, namespace, name))

    def snapshot(self, kind: Kind, rv: int | None = None) -> Snapshot:
        """The objects of `kind` at `rv` (default: now). Expired if `rv` is older than the history,
        TooLarge if it is newer than the store."""
        with self.changed:
            at = self._rv if rv is None else rv
            if at > self._rv:
                raise TooLarge(f"Too large resource version: {at}, current: {self._rv}")
            if at < self._base - 1:
                raise Expired(f"too old resource version: {at} ({self._base - 1})")
            cached = self._snapshots.get((kind, at))
            if cached is not None:
                self._snapshots.move_to_end((kind, at))
                return cached
            state = dict(self._objects[kind])
            # Undo, newest first, every write of this kind made after `at`.
            for event in reversed(self._history[at + 1 - self._base :]):
                if event.kind is not kind:
                    continue
                if event.prev is None:
                    del state[event.key]
                else:
                    state[event.key] = event.prev
            items = sorted(state.items())
            snap = Snapshot(at, [k for k, _ in items], [b for _, b in items])
            self._snapshots[(kind, at)] = snap
            while len(self._snapshots) > self._cache_size:
                self._snapshots.popitem(last=False)
            return snap

    def events_after(self, rv: int, limit: int) -> tuple[list[Event], int]:
        """Up to `limit` events newer than `rv` (all kinds) and the revision they reach; Expired if
        events after `rv` were compacted away."""
        with self.changed:
            start = rv + 1 - self._base
            if start < 0:
                raise Expired(f"too old resource version: {rv} ({self._base - 1})")
            events = self._history[start : start + limit]
            # History is contiguous, so no events means `rv` is already the newest revision (or newer).
            return events, (events[-1].rv if events else rv)
