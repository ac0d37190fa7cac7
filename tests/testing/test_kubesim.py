"""The Kubernetes API simulator (webhook/testing/kubesim.py, serving webhook/testing/kubeapi.py), driven
through the real `kubernetes` client and a generated kubeconfig.

Every behaviour a list+watch cache relies on is pinned here as the installed client sees it: pages
consistent at one resourceVersion, watch events and bookmarks, resume, 410 Expired (and how the
client's Watch turns it into an ApiException), each injected fault, and the KubeSim Python API.
The store underneath is tested in test_kubestore.py, the generator in test_synthetic.py and
`python -m webhook.testing` in test_cli.py; writes in test_kubewrite.py.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import orjson
import pytest
import urllib3

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from tests.conftest import sim_pod as pod
from webhook.testing import KubeSim, iter_synthetic_cluster, synthetic_cluster

pytestmark = pytest.mark.slow  # every test here serves HTTP from the simulator


def open_watch(sim: KubeSim, call: Any, request_timeout: Any = TIMEOUT) -> Iterator[dict[str, Any]]:
    """A bookmark-enabled watch from now on, returned once it is open (its first event, a bookmark,
    has arrived), so the test can change the cluster knowing the stream will see it."""
    stream = kubernetes.watch.Watch().stream(
        call,
        resource_version=sim.resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=TIMEOUT,
        _request_timeout=request_timeout,
    )
    assert next(stream)["type"] == "BOOKMARK"
    return stream


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with KubeSim(bookmark_interval=0.2) as running:
        running.load(synthetic_cluster(nodes=12, pods=120, seed=7))
        yield running
        assert running.handler_errors == []


@pytest.fixture
def api(sim: KubeSim, tmp_path: Path) -> Iterator[kubernetes.client.CoreV1Api]:
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    with kubernetes.config.new_client_from_config(config_file=str(path)) as client:
        yield kubernetes.client.CoreV1Api(api_client=client)


def raw_list(api: kubernetes.client.CoreV1Api, **kwargs: Any) -> dict[str, Any]:
    response = api.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=TIMEOUT, **kwargs)
    result: dict[str, Any] = orjson.loads(response.data)
    return result


def names(items: list[dict[str, Any]]) -> list[str]:
    return [f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in items]


class TestConfigAndDiscovery:
    def test_generated_kubeconfig_points_the_real_client_at_the_simulator(self, sim: KubeSim, tmp_path: Path) -> None:
        """load_kube_config accepts the file; the client reaches the simulator with the bearer token."""
        path = sim.write_kubeconfig(tmp_path / "kubeconfig")
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(path), client_configuration=config)
        assert config.host == sim.url
        with kubernetes.client.ApiClient(config) as client:
            version = kubernetes.client.VersionApi(client).get_code(_request_timeout=TIMEOUT)
            assert version.git_version.startswith("v1.")
            assert kubernetes.client.CoreApi(client).get_api_versions().versions == ["v1"]

    def test_requests_without_the_token_are_unauthorized(self, sim: KubeSim) -> None:
        """Like a real API server, the simulator refuses a client that presents no credentials."""
        config = kubernetes.client.Configuration(host=sim.url)
        with kubernetes.client.ApiClient(config) as client, pytest.raises(kubernetes.client.ApiException) as err:
            kubernetes.client.CoreV1Api(client).list_node(_request_timeout=TIMEOUT)
        assert err.value.status == 401

    def test_every_connection_sends_without_delay(self, sim: KubeSim) -> None:
        """TCP_NODELAY on the simulator's side of each connection, as on kube-apiserver's: without it the
        body of a small answer waited for the client's delayed ACK of the headers (44 ms a request).
        (Checked on the socket rather than timed, to stay independent of the machine's load.)"""
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=TIMEOUT)
        try:
            conn.request("GET", "/version", headers={"Authorization": "Bearer kubesim-token"})
            assert conn.getresponse().read()
            server_side = list(sim._state.connections)  # the handlers' sockets: white box on purpose
            assert server_side
            assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in server_side)
        finally:
            conn.close()


