"""Writes to the API simulator (webhook/testing/kubewrite.py, kubevalidate.py, kubepods.py), driven through
the real `kubernetes` client as gpupool's queue drives them: `patch_namespaced_pod` with a dict body (a
strategic merge patch) or a list body (a JSON Patch), `replace_namespaced_pod`, and raw HTTP where the
client cannot say it.

Every rule is pinned as kube-apiserver enforces it (pkg/apis/core/validation ValidatePodCreate and
ValidatePodUpdate, KEP-3521 and KEP-3838): the status code, the Status reason, and the field path of the
refusal.
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

NS, GATE = "team-a", "gpupool.io/queue"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
Obj = dict[str, Any]


def pod_body(name: str, *, gates: tuple[str, ...] = (GATE,), **spec: Any) -> Obj:
    container = {"name": "main", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpupool.io/gpu-class": "medium"}},
        "spec": {
            "containers": [container],
            **({"schedulingGates": [{"name": g} for g in gates]} if gates else {}),
            **spec,
        },
    }


def create(api: kubernetes.client.CoreV1Api, name: str, **kwargs: Any) -> Obj:
    """POST a Pod as kube-apiserver would store it after the webhook; returns it as stored (raw JSON)."""
    response = api.create_namespaced_pod(NS, pod_body(name, **kwargs), _preload_content=False, _request_timeout=TIMEOUT)
    created: Obj = orjson.loads(response.data)
    return created


def patch(api: kubernetes.client.CoreV1Api, name: str, body: Any, **kwargs: Any) -> Obj:
    response = api.patch_namespaced_pod(name, NS, body, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)
    patched: Obj = orjson.loads(response.data)
    return patched


def refused(call: Any, *args: Any, **kwargs: Any) -> Obj:
    """The Status of a refused call, with its HTTP status as `code`."""
    with pytest.raises(kubernetes.client.ApiException) as err:
        call(*args, _request_timeout=TIMEOUT, **kwargs)
    status: Obj = orjson.loads(err.value.body)
    assert status["code"] == err.value.status
    return status


def causes(status: Obj) -> list[tuple[str, str]]:
    return [(c["field"], c["reason"]) for c in status["details"]["causes"]]


def release(pod: Obj, *, selector: dict[str, str] | None = None, rv: str | None = None) -> Obj:
    """The queue's release: one strategic merge patch adding the pool's nodeSelector, the tolerations
    (every existing one kept: the list is replaced whole) and gpupool.io/pool, removing the gate."""
    return {
        "metadata": {
            "resourceVersion": rv or pod["metadata"]["resourceVersion"],
            "annotations": {"gpupool.io/pool": "nvidia/medium/Tesla-T4"},
        },
        "spec": {
            "nodeSelector": selector or {"nvidia.com/gpu.product": "Tesla-T4"},
            "tolerations": [*pod["spec"]["tolerations"], GPU_TOLERATION],
            "schedulingGates": [{"name": GATE, "$patch": "delete"}],
        },
    }


def raw(sim: KubeSim, method: str, path: str, body: bytes, content_type: str) -> tuple[int, Obj]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=TIMEOUT)
    try:
        conn.request(
            method, path, body=body, headers={"Authorization": "Bearer kubesim-token", "Content-Type": content_type}
        )
        response = conn.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        conn.close()


class TestCreate:
    def test_a_created_pod_is_stored_as_kube_apiserver_stores_it(self, api: kubernetes.client.CoreV1Api) -> None:
        """Pending with the SchedulingGated condition, generation 1, requests defaulted from limits, priority 0,
        the default scheduler and DefaultTolerationSeconds' two tolerations."""
        pod = create(api, "q")
        spec, status = pod["spec"], pod["status"]
        assert status["phase"] == "Pending"
        assert status["conditions"] == [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates",
            }
        ]
        assert pod["metadata"]["generation"] == 1
        assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
        assert (spec["priority"], spec["schedulerName"]) == (0, "default-scheduler")
        assert [(t["key"], t["effect"], t["tolerationSeconds"]) for t in spec["tolerations"]] == [
            ("node.kubernetes.io/not-ready", "NoExecute", 300),
            ("node.kubernetes.io/unreachable", "NoExecute", 300),
        ]

    def test_a_pod_bound_to_a_node_cannot_have_gates(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        status = refused(api.create_namespaced_pod, NS, pod_body("bound", nodeName="gpu-1"))
        assert (status["code"], status["reason"]) == (422, "Invalid")
        assert causes(status) == [("spec.nodeName", "FieldValueForbidden")]
        assert "cannot be set until all schedulingGates have been cleared" in status["message"]
        assert sim.get("Pod", NS, "bound") is None

    def test_gate_names_are_qualified_names_without_duplicates(self, api: kubernetes.client.CoreV1Api) -> None:
        status = refused(api.create_namespaced_pod, NS, pod_body("dup", gates=(GATE, "bad gate", GATE)))
        assert causes(status) == [
            ("spec.schedulingGates[1]", "FieldValueInvalid"),
            ("spec.schedulingGates[2]", "FieldValueDuplicate"),
        ]

    def test_user_tolerations_are_kept_and_counted_as_tolerating(self, api: kubernetes.client.CoreV1Api) -> None:
        """A Pod that tolerates every NoExecute taint gets no default toleration."""
        pod = create(api, "tolerant", tolerations=[{"operator": "Exists", "effect": "NoExecute"}])
        assert pod["spec"]["tolerations"] == [{"operator": "Exists", "effect": "NoExecute"}]


class TestPatchTypes:
    def test_the_release_is_one_strategic_merge_patch(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """Constraints added and the last gate removed together, the resourceVersion as the precondition: the
        Pod is ungated, pinned, annotated, one generation on, and watchers see one MODIFIED event."""
        pod = create(api, "q")
        stream = kubernetes.watch.Watch().stream(
            api.list_namespaced_pod, NS, resource_version=pod["metadata"]["resourceVersion"], timeout_seconds=TIMEOUT
        )
        released = patch(api, "q", release(pod))
        assert "schedulingGates" not in released["spec"]
        assert released["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-T4"}
        assert released["spec"]["tolerations"][-1] == GPU_TOLERATION
        assert released["metadata"]["annotations"]["gpupool.io/pool"] == "nvidia/medium/Tesla-T4"
        assert released["metadata"]["generation"] == 2
        assert int(released["metadata"]["resourceVersion"]) > int(pod["metadata"]["resourceVersion"])
        event = next(stream)
        assert (event["type"], event["object"].metadata.resource_version) == (
            "MODIFIED",
            released["metadata"]["resourceVersion"],
        )
        assert event["object"].spec.scheduling_gates is None

    def test_a_list_body_is_a_json_patch(self, api: kubernetes.client.CoreV1Api) -> None:
        pod = create(api, "q")
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": pod["metadata"]["resourceVersion"]},
            {"op": "add", "path": "/spec/nodeSelector", "value": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            {"op": "add", "path": "/spec/tolerations/-", "value": GPU_TOLERATION},
            {"op": "remove", "path": "/spec/schedulingGates"},
        ]
        released = patch(api, "q", ops)
        assert "schedulingGates" not in released["spec"]
        assert released["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}

    def test_a_json_merge_patch(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        out = patch(api, "q", {"metadata": {"labels": {"queue": "gpu"}}}, _content_type="application/merge-patch+json")
        assert out["metadata"]["labels"] == {"queue": "gpu"}

    @pytest.mark.parametrize("content_type", ["application/apply-patch+yaml", "application/json", "text/plain"])
    def test_other_content_types_are_415(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api, content_type: str
    ) -> None:
        create(api, "q")
        code, status = raw(sim, "PATCH", f"/api/v1/namespaces/{NS}/pods/q", b"{}", content_type)
        assert (code, status["reason"]) == (415, "UnsupportedMediaType")
        assert "application/strategic-merge-patch+json" in status["message"]

    def test_a_json_patch_that_does_not_apply_is_422(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        status = refused(api.patch_namespaced_pod, "q", NS, [{"op": "remove", "path": "/spec/nodeSelector"}])
        assert (status["code"], status["reason"]) == (422, "Invalid")

    def test_a_patch_giving_a_field_the_wrong_type_is_422_on_patch(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        status = refused(api.patch_namespaced_pod, "q", NS, {"spec": {"nodeSelector": ["not", "a", "map"]}})
        assert causes(status) == [("patch", "FieldValueInvalid")]


class TestPreconditions:
    def test_a_stale_resource_version_in_a_patch_is_409_and_changes_nothing(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        pod = create(api, "q")
        patch(api, "q", {"metadata": {"labels": {"touched": "yes"}}})  # someone else wrote in between
        before = sim.resource_version
        status = refused(api.patch_namespaced_pod, "q", NS, release(pod))
        assert (status["code"], status["reason"]) == (409, "Conflict")
        assert status["message"] == (
            'Operation cannot be fulfilled on pods "q": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        assert status["details"] == {"name": "q", "kind": "pods"}
        assert sim.resource_version == before
        assert sim.get("Pod", NS, "q")["spec"]["schedulingGates"] == [{"name": GATE}]  # type: ignore[index]

    def test_json_patch_a_replaced_resource_version_is_409_a_failed_test_422(
        self, api: kubernetes.client.CoreV1Api
    ) -> None:
        """Only a resourceVersion the patched object carries is a precondition; a `test` op is a JSON Patch
        failure like any other."""
        create(api, "q")
        stale = [{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}]
        tested = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}]
        assert refused(api.patch_namespaced_pod, "q", NS, stale)["code"] == 409
        assert refused(api.patch_namespaced_pod, "q", NS, tested)["code"] == 422

    def test_replace_with_a_stale_resource_version_is_409_without_one_unconditional(
        self, api: kubernetes.client.CoreV1Api
    ) -> None:
        create(api, "q")
        current = api.read_namespaced_pod("q", NS, _request_timeout=TIMEOUT)
        current.metadata.labels = {"v": "1"}
        api.replace_namespaced_pod("q", NS, current, _request_timeout=TIMEOUT)
        current.metadata.labels = {"v": "2"}
        assert refused(api.replace_namespaced_pod, "q", NS, current)["reason"] == "Conflict"
        current.metadata.resource_version = None
        assert api.replace_namespaced_pod("q", NS, current, _request_timeout=TIMEOUT).metadata.labels == {"v": "2"}

    def test_a_missing_pod_is_404(self, api: kubernetes.client.CoreV1Api) -> None:
        for status in (
            refused(api.patch_namespaced_pod, "ghost", NS, {"metadata": {"labels": {"a": "b"}}}),
            refused(api.patch_namespaced_pod, "ghost", NS, [{"op": "remove", "path": "/spec/schedulingGates"}]),
            refused(api.replace_namespaced_pod, "ghost", NS, pod_body("ghost")),
        ):
            assert (status["code"], status["reason"], status["message"]) == (404, "NotFound", 'pods "ghost" not found')

    def test_a_delete_with_a_stale_precondition_is_409(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        options = kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(resource_version="1")
        )
        status = refused(api.delete_namespaced_pod, "q", NS, body=options)
        assert status["code"] == 409 and "Precondition failed: ResourceVersion in precondition: 1" in status["message"]
        assert sim.get("Pod", NS, "q") is not None


class TestSchedulingGates:
    def test_gates_can_only_be_removed(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        status = refused(api.patch_namespaced_pod, "q", NS, {"spec": {"schedulingGates": [{"name": "late.io/gate"}]}})
        assert causes(status) == [("spec.schedulingGates[0].name", "FieldValueForbidden")]
        assert "only deletion is allowed, but found new scheduling gate 'late.io/gate'" in status["message"]

    def test_an_ungated_pod_cannot_get_a_gate(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "free", gates=())
        ops = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
        assert causes(refused(api.patch_namespaced_pod, "free", NS, ops)) == [
            ("spec.schedulingGates[0].name", "FieldValueForbidden")
        ]

    def test_deleting_a_gate_of_a_pod_without_gates_adds_it_and_is_refused(
        self, api: kubernetes.client.CoreV1Api
    ) -> None:
        """A second release (say after a manual one) is refused, not a no-op: the strategic merge patch of
        a list the Pod lacks takes the patch's item, which is a new gate."""
        pod = create(api, "q")
        released = patch(api, "q", release(pod))
        again = refused(api.patch_namespaced_pod, "q", NS, release(released))
        assert (again["code"], causes(again)) == (422, [("spec.schedulingGates[0].name", "FieldValueForbidden")])

    def test_one_of_two_gates_removed_keeps_the_pod_gated(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q", gates=(GATE, "other.io/gate"))
        out = patch(api, "q", {"spec": {"schedulingGates": [{"name": GATE, "$patch": "delete"}]}})
        assert out["spec"]["schedulingGates"] == [{"name": "other.io/gate"}]


class TestTolerations:
    def test_any_pod_may_add_tolerations(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "free", gates=())
        out = patch(api, "free", [{"op": "add", "path": "/spec/tolerations/-", "value": GPU_TOLERATION}])
        assert out["spec"]["tolerations"][-1] == GPU_TOLERATION

    def test_an_existing_toleration_cannot_change_or_go(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q", tolerations=[{"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}])
        changed = [{"op": "replace", "path": "/spec/tolerations/0/value", "value": "b"}]
        dropped = {"spec": {"tolerations": [GPU_TOLERATION]}}  # the list is replaced whole
        for body in (changed, dropped):
            status = refused(api.patch_namespaced_pod, "q", NS, body)
            assert causes(status) == [("spec.tolerations", "FieldValueForbidden")]
            assert "existing toleration can not be modified except its tolerationSeconds" in status["message"]

    def test_only_toleration_seconds_may_change(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        out = patch(api, "q", [{"op": "replace", "path": "/spec/tolerations/0/tolerationSeconds", "value": 30}])
        assert out["spec"]["tolerations"][0]["tolerationSeconds"] == 30

    def test_the_default_tolerations_come_back_when_a_patch_drops_them(self, api: kubernetes.client.CoreV1Api) -> None:
        """DefaultTolerationSeconds runs on updates too: a list without them gets them appended."""
        create(api, "q")
        out = patch(api, "q", {"spec": {"tolerations": [GPU_TOLERATION]}})
        assert [t["key"] for t in out["spec"]["tolerations"]] == [
            "nvidia.com/gpu",
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ]


def affinity(*terms: list[Obj]) -> Obj:
    terms_json = [{"matchExpressions": t} for t in terms]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms_json}}}


ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}
PRODUCT = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4", "NVIDIA-L4"]}


class TestGatedPlacement:
    def test_a_gated_pod_may_get_new_node_selector_keys(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q", nodeSelector={"team": "a"})
        out = patch(api, "q", {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"}}})
        assert out["spec"]["nodeSelector"] == {"team": "a", "nvidia.com/gpu.product": "Tesla-T4"}

    @pytest.mark.parametrize(
        "body",
        [
            pytest.param({"spec": {"nodeSelector": {"team": "b"}}}, id="changed"),
            pytest.param({"spec": {"nodeSelector": {"team": None, "x": "y"}}}, id="removed"),
        ],
    )
    def test_existing_node_selector_keys_never_change_or_go(self, api: kubernetes.client.CoreV1Api, body: Obj) -> None:
        create(api, "q", nodeSelector={"team": "a"})
        status = refused(api.patch_namespaced_pod, "q", NS, body)
        assert causes(status) == [("spec.nodeSelector", "FieldValueInvalid")]
        assert "only additions to spec.nodeSelector are allowed (no mutations or deletions)" in status["message"]

    def test_an_ungated_pod_cannot_get_a_node_selector(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "free", gates=())
        status = refused(api.patch_namespaced_pod, "free", NS, {"spec": {"nodeSelector": {"x": "y"}}})
        assert causes(status) == [("spec", "FieldValueForbidden")]
        assert "pod updates may not change fields other than `spec.containers[*].image`" in status["message"]

    def test_a_node_selector_value_must_be_a_label_value(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        status = refused(
            api.patch_namespaced_pod, "q", NS, {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "Tesla T4"}}}
        )
        assert causes(status) == [("spec.nodeSelector", "FieldValueInvalid")]
        assert 'Invalid value: "Tesla T4": a valid label must be an empty string' in status["message"]

    def test_required_affinity_may_be_set_when_empty(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        out = patch(api, "q", {"spec": {"affinity": affinity([PRODUCT])}})
        assert out["spec"]["affinity"] == affinity([PRODUCT])

    def test_each_term_may_get_expressions_appended(self, api: kubernetes.client.CoreV1Api) -> None:
        """The terms (ORed) stay, each with its expressions first: the strategic merge patch sends them
        whole, since nodeSelectorTerms and matchExpressions have no merge key."""
        other = {"key": "pool", "operator": "Exists"}
        create(api, "q", affinity=affinity([ZONE], [other]))
        out = patch(api, "q", {"spec": {"affinity": affinity([ZONE, PRODUCT], [other, PRODUCT])}})
        assert out["spec"]["affinity"] == affinity([ZONE, PRODUCT], [other, PRODUCT])

    def test_terms_cannot_be_added_and_expressions_cannot_change(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q", affinity=affinity([ZONE]))
        path = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        added = refused(api.patch_namespaced_pod, "q", NS, {"spec": {"affinity": affinity([ZONE], [PRODUCT])}})
        changed = refused(api.patch_namespaced_pod, "q", NS, {"spec": {"affinity": affinity([PRODUCT, ZONE])}})
        assert causes(added) == [(path, "FieldValueInvalid")]
        assert "no additions/deletions to non-empty NodeSelectorTerms list are allowed" in added["message"]
        assert causes(changed) == [(f"{path}[0]", "FieldValueInvalid")]
        assert "only additions are allowed (no mutations or deletions)" in changed["message"]

    def test_an_ungated_pods_affinity_is_immutable(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "free", gates=(), affinity=affinity([ZONE]))
        status = refused(api.patch_namespaced_pod, "free", NS, {"spec": {"affinity": affinity([ZONE, PRODUCT])}})
        assert causes(status) == [("spec", "FieldValueForbidden")]

    def test_constraints_may_come_with_the_last_gate_going(self, api: kubernetes.client.CoreV1Api) -> None:
        """The rule reads the OLD Pod's gates, so one patch can add the affinity and ungate."""
        create(api, "q")
        body = {"spec": {"affinity": affinity([PRODUCT]), "schedulingGates": [{"name": GATE, "$patch": "delete"}]}}
        out = patch(api, "q", body)
        assert "schedulingGates" not in out["spec"] and out["spec"]["affinity"] == affinity([PRODUCT])


class TestImmutableSpec:
    def test_container_resources_cannot_change(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        body = {"spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
        status = refused(api.patch_namespaced_pod, "q", NS, body)
        assert (status["code"], causes(status)) == (422, [("spec", "FieldValueForbidden")])
        assert "spec.containers[0].resources.limits.nvidia.com/gpu" in status["message"]

    def test_images_may_change(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        assert (
            patch(api, "q", {"spec": {"containers": [{"name": "main", "image": "cuda:13"}]}})["spec"]["containers"][0][
                "image"
            ]
            == "cuda:13"
        )

    def test_containers_cannot_be_added(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        status = refused(api.patch_namespaced_pod, "q", NS, {"spec": {"containers": [{"name": "extra", "image": "x"}]}})
        assert causes(status) == [("spec.containers", "FieldValueForbidden")]
        assert "pod updates may not add or remove containers" in status["message"]

    def test_the_deadline_may_be_set_and_lowered_never_raised(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        assert patch(api, "q", {"spec": {"activeDeadlineSeconds": 600}})["spec"]["activeDeadlineSeconds"] == 600
        assert patch(api, "q", {"spec": {"activeDeadlineSeconds": 300}})["spec"]["activeDeadlineSeconds"] == 300
        status = refused(api.patch_namespaced_pod, "q", NS, {"spec": {"activeDeadlineSeconds": 900}})
        assert causes(status) == [("spec.activeDeadlineSeconds", "FieldValueInvalid")]
        assert "must be less than or equal to previous value" in status["message"]

    def test_labels_and_annotations_may_change_if_valid(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        out = patch(api, "q", {"metadata": {"labels": {"queue": "gpu"}, "annotations": {"gpupool.io/gpu-class": None}}})
        assert out["metadata"]["labels"] == {"queue": "gpu"}
        assert "annotations" not in out["metadata"]  # an empty map is left out, as Go's omitempty leaves it
        status = refused(api.patch_namespaced_pod, "q", NS, {"metadata": {"labels": {"queue": "not valid!"}}})
        # Twice, as kube-apiserver says it: ValidatePodUpdate checks the new metadata as an update and anew.
        assert causes(status) == [("metadata.labels", "FieldValueInvalid")] * 2

    def test_the_status_is_not_written_through_the_pod(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        out = patch(api, "q", {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Running"}})
        assert out["status"]["phase"] == "Pending"


class TestEveryWrite:
    def test_a_write_that_changes_nothing_is_not_written(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        """As etcd3's store skips it: same resourceVersion, no watch event."""
        pod = create(api, "q")
        before = sim.resource_version
        out = patch(api, "q", {"metadata": {"annotations": {"gpupool.io/gpu-class": "medium"}}})
        assert out["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
        assert sim.resource_version == before

    def test_a_dry_run_checks_everything_and_stores_nothing(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        pod = create(api, "q")
        before = sim.resource_version
        out = patch(api, "q", release(pod), dry_run="All", field_manager="gpupool")
        assert "schedulingGates" not in out["spec"]
        assert sim.resource_version == before
        assert sim.get("Pod", NS, "q")["spec"]["schedulingGates"] == [{"name": GATE}]  # type: ignore[index]
        assert refused(api.patch_namespaced_pod, "q", NS, {"spec": {"nodeName": "n"}}, dry_run="All")["code"] == 422

    def test_options_kube_apiserver_refuses_are_refused(self, api: kubernetes.client.CoreV1Api) -> None:
        create(api, "q")
        bad_dry_run = refused(api.patch_namespaced_pod, "q", NS, {}, dry_run="Yes")
        forced = refused(api.patch_namespaced_pod, "q", NS, {}, force=True)
        assert causes(bad_dry_run) == [("dryRun", "FieldValueNotSupported")]
        assert causes(forced) == [("force", "FieldValueForbidden")]

    def test_writes_to_a_collection_or_without_a_name_are_405(self, sim: KubeSim) -> None:
        code, status = raw(sim, "PATCH", f"/api/v1/namespaces/{NS}/pods", b"{}", "application/merge-patch+json")
        assert (code, status["reason"]) == (405, "MethodNotAllowed")

    def test_other_kinds_are_patched_with_the_generic_rules(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        """Cordoning a node; its status stays what it was (only the status subresource changes it)."""
        sim.add({"kind": "Node", "metadata": {"name": "n1"}, "status": {"allocatable": {"pods": "110"}}})
        out = api.patch_node(
            "n1", {"spec": {"unschedulable": True}, "status": {"allocatable": {}}}, _request_timeout=TIMEOUT
        )
        assert out.spec.unschedulable is True
        assert out.status.allocatable == {"pods": "110"}

    def test_injected_failures_apply_to_patches(self, sim: KubeSim, api: kubernetes.client.CoreV1Api) -> None:
        pod = create(api, "q")
        sim.fail_next(1, 500, verb="patch")
        assert refused(api.patch_namespaced_pod, "q", NS, release(pod))["code"] == 500
        assert "schedulingGates" not in patch(api, "q", release(pod))["spec"]
        assert sim.write_requests("patch", "pods") == 2
