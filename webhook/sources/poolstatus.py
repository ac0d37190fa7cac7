"""The queue's state in the API, for anyone who may `kubectl get`: one cluster-scoped `GPUPool`
(gpupool.io/v1alpha1, manifests/base/crd.yaml) per pool, and one ConfigMap `gpupool-queue` per namespace
with Pods waiting (what a namespace's users may read without cluster rights), which the queue's leader
feeds after its passes (webhook.queue.status) and `PoolStatusWriter` keeps in step from a thread of its
own, as the EventRecorder posts Events (webhook.sources.writes), so that writing them never delays a
release:

- **Only on change.** `publish` replaces the state wanted (it never blocks: a newer one makes the older
  moot); the thread compares it with what it last wrote or listed and writes only the differences.
- **Rate-limited.** At most QPS writes a second, BURST at once, for all objects together.
- **Status only.** A missing GPUPool is created (its name, the label `app.kubernetes.io/managed-by:
  gpupool`, `spec.pool`), then only its status is written: a merge patch of the `status` subresource
  (kube-apiserver ignores a status in a create). A ConfigMap is created with its data, then its data
  is patched.
- **Its own only.** The objects of pools that are gone (ConfigMaps of namespaces where no Pod waits any
  more) are deleted, only those with that label; an object
  of the same name without it is left alone (and said once in the log). The thread lists the objects when
  it first has something to write, every RESYNC_SECONDS (what was changed by hand is put right), and after
  a write it cannot place (a 409 on create: whose it is, the list says).
- **Never in the way.** Every failure is logged and retried later (RETRY_SECONDS; MISSING_SECONDS while
  the API has no such resource, as before the CRD is installed): the queue goes on without its status.

The statuses themselves, and the objects' names: webhook.pools.statuses; the namespaces' summaries:
webhook.queue.status.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.pools.statuses import Status
from webhook.sources.eventqueue import Bucket
from webhook.sources.rounds import Rounds
from webhook.sources.writes import TIMEOUT

log = logging.getLogger("gpupool.poolstatus")

GROUP, VERSION, PLURAL = "gpupool.io", "v1alpha1", "gpupools"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpupool")
SUMMARY = "gpupool-queue"  # the ConfigMap of each namespace's waiting Pods
QPS = 5.0  # GPUPool writes a second, all objects together
BURST = 20
RETRY_SECONDS = 5.0  # after a write or list that failed
RESYNC_SECONDS = 300.0  # listed again this often: an object deleted or changed by hand is put right
MISSING_SECONDS = 60.0  # while the API serves no such resource (the CRD is not installed)
IDLE_SECONDS = 5.0


# -- what to write next ----------------------------------------------------------------------------------


class Write(NamedTuple):
    """One write: `create` an object, write its `status` (a GPUPool's; a ConfigMap's data), or `delete` it."""

    verb: str
    name: str  # a GPUPool's name; a ConfigMap's namespace
    status: Status | None = None


def next_write(wanted: Mapping[str, Status], written: Mapping[str, Status | None], foreign: set[str]) -> Write | None:
    """The first write that brings the API's objects (`written`: gpupool's own, with the status last
    written, None for none yet) to `wanted`: creates and status writes by name, then deletions; None when
    they agree. `foreign` names objects gpupool does not own: never written."""
    for name in sorted(wanted):
        if name in foreign:
            continue
        if name not in written:
            return Write("create", name, wanted[name])
        if written[name] != wanted[name]:
            return Write("status", name, wanted[name])
    for name in sorted(written):
        if name not in wanted:
            return Write("delete", name)
    return None


# -- the objects kept: GPUPools and the namespaces' ConfigMaps ------------------------------------------


class Objects(Protocol):
    """One kind of object the writer keeps, each by a key (a GPUPool's name, a ConfigMap's namespace)."""

    what: str  # for the log

    def list(self) -> tuple[dict[str, Status | None], set[str]]:
        """gpupool's own objects (key -> what was last written, None for nothing yet), and the keys of
        objects of gpupool's name it does not own."""
        ...

    def create(self, key: str, value: Status) -> None: ...
    def update(self, key: str, value: Status) -> None: ...
    def delete(self, key: str) -> None: ...


