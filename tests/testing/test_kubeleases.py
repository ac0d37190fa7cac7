"""Leases (coordination.k8s.io/v1) and Events (core/v1 and events.k8s.io/v1) in the API simulator, through
the real `kubernetes` client: CoordinationV1Api, the client's own `leaderelection` with `LeaseLock`,
CoreV1Api and EventsV1Api, and the discovery documents that name their groups.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import orjson
import pytest
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from webhook.testing import KubeSim

pytestmark = [pytest.mark.slow, pytest.mark.empty_cluster]  # every test serves HTTP from an empty simulator

NS = "gpupool-system"
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def lease(holder: str, when: datetime | None = None) -> kubernetes.client.V1Lease:
    when = when or datetime.now(UTC)
    spec = kubernetes.client.V1LeaseSpec(
        holder_identity=holder, lease_duration_seconds=15, acquire_time=when, renew_time=when
    )
    return kubernetes.client.V1Lease(metadata={"name": "gpupool"}, spec=spec)


def refused(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(kubernetes.client.ApiException) as err:
        call(*args, _request_timeout=TIMEOUT, **kwargs)
    status: dict[str, Any] = orjson.loads(err.value.body)
    return status


class TestLeases:
    def test_create_get_update_with_the_stored_micro_times(
        self, sim: KubeSim, client: kubernetes.client.ApiClient
    ) -> None:
        """Times go on the wire as the client writes them (+00:00) and are stored as the API stores a
        MicroTime: UTC, six fraction digits, Z."""
        api = kubernetes.client.CoordinationV1Api(client)
        when = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)
        created = api.create_namespaced_lease(NS, lease("a", when), _request_timeout=TIMEOUT)
        stored = sim.get("Lease", NS, "gpupool")
        assert stored is not None and stored["apiVersion"] == "coordination.k8s.io/v1"
        assert stored["spec"]["renewTime"] == "2026-12-01T10:00:00.123456Z"
        assert created.spec.renew_time == when
        created.spec.holder_identity = "b"
        updated = api.replace_namespaced_lease("gpupool", NS, created, _request_timeout=TIMEOUT)
        assert updated.spec.holder_identity == "b"
        assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
        assert api.read_namespaced_lease("gpupool", NS, _request_timeout=TIMEOUT).spec.holder_identity == "b"

    def test_an_update_needs_the_current_resource_version(self, client: kubernetes.client.ApiClient) -> None:
        """A stale one is 409 Conflict; none at all is 422 (a Lease allows no unconditional update)."""
        api = kubernetes.client.CoordinationV1Api(client)
        created = api.create_namespaced_lease(NS, lease("a"), _request_timeout=TIMEOUT)
        created.spec.holder_identity = "b"
        api.replace_namespaced_lease("gpupool", NS, created, _request_timeout=TIMEOUT)
        created.spec.holder_identity = "c"
        stale = refused(api.replace_namespaced_lease, "gpupool", NS, created)
        assert (stale["code"], stale["reason"]) == (409, "Conflict")
        assert stale["message"].startswith('Operation cannot be fulfilled on leases.coordination.k8s.io "gpupool"')
        created.metadata.resource_version = None
        unconditional = refused(api.replace_namespaced_lease, "gpupool", NS, created)
        assert (unconditional["code"], unconditional["message"]) == (
            422,
            'leases.coordination.k8s.io "gpupool" is invalid: metadata.resourceVersion: Invalid value: 0: '
            "must be specified for an update",
        )

    def test_a_second_create_is_already_exists_a_put_of_a_missing_one_creates(
        self, sim: KubeSim, client: kubernetes.client.ApiClient
    ) -> None:
        api = kubernetes.client.CoordinationV1Api(client)
        api.create_namespaced_lease(NS, lease("a"), _request_timeout=TIMEOUT)
        assert refused(api.create_namespaced_lease, NS, lease("b"))["reason"] == "AlreadyExists"
        body = lease("c")
        body.metadata = {"name": "other"}
        api.replace_namespaced_lease("other", NS, body, _request_timeout=TIMEOUT)
        assert sim.get("Lease", NS, "other") is not None

    @pytest.mark.parametrize(
        ("spec", "field"),
        [
            pytest.param({"leaseDurationSeconds": 0}, "spec.leaseDurationSeconds", id="zero-duration"),
            pytest.param({"leaseTransitions": -1}, "spec.leaseTransitions", id="negative-transitions"),
            pytest.param({"preferredHolder": "a"}, "spec.preferredHolder", id="holder-without-strategy"),
        ],
    )
    def test_an_invalid_spec_is_422(
        self, client: kubernetes.client.ApiClient, spec: dict[str, Any], field: str
    ) -> None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "x"}, "spec": spec}
        status = refused(kubernetes.client.CoordinationV1Api(client).create_namespaced_lease, NS, body)
        assert (status["code"], [c["field"] for c in status["details"]["causes"]]) == (422, [field])

    def test_a_time_not_in_rfc3339_micro_is_a_bad_request(self, client: kubernetes.client.ApiClient) -> None:
        """Go parses a MicroTime with exactly six fraction digits and an offset."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "x"}}
        body["spec"] = {"renewTime": "2026-12-01T10:00:00Z"}
        status = refused(kubernetes.client.CoordinationV1Api(client).create_namespaced_lease, NS, body)
        assert (status["code"], status["reason"]) == (400, "BadRequest")
        assert "2006-01-02T15:04:05.000000Z07:00" in status["message"]

    def test_patch_list_watch_and_delete(self, sim: KubeSim, client: kubernetes.client.ApiClient) -> None:
        api = kubernetes.client.CoordinationV1Api(client)
        created = api.create_namespaced_lease(NS, lease("a"), _request_timeout=TIMEOUT)
        stream = kubernetes.watch.Watch().stream(
            api.list_namespaced_lease, NS, resource_version=created.metadata.resource_version, timeout_seconds=TIMEOUT
        )
        api.patch_namespaced_lease("gpupool", NS, {"spec": {"holderIdentity": "b"}}, _request_timeout=TIMEOUT)
        event = next(stream)
        assert (event["type"], event["object"].spec.holder_identity) == ("MODIFIED", "b")
        assert [item.metadata.name for item in api.list_namespaced_lease(NS, _request_timeout=TIMEOUT).items] == [
            "gpupool"
        ]
        api.delete_namespaced_lease("gpupool", NS, _request_timeout=TIMEOUT)
        assert sim.get("Lease", NS, "gpupool") is None

    def test_discovery_names_the_coordination_and_events_groups(self, client: kubernetes.client.ApiClient) -> None:
        groups = {
            g.name: g.preferred_version.group_version
            for g in kubernetes.client.ApisApi(client).get_api_versions().groups
        }
        assert groups == {
            "coordination.k8s.io": "coordination.k8s.io/v1",
            "events.k8s.io": "events.k8s.io/v1",
            "gpupool.io": "gpupool.io/v1alpha1",
        }
        resources = kubernetes.client.CoordinationV1Api(client).get_api_resources(_request_timeout=TIMEOUT).resources
        assert [(r.name, r.namespaced, "update" in r.verbs) for r in resources] == [("leases", True, True)]
        core = {
            r.name for r in kubernetes.client.CoreV1Api(client).get_api_resources(_request_timeout=TIMEOUT).resources
        }
        assert core == {
            "nodes",
            "pods",
            "resourcequotas",
            "events",
            "configmaps",
            "nodes/status",
            "resourcequotas/status",
        }


