"""Writes to the API simulator over HTTP through the real client (creates and deletes as watch events,
refusals like the API's, the token, injected failures, methods not served), and the KubeSim Python API
(one global resourceVersion, invalid writes refused, request counters, stop).
"""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

import kubernetes
import orjson
import pytest
import urllib3

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from tests.conftest import sim_pod as pod
from tests.testing.kubeclient import open_watch, raw_list
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow  # every test here serves HTTP from the simulator


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