def _owned(meta: Mapping[str, Any]) -> bool:
    return bool((meta.get("labels") or {}).get(MANAGED_BY[0]) == MANAGED_BY[1])


class GpuPools:
    what = "GPUPool"

    def __init__(self, api_client: Any) -> None:
        self._api = client.CustomObjectsApi(api_client)

    def list(self) -> tuple[dict[str, Status | None], set[str]]:
        listed: Any = self._api.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=TIMEOUT)
        ours: dict[str, Status | None] = {}
        foreign = set()
        for item in listed.get("items") or []:
            meta = item.get("metadata") or {}
            if _owned(meta):
                ours[meta["name"]] = item.get("status")
            else:
                foreign.add(meta["name"])
        return ours, foreign

    def create(self, key: str, value: Status) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GPUPool",
            "metadata": {"name": key, "labels": dict([MANAGED_BY])},
            "spec": {"pool": value.get("pool", "")},
        }
        self._api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body, _request_timeout=TIMEOUT)

    def update(self, key: str, value: Status) -> None:
        self._api.patch_cluster_custom_object_status(
            GROUP, VERSION, PLURAL, key, {"status": value}, _request_timeout=TIMEOUT
        )

    def delete(self, key: str) -> None:
        self._api.delete_cluster_custom_object(GROUP, VERSION, PLURAL, key, _request_timeout=TIMEOUT)


class QueueSummaries:
    """The ConfigMap `gpupool-queue` of each namespace (its `data`, all strings: webhook.queue.status)."""

    what = "ConfigMap gpupool-queue"

    def __init__(self, api_client: Any) -> None:
        self._core = client.CoreV1Api(api_client)

    def list(self) -> tuple[dict[str, Status | None], set[str]]:
        resp: Any = self._core.list_config_map_for_all_namespaces(
            field_selector=f"metadata.name={SUMMARY}", _preload_content=False, _request_timeout=TIMEOUT
        )
        ours: dict[str, Status | None] = {}
        foreign = set()
        for item in orjson.loads(resp.data).get("items") or []:
            meta = item.get("metadata") or {}
            if _owned(meta):
                ours[meta["namespace"]] = item.get("data") or {}
            else:
                foreign.add(meta["namespace"])
        return ours, foreign

    def create(self, key: str, value: Status) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": SUMMARY, "namespace": key, "labels": dict([MANAGED_BY])},
            "data": value,
        }
        self._core.create_namespaced_config_map(key, body, _request_timeout=TIMEOUT)

    def update(self, key: str, value: Status) -> None:
        # A JSON Patch replacing `data` whole: a key the summary no longer has goes too.
        patch: Any = [{"op": "add", "path": "/data", "value": value}]
        self._core.patch_namespaced_config_map(SUMMARY, key, patch, _request_timeout=TIMEOUT)

    def delete(self, key: str) -> None:
        self._core.delete_namespaced_config_map(SUMMARY, key, _request_timeout=TIMEOUT)


@dataclass
class _Kept:
    """What the writer keeps of one kind: the state wanted, what the API has, whose objects to leave."""

    objects: Objects
    wanted: dict[str, Status] | None = None  # None: nothing to keep (not leading)
    written: dict[str, Status | None] | None = None  # gpupool's objects as the API has them; None: to list
    foreign: set[str] = field(default_factory=set)
    listed_at: float = float("-inf")


# -- the writer -------------------------------------------------------------------------------------------


