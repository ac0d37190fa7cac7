"""GPUPool objects (gpupool.io/v1alpha1, cluster-scoped, with a status subresource) in the API simulator,
through the real `kubernetes` client's CustomObjectsApi, as kube-apiserver serves a CustomResource: a
create leaves the status out, a write of the `status` subresource changes only the status, a write of
the object leaves the status alone, and an update needs the resourceVersion it read.
"""

from __future__ import annotations

import http.client
from typing import Any

import kubernetes
import orjson
import pytest

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from webhook.testing import KubeSim

pytestmark = [pytest.mark.slow, pytest.mark.empty_cluster]  # every test serves HTTP from an empty simulator

GROUP, VERSION, PLURAL = "gpupool.io", "v1alpha1", "gpupools"
Obj = dict[str, Any]


def pool(name: str = "nvidia-medium-l4", **status: Any) -> Obj:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUPool",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpupool"}},
        "spec": {"pool": "nvidia/medium/NVIDIA-L4"},
        **({"status": status} if status else {}),
    }


def create(custom: kubernetes.client.CustomObjectsApi, body: Obj) -> Obj:
    created: Obj = custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body, _request_timeout=TIMEOUT)
    return created


def get(custom: kubernetes.client.CustomObjectsApi, name: str = "nvidia-medium-l4") -> Obj:
    found: Obj = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name, _request_timeout=TIMEOUT)
    return found


def refused(call: Any, *args: Any) -> tuple[int, Obj]:
    with pytest.raises(kubernetes.client.ApiException) as err:
        call(*args, _request_timeout=TIMEOUT)
    status: Obj = orjson.loads(err.value.body)
    return int(err.value.status), status


def raw(sim: KubeSim, method: str, path: str, body: Obj | None = None, content_type: str = "") -> tuple[int, Obj]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=TIMEOUT)
    try:
        headers = {"Authorization": "Bearer kubesim-token", **({"Content-Type": content_type} if content_type else {})}
        conn.request(method, path, orjson.dumps(body) if body is not None else None, headers)
        response = conn.getresponse()
        answer: Obj = orjson.loads(response.read())
        return response.status, answer
    finally:
        conn.close()


class TestServed:
    def test_a_created_pool_is_stored_without_its_status_and_served_cluster_wide(
        self, sim: KubeSim, custom: kubernetes.client.CustomObjectsApi
    ) -> None:
        """A create is stored as given but for the status (a CustomResource with a status subresource
        starts without one), read back by name and listed, with kind and apiVersion."""
        created = create(custom, pool(free=3))
        assert "status" not in created
        assert created["spec"] == {"pool": "nvidia/medium/NVIDIA-L4"}
        found = get(custom)
        assert (found["kind"], found["apiVersion"]) == ("GPUPool", "gpupool.io/v1alpha1")
        listed = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=TIMEOUT)
        assert [o["metadata"]["name"] for o in listed["items"]] == ["nvidia-medium-l4"]
        assert sim.get("GPUPool", None, "nvidia-medium-l4") is not None

    def test_discovery_names_the_group_and_its_status_subresource(self, sim: KubeSim) -> None:
        """/apis lists gpupool.io; its version lists gpupools (cluster-scoped) and gpupools/status."""
        code, groups = raw(sim, "GET", "/apis")
        assert code == 200 and "gpupool.io" in [g["name"] for g in groups["groups"]]
        code, resources = raw(sim, "GET", "/apis/gpupool.io/v1alpha1")
        assert code == 200
        served = {r["name"]: r["namespaced"] for r in resources["resources"]}
        assert served == {"gpupools": False, "gpupools/status": False}

    def test_a_name_in_a_namespace_or_another_subresource_is_not_found(
        self, sim: KubeSim, custom: kubernetes.client.CustomObjectsApi
    ) -> None:
        """A cluster-scoped kind under a namespace, a subresource other than status, and the status of a
        kind that has none are 404, as kube-apiserver answers them."""
        create(custom, pool())
        base = "/apis/gpupool.io/v1alpha1"
        assert raw(sim, "GET", f"{base}/namespaces/team-a/gpupools/nvidia-medium-l4")[0] == 404
        assert raw(sim, "GET", f"{base}/gpupools/nvidia-medium-l4/scale")[0] == 404
        assert raw(sim, "GET", "/api/v1/namespaces/team-a/configmaps/x/status")[0] == 404
        assert raw(sim, "GET", f"{base}/gpupools/nvidia-medium-l4/status")[0] == 200


