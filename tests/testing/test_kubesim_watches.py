"""The API simulator's watches as the installed client sees them (events and bookmarks, resume, 410
Expired and how the client's Watch turns it into an ApiException), and each injected fault (dropped
and expired watches, failed and stalled calls, the API server down and up again).
"""

from __future__ import annotations

import kubernetes
import orjson
import pytest
import urllib3

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from tests.conftest import sim_pod as pod
from tests.testing.kubeclient import names, open_watch, raw_list
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow  # every test here serves HTTP from the simulator


class TestWatch:
    def test_stream_delivers_changes_and_bookmarks(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """ADDED, MODIFIED and DELETED arrive as typed objects; bookmarks carry a resourceVersion."""
        stream = open_watch(sim, api.list_pod_for_all_namespaces)  # the stream is open: now change the cluster
        added = sim.add(pod("watched"))
        sim.modify(pod("watched", phase="Succeeded"))
        deleted = sim.delete("Pod", "team-a", "watched")
        events = []
        for event in stream:
            events.append(event)
            if event["type"] == "BOOKMARK" and len(events) > 3:
                break
        changes = [(e["type"], e["object"].metadata.name, e["object"].status.phase) for e in events[:3]]
        assert changes == [
            ("ADDED", "watched", "Running"),
            ("MODIFIED", "watched", "Succeeded"),
            ("DELETED", "watched", "Succeeded"),
        ]
        assert events[0]["raw_object"]["metadata"]["uid"] == added["metadata"]["uid"]
        assert events[2]["raw_object"]["metadata"]["resourceVersion"] == deleted["metadata"]["resourceVersion"]
        bookmark = events[-1]["raw_object"]
        assert bookmark["kind"] == "Pod"
        assert int(bookmark["metadata"]["resourceVersion"]) >= int(deleted["metadata"]["resourceVersion"])

    def test_resume_replays_exactly_the_missed_events(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """A watch from a resourceVersion gets the changes after it, of its kind and namespace only."""
        node = api.list_node(_request_timeout=TIMEOUT).items[0].metadata.name
        since = sim.resource_version
        sim.add(pod("a1"))
        sim.add(pod("b1", namespace="team-b"))
        sim.modify(sim.get("Node", None, node) or {})
        sim.modify(pod("a1", phase="Failed"))
        sim.delete("Pod", "team-a", "a1")
        events = list(
            kubernetes.watch.Watch().stream(
                api.list_namespaced_pod,
                "team-a",
                resource_version=since,
                timeout_seconds=1,
                _request_timeout=TIMEOUT,
            )
        )
        assert [(e["type"], e["object"].metadata.name) for e in events] == [
            ("ADDED", "a1"),
            ("MODIFIED", "a1"),
            ("DELETED", "a1"),
        ]

    def test_watch_without_resource_version_starts_with_the_current_state(
        self, api: kubernetes.client.CoreV1Api
    ) -> None:
        """No resourceVersion: one synthetic ADDED per existing object, then live changes."""
        events = list(kubernetes.watch.Watch().stream(api.list_node, timeout_seconds=1, _request_timeout=TIMEOUT))
        assert [e["type"] for e in events] == ["ADDED"] * 12
        assert len({e["object"].metadata.name for e in events}) == 12

    def test_compacted_resource_version_is_an_error_event_410(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """As kube-apiserver does: HTTP 200, then one ERROR event holding a 410 Expired Status."""
        old = sim.resource_version
        sim.add(pod("x"))
        sim.compact()
        response = api.list_pod_for_all_namespaces(
            watch=True, resource_version=old, _preload_content=False, _request_timeout=TIMEOUT
        )
        lines = response.data.splitlines()
        assert response.status == 200
        assert len(lines) == 1
        event = orjson.loads(lines[0])
        assert event["type"] == "ERROR"
        assert {k: event["object"][k] for k in ("kind", "status", "reason", "code")} == {
            "kind": "Status",
            "status": "Failure",
            "reason": "Expired",
            "code": 410,
        }

    def test_client_watch_raises_api_exception_410(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """The installed client's Watch turns the ERROR event into ApiException(410); with
        timeout_seconds it does so at once, without it only after one retry of its own."""
        old = sim.resource_version
        sim.add(pod("x"))
        sim.compact()
        with pytest.raises(kubernetes.client.ApiException) as err:
            list(
                kubernetes.watch.Watch().stream(
                    api.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=5, _request_timeout=TIMEOUT
                )
            )
        assert err.value.status == 410
        assert sim.watch_requests("pods") == 1
        with pytest.raises(kubernetes.client.ApiException) as err:
            list(
                kubernetes.watch.Watch().stream(
                    api.list_pod_for_all_namespaces, resource_version=old, _request_timeout=TIMEOUT
                )
            )
        assert err.value.status == 410
        assert sim.watch_requests("pods") == 3


class TestFaults:
    def test_drop_watches_breaks_the_stream(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """The client sees the connection break mid-stream (urllib3 ProtocolError), not a clean end."""
        stream = open_watch(sim, api.list_node)
        assert sim.open_watches("nodes") == 1
        assert sim.drop_watches() == 1
        with pytest.raises(urllib3.exceptions.ProtocolError):
            for _ in stream:
                pass
        sim.wait_for_watches(0, "nodes")
        assert sim.open_watches() == 0

    def test_expire_watches_forces_a_410_and_a_relist(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """The watch breaks before the change reaches it; resuming from the last bookmark is 410, and
        only a new list shows the change."""
        watch = kubernetes.watch.Watch()
        stream = watch.stream(
            api.list_pod_for_all_namespaces,
            resource_version=sim.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=TIMEOUT,
            _request_timeout=TIMEOUT,
        )
        assert next(stream)["type"] == "BOOKMARK"
        sim.expire_watches([pod("missed")])
        with pytest.raises(urllib3.exceptions.ProtocolError):
            for event in stream:
                assert event["type"] == "BOOKMARK"  # never the change
        with pytest.raises(kubernetes.client.ApiException) as err:
            list(
                kubernetes.watch.Watch().stream(
                    api.list_pod_for_all_namespaces,
                    resource_version=watch.resource_version,
                    timeout_seconds=5,
                    _request_timeout=TIMEOUT,
                )
            )
        assert err.value.status == 410
        assert "team-a/missed" in names(raw_list(api)["items"])

    def test_fail_next_answers_with_the_status(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """The next n requests get the status and a Status body; the one after is served."""
        sim.fail_next(2, 500)
        for _ in range(2):
            with pytest.raises(kubernetes.client.ApiException) as err:
                api.list_node(_request_timeout=TIMEOUT)
            assert err.value.status == 500
            assert orjson.loads(err.value.body)["reason"] == "InternalError"
        assert len(api.list_node(_request_timeout=TIMEOUT).items) == 12

    def test_fail_next_for_watches_only(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """verb="watch" leaves lists alone; the client's Watch raises ApiException for the failed watch."""
        sim.fail_next(1, 500, verb="watch")
        assert len(api.list_node(_request_timeout=TIMEOUT).items) == 12
        with pytest.raises(kubernetes.client.ApiException) as err:
            list(kubernetes.watch.Watch().stream(api.list_node, timeout_seconds=1, _request_timeout=TIMEOUT))
        assert err.value.status == 500
        assert (sim.list_requests("nodes"), sim.watch_requests("nodes")) == (1, 1)

    def test_a_single_429_is_retried_by_urllib3(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """429 carries Retry-After like the real API, and urllib3's default retry honours it: the
        caller never sees one 429 (it waits a second instead)."""
        sim.fail_next(1, 429)
        assert len(api.list_node(_request_timeout=TIMEOUT).items) == 12
        assert sim.list_requests("nodes") == 2

    def test_stall_makes_a_call_time_out(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """A stalled server never answers: the read timeout fires (urllib3 retries GETs three times
        first, then raises MaxRetryError caused by ReadTimeoutError); after the stall calls work."""
        sim.stall(60)
        with pytest.raises(urllib3.exceptions.MaxRetryError) as err:
            api.list_node(_request_timeout=(TIMEOUT, 0.2))
        assert isinstance(err.value.reason, urllib3.exceptions.ReadTimeoutError)
        sim.stall(0)
        assert len(api.list_node(_request_timeout=TIMEOUT).items) == 12

    def test_stall_pauses_open_watches(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """While stalled, an open watch receives nothing, so a read timeout catches the silence."""
        stream = open_watch(sim, api.list_node, request_timeout=(TIMEOUT, 1.0))
        sim.stall(60)
        with pytest.raises(urllib3.exceptions.ReadTimeoutError):
            for _ in stream:
                pass
        sim.stall(0)

    def test_held_watches_of_one_client_send_nothing_until_let_go(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """A client's Pod watches held back (a late watch) send no event and no bookmark, while its reads
        and its Node watch go on; let go, the watch sends what came meanwhile."""
        rv = sim.resource_version
        sim.hold_watches("kubesim-token", "pods")  # the simulator's admin token, which `api` uses
        sim.add(pod("late"))
        held = kubernetes.watch.Watch().stream(
            api.list_pod_for_all_namespaces,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
            _request_timeout=TIMEOUT,
        )
        assert list(held) == []
        assert api.read_namespaced_pod("late", "team-a", _request_timeout=TIMEOUT).metadata.name == "late"
        nodes = open_watch(sim, api.list_node)  # another resource's watch is not held: its bookmark came
        nodes.close()
        sim.release_watches("kubesim-token")
        events = kubernetes.watch.Watch().stream(
            api.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=1, _request_timeout=TIMEOUT
        )
        assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "late")]

    def test_down_refuses_connections_and_up_restores_the_same_cluster(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """Down: connection refused (NewConnectionError after urllib3's retries); up: same port, same
        objects, same resourceVersion, and watches resume from before the outage."""
        rv = sim.resource_version
        sim.set_down(True)
        with pytest.raises(urllib3.exceptions.MaxRetryError) as err:
            api.list_node(_request_timeout=TIMEOUT)
        assert isinstance(err.value.reason, urllib3.exceptions.NewConnectionError)
        sim.add(pod("during-outage"))
        sim.set_down(False)
        assert len(api.list_node(_request_timeout=TIMEOUT).items) == 12
        events = list(
            kubernetes.watch.Watch().stream(
                api.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=1, _request_timeout=TIMEOUT
            )
        )
        assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "during-outage")]

    def test_going_down_cuts_open_watches(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """An API server that goes away breaks the watches it was serving."""
        stream = open_watch(sim, api.list_node)
        sim.set_down(True)
        with pytest.raises(urllib3.exceptions.ProtocolError):
            for _ in stream:
                pass
        sim.set_down(False)