class PoolStatusWriter:
    """Keeps the GPUPool objects and the namespaces' ConfigMaps at the state last published, from its own
    thread (module docstring)."""

    def __init__(
        self, api_client: Any, clock: Callable[[], float] = time.monotonic, *, qps: float = QPS, burst: int = BURST
    ) -> None:
        self._clock = clock
        self._bucket = Bucket(qps, burst, clock())
        self._lock = threading.Lock()
        self._pools = _Kept(GpuPools(api_client))
        self._queues = _Kept(QueueSummaries(api_client))
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-poolstatus", daemon=True)
        self.writes = 0  # writes made (for tests and the log)
        self.rounds = Rounds(clock)  # the write or list under way, for the leader process's heartbeat

    def start(self) -> PoolStatusWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(2.0)

    def publish(self, wanted: Mapping[str, Status]) -> None:
        """The statuses the GPUPools should have now, by object name (never blocks)."""
        self._publish(self._pools, wanted)

    def publish_queues(self, wanted: Mapping[str, Status]) -> None:
        """The data each namespace's ConfigMap `gpupool-queue` should hold now, by namespace (never blocks)."""
        self._publish(self._queues, wanted)

    def _publish(self, kept: _Kept, wanted: Mapping[str, Status]) -> None:
        with self._lock:
            kept.wanted = dict(wanted)
        self._wake.set()

    def forget(self) -> None:
        """No longer leading: write nothing more, and list again once something is published."""
        with self._lock:
            for kept in (self._pools, self._queues):
                kept.wanted, kept.written = None, None
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()  # before the look: a publish after it wakes the wait below
            self.rounds.begin()
            waits = [self._step(kept) for kept in (self._pools, self._queues)]
            self.rounds.end()
            due = [w for w in waits if w is not None]
            if not due or min(due) > 0:
                self._wake.wait(min(due, default=IDLE_SECONDS))

    def _step(self, kept: _Kept) -> float | None:
        """One write (or list) of a kind if one is due: 0 to go on at once, seconds to wait, None when all agree."""
        with self._lock:
            wanted, written = kept.wanted, kept.written
        if wanted is None:
            return None
        if written is None or self._clock() - kept.listed_at >= RESYNC_SECONDS:
            return self._list(kept)
        write = next_write(wanted, written, kept.foreign)
        if write is None:
            return None
        wait = self._bucket.wait(self._clock())
        if wait:
            return wait
        self._bucket.take()
        return self._write(kept, write, written)

    def _list(self, kept: _Kept) -> float:
        what = kept.objects.what
        try:
            written, foreign = kept.objects.list()
        except ApiException as exc:
            if exc.status == 404:
                log.warning("the API serves no %s (is the CRD installed?): not written", what)
                return MISSING_SECONDS
            log.warning("listing %s: %s %s", what, exc.status, exc.reason)
            return RETRY_SECONDS
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("listing %s: %s", what, exc)
            return RETRY_SECONDS
        for key in sorted(foreign - kept.foreign):
            log.warning("%s %s is not labelled %s=%s: gpupool leaves it alone", what, key, *MANAGED_BY)
        with self._lock:
            if kept.wanted is not None:  # not forgotten meanwhile
                kept.written, kept.foreign = written, foreign
        kept.listed_at = self._clock()
        return 0.0

    def _write(self, kept: _Kept, write: Write, written: dict[str, Status | None]) -> float:
        objects = kept.objects
        try:
            if write.verb == "create":
                objects.create(write.name, write.status or {})
                written[write.name] = None if objects is self._pools.objects else write.status
            elif write.verb == "status":
                objects.update(write.name, write.status or {})
                written[write.name] = write.status
            else:
                objects.delete(write.name)
                written.pop(write.name, None)
        except ApiException as exc:
            return self._failed(kept, write, written, exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("%s %s: %s failed: %s", objects.what, write.name, write.verb, exc)
            return RETRY_SECONDS
        self.writes += 1
        return 0.0

    def _failed(self, kept: _Kept, write: Write, written: dict[str, Status | None], exc: ApiException) -> float:
        if exc.status == 404 and write.verb != "create":  # deleted meanwhile (by hand): created again, or gone
            written.pop(write.name, None)
            return 0.0
        if exc.status == 409 and write.verb == "create":  # there already: whose, the next list says
            with self._lock:
                kept.written = None
            return 0.0
        log.warning("%s %s: %s refused: %s %s", kept.objects.what, write.name, write.verb, exc.status, exc.reason)
        return RETRY_SECONDS
