"""gpupool's writes to the Kubernetes API, beside its reads: the queue's releases, its Lease, its Events.

Every call has a client-side timeout (a dead connection otherwise hangs forever) and answers in gpupool's
terms, never with an exception the caller must know the client's types for:

- `PodReleaser.release`: one JSON Patch of a Pod. The patch carries the resourceVersion the release was
  decided on, which kube-apiserver takes as a precondition: `Conflict` (409) when the Pod changed since,
  `Gone` (404) when it was deleted, `Refused` for anything else the API would not take (422 from a rule
  gpupool broke, which must never happen, is logged loudly).
- `LeaseStore`: get, create and replace of one `coordination.k8s.io/v1` Lease with optimistic
  concurrency (the replace carries the resourceVersion read), for webhook.queue.leader.
- `NodeLabeler`: reads a node, and PATCHes it (a JSON Patch, built from the node read) with the
  resourceVersion it read as a precondition: the MIG re-cut's `nvidia.com/mig.config` label and gpupool's annotations
  (webhook.queue.reshape), answered as a release is (`Released` with the node, `Conflict`, `Gone`, `Refused`).
- `ConfigMapText`: the text of one key of a ConfigMap (mig-parted's config, which mig-manager applies).
- `EventRecorder.record`: a core/v1 Event on a Pod (or a Node), best effort, on a thread of its own, so telling never
  slows releasing; per namespace in turn, rate-limited and coalesced (webhook.sources.eventqueue).
  `record_event` creates one at once, for a command (`kubectl gpupool release`).
- `whoami`: the user kube-apiserver authenticates the client as, for a release by hand to name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.sources.eventqueue import Event, EventQueue
from webhook.sources.outcomes import (
    Conflict,
    Gone,
    LeaseError,
    LeaseRecord,
    Refused,
    Released,
    ReleaseResult,
)
from webhook.sources.rounds import Rounds

log = logging.getLogger("gpupool.writes")

__all__ = [
    "Conflict",
    "Event",
    "EventRecorder",
    "Gone",
    "LeaseError",
    "LeaseRecord",
    "LeaseStore",
    "NodeLabeler",
    "PodReleaser",
    "Refused",
    "ReleaseResult",
    "Released",
    "event_body",
    "record_event",
    "whoami",
]

TIMEOUT = (5.0, 10.0)  # connect, read: a write that takes longer is a write that failed
IDLE_SECONDS = 5.0  # the Event thread looks at least this often while nothing is put


class PodReleaser:
    """PATCHes queued Pods (webhook.queue.release builds the patch)."""

    def __init__(self, api_client: Any) -> None:
        self._core = client.CoreV1Api(api_client)

    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        try:
            # A list body is sent as a JSON Patch (application/json-patch+json) by the client.
            resp: Any = self._core.patch_namespaced_pod(
                name, namespace, patch, _preload_content=False, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            return _failure(exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Refused(0, f"{type(exc).__name__}: {exc}")
        return Released(orjson.loads(resp.data))

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod as the API has it now; None when it is gone. Raises OSError when the API cannot be asked
        (after a release whose answer was lost, this tells whether it was written)."""
        return _read(f"Pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace)


def _failure(exc: ApiException) -> ReleaseResult:
    message = _message(exc)
    if exc.status == 409:
        return Conflict(message)
    if exc.status == 404:
        return Gone(message)
    if exc.status == 422:
        log.error("kube-apiserver refused a release as invalid (a gpupool bug): %s", message)
    return Refused(int(exc.status or 0), message)


def _read(what: str, call: Any, *args: str) -> dict[str, Any] | None:
    """One object read with `call(*args)`: None when it is gone (404); OSError naming `what` when the API
    cannot be asked."""
    try:
        resp: Any = call(*args, _preload_content=False, _request_timeout=TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise OSError(f"reading {what}: {exc.status} {_message(exc)}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise OSError(f"reading {what}: {exc}") from None
    obj: dict[str, Any] = orjson.loads(resp.data)
    return obj


def _message(exc: ApiException) -> str:
    try:
        body = orjson.loads(exc.body or b"{}")
    except orjson.JSONDecodeError:
        return str(exc.reason)
    return str(body.get("message") or exc.reason) if isinstance(body, dict) else str(exc.reason)


class NodeLabeler:
    """Reads and patches nodes: the only node writes gpupool makes (webhook.queue.reshape)."""

    def __init__(self, api_client: Any) -> None:
        self._core = client.CoreV1Api(api_client)

    def read(self, name: str) -> dict[str, Any] | None:
        """The node as the API has it now; None when it is gone. Raises OSError when the API cannot be asked."""
        return _read(f"Node {name}", self._core.read_node, name)

    def patch(self, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        """A JSON Patch of the node; one that sets `metadata.resourceVersion` to the version read makes
        it conditional (409 when the node changed since)."""
        try:
            resp: Any = self._core.patch_node(name, patch, _preload_content=False, _request_timeout=TIMEOUT)
        except ApiException as exc:
            return _failure(exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Refused(0, f"{type(exc).__name__}: {exc}")
        return Released(orjson.loads(resp.data))


class ConfigMapText:
    """One ConfigMap's text (its `key`, or its only key), read on each call: mig-parted's config."""

    def __init__(self, api_client: Any) -> None:
        self._core = client.CoreV1Api(api_client)

    def read(self, namespace: str, name: str, key: str = "config.yaml") -> str:
        """The text; raises OSError naming the ConfigMap when it is missing, unreadable or has no such key."""
        try:
            cm: Any = self._core.read_namespaced_config_map(name, namespace, _request_timeout=TIMEOUT)
        except ApiException as exc:
            raise OSError(f"reading ConfigMap {namespace}/{name}: {exc.status} {_message(exc)}") from None
        except urllib3.exceptions.HTTPError as exc:
            raise OSError(f"reading ConfigMap {namespace}/{name}: {exc}") from None
        data: dict[str, str] = dict(cm.data or {})
        if key in data:
            return data[key]
        if len(data) == 1:
            return next(iter(data.values()))
        raise OSError(f"ConfigMap {namespace}/{name} has no key {key!r} (it has {', '.join(sorted(data)) or 'none'})")


class LeaseStore:
    """One Lease, read and written with optimistic concurrency."""

    def __init__(self, api_client: Any, namespace: str, name: str, timeout: tuple[float, float] = TIMEOUT) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self.namespace, self.name = namespace, name
        self._timeout = timeout

    def get(self) -> LeaseRecord | None:
        """The Lease's record; None when there is no Lease."""
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise LeaseError(f"reading Lease {self.namespace}/{self.name}: {exc.status} {_message(exc)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise LeaseError(f"reading Lease {self.namespace}/{self.name}: {exc}") from None
        return _record(lease)

    def create(self, record: LeaseRecord) -> LeaseRecord | None:
        """Create the Lease; None when another candidate created it first."""
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name), spec=_spec(record))
        return self._write(
            lambda: self._api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout)
        )

    def replace(self, record: LeaseRecord) -> LeaseRecord | None:
        """Replace the Lease read at `record.resource_version`; None when it changed since (409)."""
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, resource_version=record.resource_version), spec=_spec(record)
        )
        return self._write(
            lambda: self._api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=self._timeout)
        )

    def _write(self, call: Any) -> LeaseRecord | None:
        try:
            return _record(call())
        except ApiException as exc:
            if exc.status in (409, 404):
                return None
            raise LeaseError(f"writing Lease {self.namespace}/{self.name}: {exc.status} {_message(exc)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise LeaseError(f"writing Lease {self.namespace}/{self.name}: {exc}") from None


def _spec(record: LeaseRecord) -> Any:
    return client.V1LeaseSpec(
        holder_identity=record.holder or None,
        lease_duration_seconds=record.duration_seconds,
        acquire_time=record.acquire_time,
        renew_time=record.renew_time,
        lease_transitions=record.transitions,
    )


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec or client.V1LeaseSpec()
    return LeaseRecord(
        holder=spec.holder_identity or "",
        duration_seconds=int(spec.lease_duration_seconds or 0),
        acquire_time=spec.acquire_time,
        renew_time=spec.renew_time,
        transitions=int(spec.lease_transitions or 0),
        resource_version=str(lease.metadata.resource_version or ""),
    )


class EventRecorder:
    """Creates Events on Pods from a thread of its own, as webhook.sources.eventqueue lets them go: per
    namespace in turn, rate-limited and coalesced. `record` never blocks."""

    COMPONENT = "gpupool"

    def __init__(self, api_client: Any, reporting_instance: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._core = client.CoreV1Api(api_client)
        self._instance = reporting_instance
        self._clock = clock
        self._queue = EventQueue(clock())
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-events", daemon=True)
        self.rounds = Rounds(clock)  # the Event being created, for the leader process's heartbeat

    @property
    def dropped(self) -> int:
        return self._queue.dropped

    def start(self) -> EventRecorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._queue.wake.set()
        self._thread.join(2.0)

    def record(self, event: Event) -> None:
        self._queue.put(event)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._queue.wake.clear()  # before the look: an Event put after it wakes the wait below
            event, wait = self._queue.take(self._clock())
            if event is None:
                self._queue.wake.wait(wait or IDLE_SECONDS)
                continue
            self.rounds.begin()
            try:
                self._core.create_namespaced_event(event.namespace, self._body(event), _request_timeout=TIMEOUT)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                log.debug("could not record event %s on %s/%s: %s", event.reason, event.namespace, event.pod, exc)
            self.rounds.end()

    def _body(self, event: Event) -> Any:  # a dict the client sends as it is
        return event_body(event, self.COMPONENT, self._instance)


def event_body(event: Event, component: str, instance: str) -> dict[str, Any]:
    """The core/v1 Event on a Pod, as gpupool creates it."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{event.pod}.", "namespace": event.namespace},
            "involvedObject": {
                "apiVersion": "v1", "kind": event.involved, "name": event.pod, "uid": event.uid,
                **({"namespace": event.namespace} if event.involved == "Pod" else {}),
            },
            "reason": event.reason,
            "message": event.message[:1024],
            "type": event.kind,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }  # fmt: skip


def record_event(api_client: Any, event: Event, component: str, instance: str) -> str:
    """Create one Event now, as the caller makes it (a command, not the webhook): "" when it was
    created, else why not."""
    body: Any = event_body(event, component, instance)  # a dict the client sends as it is
    try:
        client.CoreV1Api(api_client).create_namespaced_event(event.namespace, body, _request_timeout=TIMEOUT)
    except ApiException as exc:
        return f"{exc.status} {_message(exc)}"
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def whoami(api_client: Any) -> str:
    """The username kube-apiserver authenticates this client as (a SelfSubjectReview, what `kubectl auth
    whoami` asks). Raises OSError when it cannot tell (an API before Kubernetes 1.28, or no answer)."""
    body: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        resp: Any = client.AuthenticationV1Api(api_client).create_self_subject_review(
            body, _preload_content=False, _request_timeout=TIMEOUT
        )
    except ApiException as exc:
        raise OSError(f"asking kube-apiserver who you are (SelfSubjectReview): {exc.status} {_message(exc)}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise OSError(f"asking kube-apiserver who you are (SelfSubjectReview): {exc}") from None
    answer = orjson.loads(resp.data)
    user = ((answer.get("status") or {}).get("userInfo") or {}).get("username") if isinstance(answer, dict) else None
    if not isinstance(user, str) or not user:
        raise OSError("kube-apiserver's SelfSubjectReview named no user")
    return user
