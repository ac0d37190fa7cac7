"""The pools' status in the API, for anyone who may `kubectl get`: one cluster-scoped `GPUPool`
(gpupool.io/v1alpha1, manifests/base/crd.yaml) per pool, which the queue's leader feeds after its passes
(webhook.queue.status) and `PoolStatusWriter` keeps in step from a thread of its own, as the EventRecorder
posts Events (webhook.sources.writes), so that writing them never delays a release:

- **Only on change.** `publish` replaces the state wanted (it never blocks: a newer one makes the older
  moot); the thread compares it with what it last wrote or listed and writes only the differences.
- **Rate-limited.** At most QPS writes a second, BURST at once, for all objects together.
- **Status only.** A missing object is created (its name, the label `app.kubernetes.io/managed-by:
  gpupool`, `spec.pool`), then only its status is written: a merge patch of the `status` subresource
  (kube-apiserver ignores a status in a create).
- **Its own only.** The objects of pools that are gone are deleted, only those with that label; an object
  of the same name without it is left alone (and said once in the log). The thread lists the objects when
  it first has something to write, every RESYNC_SECONDS (what was changed by hand is put right), and after
  a write it cannot place (a 409 on create).
- **Never in the way.** Every failure is logged and retried later (RETRY_SECONDS; MISSING_SECONDS while
  the API has no such resource, as before the CRD is installed): the queue goes on without its status.

The statuses themselves, and the objects' names: webhook.pools.statuses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.pools.statuses import Status
from webhook.sources.eventqueue import Bucket
from webhook.sources.writes import TIMEOUT

log = logging.getLogger("gpupool.poolstatus")

GROUP, VERSION, PLURAL = "gpupool.io", "v1alpha1", "gpupools"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpupool")
QPS = 5.0  # GPUPool writes a second, all objects together
BURST = 20
RETRY_SECONDS = 5.0  # after a write or list that failed
RESYNC_SECONDS = 300.0  # listed again this often: an object deleted or changed by hand is put right
MISSING_SECONDS = 60.0  # while the API serves no gpupools (the CRD is not installed)
IDLE_SECONDS = 5.0


# -- what to write next ----------------------------------------------------------------------------------


class Write(NamedTuple):
    """One write: `create` an object, write its `status`, or `delete` it."""

    verb: str
    name: str
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


# -- the writer -------------------------------------------------------------------------------------------


class PoolStatusWriter:
    """Keeps the GPUPool objects at the state last `publish`ed, from its own thread (module docstring)."""

    def __init__(
        self, api_client: Any, clock: Callable[[], float] = time.monotonic, *, qps: float = QPS, burst: int = BURST
    ) -> None:
        self._api = client.CustomObjectsApi(api_client)
        self._clock = clock
        self._bucket = Bucket(qps, burst, clock())
        self._lock = threading.Lock()
        self._wanted: dict[str, Status] | None = None  # None: nothing to keep (not leading)
        self._written: dict[str, Status | None] | None = None  # gpupool's objects as the API has them; None: to list
        self._foreign: set[str] = set()
        self._listed_at = float("-inf")
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-poolstatus", daemon=True)
        self.writes = 0  # writes made (for tests and the log)

    def start(self) -> PoolStatusWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(2.0)

    def publish(self, wanted: Mapping[str, Status]) -> None:
        """The statuses the objects should have now, by object name (never blocks)."""
        with self._lock:
            self._wanted = dict(wanted)
        self._wake.set()

    def forget(self) -> None:
        """No longer leading: write nothing more, and list again once something is published."""
        with self._lock:
            self._wanted, self._written = None, None
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()  # before the look: a publish after it wakes the wait below
            wait = self._step()
            if wait is None or wait > 0:
                self._wake.wait(IDLE_SECONDS if wait is None else wait)

    def _step(self) -> float | None:
        """One write (or list) if one is due: 0 to go on at once, seconds to wait, None when all agree."""
        with self._lock:
            wanted, written = self._wanted, self._written
        if wanted is None:
            return None
        if written is None or self._clock() - self._listed_at >= RESYNC_SECONDS:
            return self._list()
        write = next_write(wanted, written, self._foreign)
        if write is None:
            return None
        wait = self._bucket.wait(self._clock())
        if wait:
            return wait
        self._bucket.take()
        return self._write(write, written)

    def _list(self) -> float:
        try:
            listed: Any = self._api.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                log.warning("the API serves no %s.%s (is the CRD installed?): pools' status not written", PLURAL, GROUP)
                return MISSING_SECONDS
            log.warning("listing %s.%s: %s %s", PLURAL, GROUP, exc.status, exc.reason)
            return RETRY_SECONDS
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("listing %s.%s: %s", PLURAL, GROUP, exc)
            return RETRY_SECONDS
        written: dict[str, Status | None] = {}
        foreign = set()
        for item in listed.get("items") or []:
            meta = item.get("metadata") or {}
            if (meta.get("labels") or {}).get(MANAGED_BY[0]) == MANAGED_BY[1]:
                written[meta["name"]] = item.get("status")
            else:
                foreign.add(meta["name"])
        for name in sorted(foreign - self._foreign):
            log.warning("GPUPool %s is not labelled %s=%s: gpupool leaves it alone", name, *MANAGED_BY)
        with self._lock:
            if self._wanted is not None:  # not forgotten meanwhile
                self._written, self._foreign = written, foreign
        self._listed_at = self._clock()
        return 0.0

    def _write(self, write: Write, written: dict[str, Status | None]) -> float:
        try:
            if write.verb == "create":
                body = {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "GPUPool",
                    "metadata": {"name": write.name, "labels": dict([MANAGED_BY])},
                    "spec": {"pool": (write.status or {}).get("pool", "")},
                }
                self._api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body, _request_timeout=TIMEOUT)
                written[write.name] = None
            elif write.verb == "status":
                self._api.patch_cluster_custom_object_status(
                    GROUP, VERSION, PLURAL, write.name, {"status": write.status}, _request_timeout=TIMEOUT
                )
                written[write.name] = write.status
            else:
                self._api.delete_cluster_custom_object(GROUP, VERSION, PLURAL, write.name, _request_timeout=TIMEOUT)
                written.pop(write.name, None)
        except ApiException as exc:
            return self._failed(write, written, exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("GPUPool %s: %s failed: %s", write.name, write.verb, exc)
            return RETRY_SECONDS
        self.writes += 1
        return 0.0

    def _failed(self, write: Write, written: dict[str, Status | None], exc: ApiException) -> float:
        if exc.status == 404:  # deleted meanwhile (by hand): created again, or already gone
            written.pop(write.name, None)
            return 0.0
        if exc.status == 409 and write.verb == "create":  # there already: whose, the next list says
            with self._lock:
                self._written = None
            return 0.0
        log.warning("GPUPool %s: %s refused: %s %s", write.name, write.verb, exc.status, exc.reason)
        return RETRY_SECONDS
