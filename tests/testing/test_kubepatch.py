"""The three patch types as kube-apiserver applies them (webhook/testing/kubepatch.py), on plain objects.

The strategic merge patch cases are the semantics of apimachinery's util/strategicpatch for a Pod; the
patch metadata behind them is checked against the published OpenAPI schema (kubernetes-validate's
copy of Kubernetes 1.37), so a field's merge key or strategy can never silently differ from the API's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from webhook.testing.kubepatch import (
    SCHEMAS,
    PatchError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
    patch_paths,
)
from webhook.testing.kubeproto import ApiError

Obj = dict[str, Any]


def gated_pod(**spec: Any) -> Obj:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p", "namespace": "team-a", "labels": {"app": "train"}, "resourceVersion": "7"},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda:12", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                {"name": "side", "image": "proxy:1"},
            ],
            "schedulingGates": [{"name": "gpupool.io/queue"}, {"name": "other.io/gate"}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
            "nodeSelector": {"team": "a"},
            **spec,
        },
    }


def smp(obj: Obj, patch: Any) -> Obj:
    return apply_strategic_merge_patch(obj, patch, "Pod")


class TestStrategicMergePatch:
    def test_maps_merge_and_null_deletes_a_key(self) -> None:
        out = smp(
            gated_pod(), {"metadata": {"labels": {"queue": "gpu", "app": None}}, "spec": {"nodeSelector": {"x": "y"}}}
        )
        assert out["metadata"]["labels"] == {"queue": "gpu"}
        assert out["spec"]["nodeSelector"] == {"team": "a", "x": "y"}

    def test_a_delete_directive_removes_one_gate_by_name(self) -> None:
        """What a queue's release sends: the other gate and every other field stay."""
        out = smp(gated_pod(), {"spec": {"schedulingGates": [{"name": "gpupool.io/queue", "$patch": "delete"}]}})
        assert out["spec"]["schedulingGates"] == [{"name": "other.io/gate"}]
        assert out["spec"]["containers"] == gated_pod()["spec"]["containers"]

    def test_containers_and_their_env_merge_by_name(self) -> None:
        patch = {"spec": {"containers": [{"name": "main", "image": "cuda:13", "env": [{"name": "B", "value": "9"}]}]}}
        out = smp(gated_pod(), patch)
        main, side = out["spec"]["containers"]
        assert (main["image"], main["env"]) == ("cuda:13", [{"name": "A", "value": "1"}, {"name": "B", "value": "9"}])
        assert side == {"name": "side", "image": "proxy:1"}

    def test_a_new_item_of_a_merged_list_goes_before_the_live_ones(self) -> None:
        """mergeSortedSlice: an item the live list does not know is placed before the server-only items."""
        out = smp(gated_pod(), {"spec": {"schedulingGates": [{"name": "new.io/gate"}]}})
        assert [g["name"] for g in out["spec"]["schedulingGates"]] == [
            "new.io/gate",
            "gpupool.io/queue",
            "other.io/gate",
        ]

    @pytest.mark.parametrize(
        "field",
        [
            pytest.param("tolerations", id="tolerations"),
            pytest.param("affinity", id="node-selector-terms"),
        ],
    )
    def test_lists_without_a_merge_key_are_replaced_whole(self, field: str) -> None:
        term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
        pod = gated_pod(
            affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
        )
        new_term = {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
        patches = {
            "tolerations": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}},
            "affinity": {
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [new_term]}
                        }
                    }
                }
            },
        }
        out = smp(pod, patches[field])
        if field == "tolerations":
            assert out["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
        else:
            required = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert required["nodeSelectorTerms"] == [new_term]

    def test_a_replace_directive_replaces_a_merged_list(self) -> None:
        out = smp(gated_pod(), {"spec": {"schedulingGates": [{"name": "only.io/gate"}, {"$patch": "replace"}]}})
        assert out["spec"]["schedulingGates"] == [{"name": "only.io/gate"}]

    def test_map_directives_replace_or_empty_a_map(self) -> None:
        replaced = smp(gated_pod(), {"spec": {"nodeSelector": {"$patch": "replace", "x": "y"}}})
        emptied = smp(gated_pod(), {"metadata": {"labels": {"$patch": "delete"}}})
        assert replaced["spec"]["nodeSelector"] == {"x": "y"}
        assert emptied["metadata"]["labels"] == {}

    def test_scalar_lists_with_the_merge_strategy_are_a_union_and_a_parallel_list_deletes(self) -> None:
        pod = gated_pod()
        pod["metadata"]["finalizers"] = ["a.io/x", "b.io/y"]
        union = smp(pod, {"metadata": {"finalizers": ["c.io/z", "a.io/x"]}})
        deleted = smp(pod, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.io/x"]}})
        assert sorted(union["metadata"]["finalizers"]) == ["a.io/x", "b.io/y", "c.io/z"]
        assert deleted["metadata"]["finalizers"] == ["b.io/y"]

    def test_set_element_order_orders_the_merged_list(self) -> None:
        patch = {"spec": {"$setElementOrder/containers": [{"name": "side"}, {"name": "main"}]}}
        out = smp(gated_pod(), patch)
        assert [c["name"] for c in out["spec"]["containers"]] == ["side", "main"]

    def test_retain_keys_clears_what_it_does_not_name(self) -> None:
        pod = gated_pod(volumes=[{"name": "data", "emptyDir": {}}])
        out = smp(
            pod,
            {"spec": {"volumes": [{"name": "data", "hostPath": {"path": "/d"}, "$retainKeys": ["name", "hostPath"]}]}},
        )
        assert out["spec"]["volumes"] == [{"name": "data", "hostPath": {"path": "/d"}}]

    def test_a_delete_directive_for_a_list_the_pod_lacks_adds_the_item(self) -> None:
        """As in Go: a list the original lacks is taken from the patch as it is, and the typed decode drops
        the `$patch` key, so deleting a gate from an ungated Pod adds that gate (which validation refuses)."""
        pod = gated_pod()
        del pod["spec"]["schedulingGates"]
        out = smp(pod, {"spec": {"schedulingGates": [{"name": "gpupool.io/queue", "$patch": "delete"}]}})
        assert out["spec"]["schedulingGates"] == [{"name": "gpupool.io/queue"}]

    def test_an_item_without_its_merge_key_is_an_internal_error(self) -> None:
        with pytest.raises(PatchError) as err:
            smp(gated_pod(), {"spec": {"schedulingGates": [{"nombre": "x"}]}})
        assert err.value.code == 500 and "does not contain declared merge key: name" in str(err.value)

    def test_a_body_that_is_not_an_object_is_a_bad_request(self) -> None:
        with pytest.raises(ApiError) as err:
            smp(gated_pod(), [{"op": "remove", "path": "/spec"}])
        assert err.value.code == 400

    def test_the_input_objects_are_not_changed(self) -> None:
        pod, patch = gated_pod(), {"spec": {"schedulingGates": [{"name": "gpupool.io/queue", "$patch": "delete"}]}}
        before = json.dumps([pod, patch], sort_keys=True)
        smp(pod, patch)
        assert json.dumps([pod, patch], sort_keys=True) == before


def _published_patch_paths(definitions: Obj, name: str, path: str = "", stack: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every field path under a definition with x-kubernetes-patch-strategy, from the OpenAPI schema."""
    found: dict[str, Any] = {}
    if name in stack:
        return found
    for field, prop in (definitions[name].get("properties") or {}).items():
        here = f"{path}.{field}"
        if "x-kubernetes-patch-strategy" in prop:
            found[here] = (prop["x-kubernetes-patch-strategy"], prop.get("x-kubernetes-patch-merge-key", ""))
        candidates = [prop, prop.get("items") or {}, *prop.get("allOf", [])]
        if isinstance(prop.get("additionalProperties"), dict):
            candidates.append(prop["additionalProperties"])
        ref = next((c["$ref"] for c in candidates if "$ref" in c), None)
        if ref:
            found |= _published_patch_paths(definitions, ref.rsplit("/", 1)[-1], here, (*stack, name))
    return found


@pytest.mark.parametrize(
    ("kind", "definition"),
    [
        ("Pod", "io.k8s.api.core.v1.Pod"),
        ("Node", "io.k8s.api.core.v1.Node"),
        ("ResourceQuota", "io.k8s.api.core.v1.ResourceQuota"),
        ("Event", "io.k8s.api.core.v1.Event"),
        ("Lease", "io.k8s.api.coordination.v1.Lease"),
    ],
)
def test_patch_metadata_is_the_published_schemas(kind: str, definition: str) -> None:
    """Every patchStrategy and patchMergeKey of the served kinds, field by field, as Kubernetes 1.37's
    OpenAPI schema publishes them (the Go tags strategicpatch reads)."""
    schemas = (
        Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.37.0-local" / "_definitions.json"
    )
    definitions = json.loads(schemas.read_text())["$defs"]
    assert patch_paths(SCHEMAS[kind]) == _published_patch_paths(definitions, definition)


class TestMergePatch:
    def test_objects_merge_null_deletes_and_lists_replace(self) -> None:
        out = apply_merge_patch(
            gated_pod(), {"metadata": {"labels": {"app": None, "q": "1"}}, "spec": {"schedulingGates": []}}
        )
        assert out["metadata"]["labels"] == {"q": "1"}
        assert out["spec"]["schedulingGates"] == []
        assert out["spec"]["nodeSelector"] == {"team": "a"}


class TestJsonPatch:
    def test_operations_apply_in_order(self) -> None:
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
            {"op": "remove", "path": "/spec/schedulingGates/0"},
            {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "nvidia.com/gpu", "operator": "Exists"}},
        ]
        out = apply_json_patch(gated_pod(), ops)
        assert out["spec"]["schedulingGates"] == [{"name": "other.io/gate"}]
        assert out["spec"]["tolerations"][-1] == {"key": "nvidia.com/gpu", "operator": "Exists"}

    @pytest.mark.parametrize(
        "ops",
        [
            pytest.param([{"op": "test", "path": "/metadata/resourceVersion", "value": "6"}], id="failed-test"),
            pytest.param([{"op": "remove", "path": "/spec/priority"}], id="missing-path"),
            pytest.param([{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {}}], id="missing-parent"),
            pytest.param([{"op": "jump", "path": "/spec"}], id="unknown-op"),
            pytest.param([{"path": "/spec"}], id="no-op"),
        ],
    )
    def test_an_operation_that_does_not_apply_is_422_with_the_generic_message(self, ops: list[Obj]) -> None:
        with pytest.raises(ApiError) as err:
            apply_json_patch(gated_pod(), ops)
        assert (err.value.code, err.value.reason) == (422, "Invalid")
        assert err.value.message == "the server rejected our request due to an error in our request"

    def test_more_than_ten_thousand_operations_is_413(self) -> None:
        with pytest.raises(ApiError) as err:
            apply_json_patch(gated_pod(), [{"op": "test", "path": "/kind", "value": "Pod"}] * 10_001)
        assert err.value.code == 413