class TestStatusSubresource:
    def test_a_status_patch_changes_only_the_status(
        self, sim: KubeSim, custom: kubernetes.client.CustomObjectsApi
    ) -> None:
        """A merge patch of /status sets the status; the labels and spec it also carries are ignored."""
        create(custom, pool())
        body = {"metadata": {"labels": {"x": "y"}}, "spec": {"pool": "other"}, "status": {"free": 3, "queued": 1}}
        code, patched = raw(
            sim, "PATCH", "/apis/gpupool.io/v1alpha1/gpupools/nvidia-medium-l4/status", body,
            "application/merge-patch+json",
        )  # fmt: skip
        assert code == 200, patched
        found = get(custom)
        assert found["status"] == {"free": 3, "queued": 1}
        assert found["spec"] == {"pool": "nvidia/medium/NVIDIA-L4"}
        assert "x" not in found["metadata"]["labels"]

    def test_a_write_of_the_object_leaves_the_status_alone(self, custom: kubernetes.client.CustomObjectsApi) -> None:
        """A PUT of the object changes its labels but not the status it carries."""
        create(custom, pool())
        custom.patch_cluster_custom_object_status(
            GROUP, VERSION, PLURAL, "nvidia-medium-l4", {"status": {"free": 3}}, _request_timeout=TIMEOUT
        )
        current = get(custom)
        current["metadata"]["labels"]["team"] = "ml"
        current["status"] = {"free": 99}
        custom.replace_cluster_custom_object(
            GROUP, VERSION, PLURAL, "nvidia-medium-l4", current, _request_timeout=TIMEOUT
        )
        found = get(custom)
        assert (found["metadata"]["labels"]["team"], found["status"]) == ("ml", {"free": 3})

    def test_a_status_update_needs_the_version_it_read(
        self, sim: KubeSim, custom: kubernetes.client.CustomObjectsApi
    ) -> None:
        """A PUT of /status at an older resourceVersion is a 409 Conflict, one without any a 422 (a
        CustomResource allows no unconditional update), one at the current version is written."""
        create(custom, pool())
        read = get(custom)
        custom.patch_cluster_custom_object_status(
            GROUP, VERSION, PLURAL, "nvidia-medium-l4", {"status": {"free": 1}}, _request_timeout=TIMEOUT
        )
        stale = {**read, "status": {"free": 2}}
        call = custom.replace_cluster_custom_object_status
        code, status = refused(call, GROUP, VERSION, PLURAL, "nvidia-medium-l4", stale)
        assert (code, status["reason"]) == (409, "Conflict")
        unversioned = {**stale, "metadata": {k: v for k, v in read["metadata"].items() if k != "resourceVersion"}}
        code, status = refused(call, GROUP, VERSION, PLURAL, "nvidia-medium-l4", unversioned)
        assert code == 422
        current = {**get(custom), "status": {"free": 2}}
        call(GROUP, VERSION, PLURAL, "nvidia-medium-l4", current, _request_timeout=TIMEOUT)
        assert get(custom)["status"] == {"free": 2}

    def test_the_status_of_a_missing_object_is_not_found(self, custom: kubernetes.client.CustomObjectsApi) -> None:
        """A status write creates nothing: 404 for a pool not created yet; a delete removes it."""
        call = custom.patch_cluster_custom_object_status
        code, _ = refused(call, GROUP, VERSION, PLURAL, "missing", {"status": {"free": 1}})
        assert code == 404
        create(custom, pool())
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "nvidia-medium-l4", _request_timeout=TIMEOUT)
        code, _ = refused(custom.get_cluster_custom_object, GROUP, VERSION, PLURAL, "nvidia-medium-l4")
        assert code == 404
