"""Finalizers in the API simulator (webhook/testing/kubewrite.py), as kube-apiserver's generic registry
keeps them: a DELETE of an object with finalizers marks it as being deleted (deletionTimestamp,
deletionGracePeriodSeconds 0) and keeps it, until an update empties its finalizers; driven through the
real `kubernetes` client as gpupool and a tenant's controller drive it."""

from __future__ import annotations

from typing import Any

import kubernetes
import orjson
import pytest

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from webhook.testing import KubeSim

pytestmark = [pytest.mark.slow, pytest.mark.empty_cluster]  # every test serves HTTP from an empty simulator

NS, KEEP = "team-a", "example.com/keep"
Obj = dict[str, Any]


def kept(api: kubernetes.client.CoreV1Api, name: str, finalizers: tuple[str, ...] = (KEEP,)) -> Obj:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "finalizers": list(finalizers)},
        "spec": {
            "containers": [{"name": "main", "image": "cuda:12"}],
            "schedulingGates": [{"name": "gpupool.io/queue"}],
        },
    }
    response = api.create_namespaced_pod(NS, body, _preload_content=False, _request_timeout=TIMEOUT)
    created: Obj = orjson.loads(response.data)
    return created


def delete(api: kubernetes.client.CoreV1Api, name: str, **kwargs: Any) -> Obj:
    response = api.delete_namespaced_pod(name, NS, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)
    deleted: Obj = orjson.loads(response.data)
    return deleted


def patch(api: kubernetes.client.CoreV1Api, name: str, body: Any) -> Obj:
    response = api.patch_namespaced_pod(name, NS, body, _preload_content=False, _request_timeout=TIMEOUT)
    patched: Obj = orjson.loads(response.data)
    return patched


def test_a_delete_of_a_pod_with_finalizers_marks_it_and_keeps_it(
    sim: KubeSim, api: kubernetes.client.CoreV1Api
) -> None:
    """The DELETE answers the Pod as now stored: deletionTimestamp set, grace period 0, one new version;
    it is still there for every reader; a second DELETE changes nothing."""
    created = kept(api, "q")
    answer = delete(api, "q")
    stored = sim.get("Pod", NS, "q")
    assert stored is not None
    meta = stored["metadata"]
    assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 0
    assert meta["finalizers"] == [KEEP]
    assert int(meta["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert answer["metadata"]["deletionTimestamp"] == meta["deletionTimestamp"]
    before = sim.resource_version
    assert delete(api, "q")["metadata"]["resourceVersion"] == meta["resourceVersion"]
    assert sim.resource_version == before


def test_the_pod_goes_once_an_update_empties_its_finalizers(sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
    """Two finalizers: taking one away keeps the Pod (still being deleted, the timestamp kept); taking
    the last away deletes it."""
    kept(api, "q", (KEEP, "example.com/other"))
    delete(api, "q")
    marked = sim.get("Pod", NS, "q")
    assert marked is not None
    patch(api, "q", [{"op": "remove", "path": "/metadata/finalizers/0"}])
    one_left = sim.get("Pod", NS, "q")
    assert one_left is not None
    assert one_left["metadata"]["finalizers"] == ["example.com/other"]
    assert one_left["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    patch(api, "q", {"metadata": {"finalizers": None}})
    assert sim.get("Pod", NS, "q") is None


def test_an_update_cannot_take_the_deletion_away_or_add_a_finalizer(
    sim: KubeSim, api: kubernetes.client.CoreV1Api
) -> None:
    """A PUT without the deletion's fields keeps them (rest.BeforeUpdate); a new finalizer on a Pod being
    deleted is refused (422, metadata.finalizers Forbidden)."""
    kept(api, "q")
    delete(api, "q")
    stored = sim.get("Pod", NS, "q")
    assert stored is not None
    body = {**stored, "metadata": {k: v for k, v in stored["metadata"].items() if not k.startswith("deletion")}}
    body["metadata"]["labels"] = {"a": "b"}
    response = api.replace_namespaced_pod("q", NS, body, _preload_content=False, _request_timeout=TIMEOUT)
    replaced = orjson.loads(response.data)
    assert replaced["metadata"]["deletionTimestamp"] == stored["metadata"]["deletionTimestamp"]
    assert replaced["metadata"]["labels"] == {"a": "b"}
    with pytest.raises(kubernetes.client.ApiException) as err:
        patch(api, "q", {"metadata": {"finalizers": [KEEP, "example.com/late"]}})
    status = orjson.loads(err.value.body)
    assert status["code"] == 422
    assert [(c["field"], c["reason"]) for c in status["details"]["causes"]] == [
        ("metadata.finalizers", "FieldValueForbidden")
    ]
    assert 'found new finalizers []string{"example.com/late"}' in status["message"]


def test_a_pod_without_finalizers_is_deleted_at_once(sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
    kept(api, "q", ())
    delete(api, "q")
    assert sim.get("Pod", NS, "q") is None