LEASE_SECONDS = 2  # the shortest whole lease the client takes with its shortest retry period (1 s)


class _Candidate:
    """One `kubernetes.leaderelection.LeaderElection` with a LeaseLock, in a thread; `resign()` makes its
    leading callback fail, so its renew loop stops renewing (as a process that stops would)."""

    def __init__(self, identity: str, log: list[tuple[float, str, str]], lock: threading.Lock) -> None:
        self.identity = identity
        self._resign = threading.Event()
        self._log, self._lock = log, lock
        config = electionconfig.Config(
            LeaseLock("gpupool", NS, identity),
            lease_duration=LEASE_SECONDS,
            renew_deadline=1.5,  # the client's floors: above 1.2 retry periods, below the lease duration
            retry_period=1,
            onstarted_leading=self._lead,
            onstopped_leading=lambda: self._record("stopped"),
        )
        self.thread = threading.Thread(target=leaderelection.LeaderElection(config).run, daemon=True)

    def _record(self, what: str) -> None:
        with self._lock:
            self._log.append((time.monotonic(), self.identity, what))

    def _lead(self) -> None:
        self._record("leading")
        self._resign.wait()
        raise RuntimeError(f"{self.identity} resigns")  # LeaderElection stops renewing when this raises

    def resign(self) -> None:
        self._resign.set()


@pytest.fixture
def default_client(sim: KubeSim, tmp_path: Path) -> Iterator[None]:
    """LeaseLock uses the client's default configuration: point it at the simulator for the test."""
    previous = kubernetes.client.Configuration.get_default_copy()
    kubernetes.config.load_kube_config(config_file=str(sim.write_kubeconfig(tmp_path / "default-kubeconfig")))
    yield
    kubernetes.client.Configuration.set_default(previous)


