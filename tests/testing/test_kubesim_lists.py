"""The Kubernetes API simulator (webhook/testing/kubesim.py, serving webhook/testing/kubeapi.py), driven
through the real `kubernetes` client and a generated kubeconfig: the kubeconfig and discovery, and lists
as a list+watch cache relies on them (pages consistent at one resourceVersion, 410 Expired continue
tokens, resourceVersion rules, label and field selectors).

Watches and injected faults are tested in test_kubesim_watches.py, writes over HTTP and the KubeSim
Python API in test_kubesim_writes.py; the store underneath in test_kubestore.py, the generator in
test_synthetic.py and `python -m webhook.testing` in test_cli.py; writes in test_kubewrite.py.
"""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

import kubernetes
import orjson
import pytest

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from tests.conftest import sim_pod as pod
from tests.testing.kubeclient import names, raw_list
from webhook.testing import KubeSim, iter_synthetic_cluster

pytestmark = pytest.mark.slow  # every test here serves HTTP from the simulator


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