class TestList:
    def test_pages_return_every_object_once_at_the_first_pages_resource_version(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """Writes between pages change neither the pages' resourceVersion nor their content."""
        expected = names(raw_list(api)["items"])
        first = raw_list(api, limit=17)
        pages, token = [first], first["metadata"]["continue"]
        assert first["metadata"]["remainingItemCount"] == len(expected) - 17
        sim.add(pod("zz-new"))
        sim.delete("Pod", expected[0].split("/")[0], expected[0].split("/")[1])
        while token:
            page = raw_list(api, limit=17, _continue=token)
            pages.append(page)
            token = page["metadata"].get("continue")
        assert {p["metadata"]["resourceVersion"] for p in pages} == {first["metadata"]["resourceVersion"]}
        listed = [n for p in pages for n in names(p["items"])]
        assert listed == expected
        assert len(set(listed)) == len(listed) == 120

    def test_typed_paginated_list_through_the_client(self, api: kubernetes.client.CoreV1Api) -> None:
        """The typed path (the benchmark's baseline) deserialises the simulator's nodes and pages."""
        first = api.list_node(limit=5, _request_timeout=TIMEOUT)
        second = api.list_node(limit=100, _continue=first.metadata._continue, _request_timeout=TIMEOUT)
        assert len(first.items) + len(second.items) == 12
        assert second.metadata._continue is None
        assert all(n.status.allocatable for n in first.items + second.items)

    def test_raw_list_has_the_real_apis_shape(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """The list carries kind and resourceVersion; its items carry no kind, as the API sends them."""
        body = raw_list(api)
        assert body["kind"] == "PodList"
        assert body["apiVersion"] == "v1"
        assert body["metadata"]["resourceVersion"] == sim.resource_version
        assert "continue" not in body["metadata"]
        assert all("kind" not in item and "apiVersion" not in item for item in body["items"])
        assert all(item["metadata"]["uid"] and item["metadata"]["resourceVersion"] for item in body["items"])

    def test_namespaced_list_returns_only_that_namespace_page_by_page(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """/namespaces/{ns}/pods pages stay inside the namespace."""
        everything = [n for n in names(raw_list(api)["items"]) if n.startswith("team-a/")]
        seen: list[str] = []
        token = None
        while True:
            response = api.list_namespaced_pod(
                "team-a", limit=1, _continue=token, _preload_content=False, _request_timeout=TIMEOUT
            )
            page = orjson.loads(response.data)
            seen += names([{**i, "metadata": {**i["metadata"], "namespace": "team-a"}} for i in page["items"]])
            assert all(i["metadata"]["namespace"] == "team-a" for i in page["items"])
            token = page["metadata"].get("continue")
            if not token:
                break
        assert seen == everything
        assert len(seen) >= 2

    def test_continue_token_older_than_compaction_is_410_expired(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """Once the list's resourceVersion is compacted away, the next page is 410 Expired."""
        token = raw_list(api, limit=10)["metadata"]["continue"]
        sim.add(pod("newer"))
        sim.compact()
        with pytest.raises(kubernetes.client.ApiException) as err:
            raw_list(api, limit=10, _continue=token)
        status = orjson.loads(err.value.body)
        assert (err.value.status, status["kind"], status["reason"], status["code"]) == (410, "Status", "Expired", 410)

    def test_exact_resource_version_reads_the_past(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """resourceVersionMatch=Exact serves the state as it was; a deleted Pod is still in it."""
        before = sim.resource_version
        victim = names(raw_list(api)["items"])[3]
        sim.delete("pods", *victim.split("/"))
        past = raw_list(api, resource_version=before, resource_version_match="Exact")
        assert past["metadata"]["resourceVersion"] == before
        assert victim in names(past["items"])
        assert victim not in names(raw_list(api)["items"])

    @pytest.mark.parametrize(
        ("params", "status"),
        [
            pytest.param({"resource_version": "999999999"}, 504, id="future-rv"),
            pytest.param({"resource_version": "1", "resource_version_match": "Exact"}, 410, id="compacted-rv"),
            pytest.param({"resource_version_match": "Exact"}, 400, id="match-without-rv"),
            pytest.param({"field_selector": "spec.containers=x"}, 400, id="unknown-selectable-field"),
        ],
    )
    def test_resource_version_rules_answer_like_the_api(
        self, api: kubernetes.client.CoreV1Api, params: dict[str, str], status: int
    ) -> None:
        """Unservable list parameters give the status kube-apiserver gives, never a silent answer."""
        with pytest.raises(kubernetes.client.ApiException) as err:
            raw_list(api, **params)
        assert err.value.status == status

    def test_read_one_object_or_404(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """GET of a single object returns it with kind; a missing one is 404 NotFound."""
        sim.add(pod("single"))
        assert api.read_namespaced_pod("single", "team-a", _request_timeout=TIMEOUT).kind == "Pod"
        with pytest.raises(kubernetes.client.ApiException) as err:
            api.read_namespaced_pod("absent", "team-a", _request_timeout=TIMEOUT)
        assert err.value.status == 404

    def test_continue_with_a_resource_version_is_a_bad_request(self, api: kubernetes.client.CoreV1Api) -> None:
        """As in kube-apiserver, a continue token may not be combined with a resourceVersion."""
        first = raw_list(api, limit=10)
        with pytest.raises(kubernetes.client.ApiException) as err:
            raw_list(api, limit=10, _continue=first["metadata"]["continue"], resource_version="5")
        assert err.value.status == 400

    def test_large_cluster_lists_completely_in_pages(self, tmp_path: Path) -> None:
        """20,000 Pods stream into the simulator and come back through 500-item pages, each once."""
        with KubeSim() as sim:
            sim.load(iter_synthetic_cluster(nodes=700, pods=20_000, seed=3))
            path = sim.write_kubeconfig(tmp_path / "kubeconfig")
            with kubernetes.config.new_client_from_config(config_file=str(path)) as client:
                api = kubernetes.client.CoreV1Api(client)
                seen: set[str] = set()
                token, pages = None, 0
                while token or not pages:
                    page = raw_list(api, limit=500, _continue=token)
                    seen.update(i["metadata"]["uid"] for i in page["items"])
                    token, pages = page["metadata"].get("continue"), pages + 1
        assert (len(seen), pages) == (20_000, 40)


class TestSelectors:
    def test_label_selectors_filter_lists_page_by_page(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """Every form of labels.Parse; a page holds `limit` matching items and continues after the last."""
        for i in range(5):
            sim.add(
                {
                    **pod(f"sel-{i}"),
                    "metadata": {"name": f"sel-{i}", "namespace": "team-a", "labels": {"tier": str(i % 3)}},
                }
            )
        selected = {
            "tier=1": ["sel-1", "sel-4"],
            "tier!=1,tier": ["sel-0", "sel-2", "sel-3"],
            "tier in (0, 2)": ["sel-0", "sel-2", "sel-3"],
            "tier notin (0,2),tier": ["sel-1", "sel-4"],
            "!tier": [],
        }
        for selector, expected in selected.items():
            items = api.list_namespaced_pod("team-a", label_selector=selector, _request_timeout=TIMEOUT).items
            assert [p.metadata.name for p in items if p.metadata.name.startswith("sel-")] == expected, selector
        first = api.list_namespaced_pod("team-a", label_selector="tier", limit=2, _request_timeout=TIMEOUT)
        rest = api.list_namespaced_pod("team-a", label_selector="tier", limit=10, _continue=first.metadata._continue)
        assert [p.metadata.name for p in first.items + rest.items] == [f"sel-{i}" for i in range(5)]
        assert rest.metadata._continue is None

    def test_field_selectors_filter_by_the_selectable_fields(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        sim.add(pod("done", phase="Succeeded"))
        names = [
            p.metadata.name for p in api.list_namespaced_pod("team-a", field_selector="status.phase=Succeeded").items
        ]
        assert "done" in names and all(
            p.status.phase == "Succeeded"
            for p in api.list_namespaced_pod("team-a", field_selector="status.phase=Succeeded").items
        )
        with pytest.raises(kubernetes.client.ApiException) as err:
            api.list_namespaced_pod("team-a", field_selector="spec.priority=1", _request_timeout=TIMEOUT)
        assert err.value.status == 400 and "is not a known field selector" in orjson.loads(err.value.body)["message"]

    def test_a_selected_watch_sees_objects_enter_and_leave_the_selection(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        sim.add(pod("w"))
        stream = kubernetes.watch.Watch().stream(
            api.list_namespaced_pod,
            "team-a",
            field_selector="status.phase=Succeeded",
            resource_version=sim.resource_version,
            timeout_seconds=TIMEOUT,
            _request_timeout=TIMEOUT,
        )
        sim.modify(pod("w", phase="Succeeded"))
        sim.modify(pod("w", phase="Failed"))
        events = [next(stream), next(stream)]
        assert [(e["type"], e["object"].status.phase) for e in events] == [
            ("ADDED", "Succeeded"),
            ("DELETED", "Failed"),
        ]

    def test_a_body_nested_too_deeply_is_a_bad_request(self, sim: KubeSim) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=TIMEOUT)
        try:
            deep = b'{"metadata":{"name":"deep"},"spec":' + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"}"
            headers = {"Authorization": "Bearer kubesim-token", "Content-Type": "application/json"}
            conn.request("POST", "/api/v1/namespaces/team-a/pods", deep, headers)
            response = conn.getresponse()
            assert (response.status, orjson.loads(response.read())["code"]) == (400, 400)
        finally:
            conn.close()


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


class TestWritesOverHttp:
    def test_create_through_the_client_is_a_watch_event_with_server_set_fields(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """POST stores the object with the path's namespace, a name from generateName, a fresh uid and
        creationTimestamp, answers 201 with it, and watchers see ADDED."""
        stream = open_watch(sim, api.list_pod_for_all_namespaces)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "job-", "uid": "from-the-client"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
        created = api.create_namespaced_pod("team-a", body, _request_timeout=TIMEOUT)
        name = created.metadata.name
        assert name.startswith("job-") and len(name) == len("job-") + 5
        assert created.metadata.namespace == "team-a"
        assert created.metadata.uid != "from-the-client"
        assert created.metadata.creation_timestamp is not None
        event = next(e for e in stream if e["type"] != "BOOKMARK")
        assert (event["type"], event["object"].metadata.name) == ("ADDED", name)
        assert sim.get("Pod", "team-a", name) is not None

    def test_delete_through_the_client_returns_the_last_state(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """DELETE removes the object (watchers see DELETED); a second DELETE is 404."""
        sim.add(pod("doomed", phase="Succeeded"))
        stream = open_watch(sim, api.list_pod_for_all_namespaces)
        raw = api.delete_namespaced_pod("doomed", "team-a", _preload_content=False, _request_timeout=TIMEOUT)
        assert orjson.loads(raw.data)["status"]["phase"] == "Succeeded"
        event = next(e for e in stream if e["type"] != "BOOKMARK")
        assert (event["type"], event["object"].metadata.name) == ("DELETED", "doomed")
        assert sim.get("Pod", "team-a", "doomed") is None
        with pytest.raises(kubernetes.client.ApiException) as err:
            api.delete_namespaced_pod("doomed", "team-a", _request_timeout=TIMEOUT)
        assert err.value.status == 404

    def test_nodes_are_created_without_a_namespace(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-posted"}}
        assert api.create_node(node, _request_timeout=TIMEOUT).metadata.name == "n-posted"
        assert sim.get("Node", None, "n-posted") is not None

    @pytest.mark.parametrize(
        ("namespace", "body", "status", "reason"),
        [
            ("team-a", {"kind": "Pod", "metadata": {"name": "dup"}}, 409, "AlreadyExists"),
            ("team-b", {"kind": "Pod", "metadata": {"name": "x", "namespace": "team-a"}}, 400, "BadRequest"),
            ("team-a", {"kind": "Node", "metadata": {"name": "x"}}, 400, "BadRequest"),
            ("team-a", {"kind": "Pod", "metadata": {}}, 422, "Invalid"),
            ("team-a", {"kind": "Pod", "metadata": {"name": "x", "resourceVersion": "5"}}, 400, "BadRequest"),
        ],
    )
    def test_bad_creates_are_refused_like_the_api(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api, *, namespace: str, body: Any, status: int, reason: str
    ) -> None:
        sim.add(pod("dup"))
        before = sim.resource_version
        with pytest.raises(kubernetes.client.ApiException) as err:
            api.create_namespaced_pod(namespace, body, _request_timeout=TIMEOUT)
        assert (err.value.status, orjson.loads(err.value.body)["reason"]) == (status, reason)
        assert sim.resource_version == before

    @pytest.mark.parametrize(
        ("body", "length", "status"), [(b"not json", 8, 400), (b'["a list"]', 10, 400), (b"", 4 << 20, 413)]
    )
    def test_bodies_that_are_not_objects_are_refused(self, sim: KubeSim, body: bytes, length: int, status: int) -> None:
        """What the typed client never sends: a body that is not JSON, not an object, or over 3 MiB (refused
        from its Content-Length, before it is sent)."""
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=TIMEOUT)
        try:
            conn.putrequest("POST", "/api/v1/namespaces/team-a/pods")
            conn.putheader("Authorization", "Bearer kubesim-token")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(length))
            conn.endheaders(body)
            response = conn.getresponse()
            assert (response.status, orjson.loads(response.read())["code"]) == (status, status)
        finally:
            conn.close()

    def test_writes_need_the_token_and_honour_injected_failures(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """No credentials: 401. fail_next(verb="create") fails the create and not the list."""
        config = kubernetes.client.Configuration(host=sim.url)
        with kubernetes.client.ApiClient(config) as client, pytest.raises(kubernetes.client.ApiException) as err:
            kubernetes.client.CoreV1Api(client).create_namespaced_pod("team-a", pod("x"), _request_timeout=TIMEOUT)
        assert err.value.status == 401
        sim.fail_next(1, 500, verb="create")
        api.list_node(_request_timeout=TIMEOUT)
        with pytest.raises(kubernetes.client.ApiException) as err:
            api.create_namespaced_pod("team-a", pod("x"), _request_timeout=TIMEOUT)
        assert err.value.status == 500
        assert api.create_namespaced_pod("team-a", pod("x"), _request_timeout=TIMEOUT).metadata.name == "x"

    def test_methods_the_api_does_not_serve_are_405(self, sim: KubeSim) -> None:
        """PUT and PATCH are served (test_kubewrite.py); OPTIONS and HEAD are not."""
        sim.add(pod("p"))
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=TIMEOUT)
        try:
            conn.request(
                "OPTIONS", "/api/v1/namespaces/team-a/pods/p", headers={"Authorization": "Bearer kubesim-token"}
            )
            response = conn.getresponse()
            assert (response.status, orjson.loads(response.read())["code"]) == (405, 405)
        finally:
            conn.close()


class TestPythonApi:
    def test_writes_take_one_global_resource_version_and_keep_identity(self, sim: KubeSim) -> None:
        """Every write, of any kind, takes the next resourceVersion; modify keeps uid and
        creationTimestamp; delete reports the deletion's resourceVersion."""
        start = int(sim.resource_version)
        added = sim.add(pod("p"))
        node = sim.add({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n-new"}})
        modified = sim.modify(pod("p", phase="Succeeded"))
        deleted = sim.delete("Pod", "team-a", "p")
        versions = [int(o["metadata"]["resourceVersion"]) for o in (added, node, modified, deleted)]
        assert versions == [start + 1, start + 2, start + 3, start + 4]
        assert modified["metadata"]["uid"] == added["metadata"]["uid"]
        assert modified["metadata"]["creationTimestamp"] == added["metadata"]["creationTimestamp"]
        assert deleted["status"]["phase"] == "Succeeded"
        assert sim.get("pods", "team-a", "p") is None
        assert sim.get("Node", None, "n-new") == node

    def test_invalid_writes_are_refused(self, sim: KubeSim) -> None:
        """Duplicates, missing objects, unserved kinds and Pods without a namespace raise."""
        sim.add(pod("dup"))
        with pytest.raises(ValueError, match="already exists"):
            sim.add(pod("dup"))
        with pytest.raises(KeyError):
            sim.modify(pod("ghost"))
        with pytest.raises(KeyError):
            sim.delete("Pod", "team-a", "ghost")
        with pytest.raises(KeyError):
            sim.add({"kind": "Secret", "metadata": {"name": "s", "namespace": "x"}})
        with pytest.raises(ValueError, match="namespace"):
            sim.add({"kind": "Pod", "metadata": {"name": "no-namespace"}})

    def test_counters_count_lists_and_watches_per_resource(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """List and watch requests are counted per resource; open watches drop to zero when they end."""
        api.list_node(_request_timeout=TIMEOUT)
        raw_list(api)
        api.list_resource_quota_for_all_namespaces(_request_timeout=TIMEOUT)
        list(kubernetes.watch.Watch().stream(api.list_node, timeout_seconds=1, _request_timeout=TIMEOUT))
        assert [sim.list_requests(r) for r in ("nodes", "pods", "resourcequotas")] == [1, 1, 1]
        assert (sim.watch_requests("Node"), sim.watch_requests(), sim.open_watches()) == (1, 1, 0)

    def test_stop_cuts_open_watches(self, tmp_path: Path) -> None:
        """stop() ends every connection, so no client waits on a simulator that is gone."""
        sim = KubeSim(bookmark_interval=0.2).start()
        path = sim.write_kubeconfig(tmp_path / "kubeconfig")
        with kubernetes.config.new_client_from_config(config_file=str(path)) as client:
            stream = kubernetes.watch.Watch().stream(
                kubernetes.client.CoreV1Api(client).list_node,
                resource_version=sim.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=TIMEOUT,
                _request_timeout=TIMEOUT,
            )
            assert next(stream)["type"] == "BOOKMARK"
            sim.stop()
            with pytest.raises(urllib3.exceptions.ProtocolError):
                for _ in stream:
                    pass