def test_leader_election_with_lease_lock_has_one_leader_and_hands_over(sim: KubeSim, default_client: None) -> None:
    """Two candidates of the client's own leader election: exactly one leads; once it stops renewing, the
    other takes over after the lease duration (LEASE_SECONDS here), and the Lease names it with fresh times."""
    log: list[tuple[float, str, str]] = []
    lock = threading.Lock()
    first, second = _Candidate("replica-a", log, lock), _Candidate("replica-b", log, lock)
    first.thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not log and time.monotonic() < deadline:
        time.sleep(0.05)
    second.thread.start()
    time.sleep(LEASE_SECONDS + 1)  # more than a lease duration: the second would have taken over if it could
    with lock:
        assert [(who, what) for _, who, what in log] == [("replica-a", "leading")]
    held = sim.get("Lease", NS, "gpupool")
    assert held is not None and held["spec"]["holderIdentity"] == "replica-a"
    assert MICRO_TIME.fullmatch(held["spec"]["renewTime"]) and MICRO_TIME.fullmatch(held["spec"]["acquireTime"])
    resigned = time.monotonic()
    first.resign()
    while not any(who == "replica-b" for _, who, _ in log) and time.monotonic() < deadline + TIMEOUT:
        time.sleep(0.05)
    second.resign()
    with lock:
        events = [(who, what) for _, who, what in log]
        took_over = next(t for t, who, what in log if (who, what) == ("replica-b", "leading"))
    assert events[:3] == [("replica-a", "leading"), ("replica-a", "stopped"), ("replica-b", "leading")]
    # Within the lease duration of the last renewal (the follower polls every retry period): a generous
    # functional deadline, on a loaded machine.
    assert took_over - resigned <= LEASE_SECONDS + 2 * 1 + 5
    taken = sim.get("Lease", NS, "gpupool")
    assert taken is not None and taken["spec"]["holderIdentity"] == "replica-b"
    assert taken["spec"]["acquireTime"] > held["spec"]["acquireTime"]
    second.thread.join(TIMEOUT)


class TestEvents:
    def test_an_event_on_a_pod_is_listed_in_its_namespace(
        self, sim: KubeSim, client: kubernetes.client.ApiClient
    ) -> None:
        api = kubernetes.client.CoreV1Api(client)
        body = kubernetes.client.CoreV1Event(
            metadata={"generateName": "q."},
            involved_object=kubernetes.client.V1ObjectReference(kind="Pod", name="q", namespace="team-a", uid="u1"),
            reason="Queued",
            message="waiting for room in nvidia/medium/*",
            type="Normal",
        )
        created = api.create_namespaced_event("team-a", body, _request_timeout=TIMEOUT)
        listed = api.list_namespaced_event("team-a", _request_timeout=TIMEOUT).items
        assert [(e.metadata.name, e.reason, e.involved_object.name) for e in listed] == [
            (created.metadata.name, "Queued", "q")
        ]
        assert [e["reason"] for e in sim.events("team-a", about="q")] == ["Queued"]
        assert sim.events("other") == []
        on_pod = api.list_namespaced_event("team-a", field_selector="involvedObject.name=q,reason=Queued").items
        assert [e.metadata.name for e in on_pod] == [created.metadata.name]
        assert api.list_namespaced_event("team-a", field_selector="involvedObject.name=other").items == []

    def test_an_events_k8s_io_event_is_the_same_event_in_core(
        self, sim: KubeSim, client: kubernetes.client.ApiClient
    ) -> None:
        """One stored Event, two shapes: regarding/note there, involvedObject/message in core/v1."""
        api = kubernetes.client.EventsV1Api(client)
        body = kubernetes.client.EventsV1Event(
            metadata={"name": "q.released"},
            event_time=datetime.now(UTC),
            regarding=kubernetes.client.V1ObjectReference(kind="Pod", name="q", namespace="team-a"),
            reason="Released",
            note="released to nvidia/medium/Tesla-T4",
            type="Normal",
            action="Release",
            reporting_controller="gpupool.io/queue",
            reporting_instance="gpupool-0",
        )
        created = api.create_namespaced_event("team-a", body, _request_timeout=TIMEOUT)
        assert (created.note, created.regarding.name) == ("released to nvidia/medium/Tesla-T4", "q")
        core = kubernetes.client.CoreV1Api(client).read_namespaced_event(
            "q.released", "team-a", _request_timeout=TIMEOUT
        )
        assert (core.message, core.involved_object.name, core.reporting_component) == (
            "released to nvidia/medium/Tesla-T4",
            "q",
            "gpupool.io/queue",
        )
        assert [e.note for e in api.list_namespaced_event("team-a", _request_timeout=TIMEOUT).items] == [created.note]

    def test_events_are_validated_as_kube_apiserver_validates_them(
        self, sim: KubeSim, client: kubernetes.client.ApiClient
    ) -> None:
        """core/v1: the involved object's namespace is the Event's; events.k8s.io/v1: the new API's fields
        are required (sent raw: the client itself refuses an Event without eventTime)."""
        core = kubernetes.client.CoreV1Event(
            metadata={"name": "e1"},
            involved_object=kubernetes.client.V1ObjectReference(kind="Pod", name="q", namespace="team-b"),
            reason="Queued",
        )
        status = refused(kubernetes.client.CoreV1Api(client).create_namespaced_event, "team-a", core)
        assert [c["field"] for c in status["details"]["causes"]] == ["involvedObject.namespace"]
        new = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e2"}, "type": "Normal"}
        new["regarding"] = {"kind": "Pod", "name": "q", "namespace": "team-a"}
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=TIMEOUT)
        try:
            headers = {"Authorization": "Bearer kubesim-token", "Content-Type": "application/json"}
            conn.request("POST", "/apis/events.k8s.io/v1/namespaces/team-a/events", orjson.dumps(new), headers)
            response = conn.getresponse()
            status = orjson.loads(response.read())
        finally:
            conn.close()
        assert (response.status, [c["field"] for c in status["details"]["causes"]]) == (422, ["eventTime"])
