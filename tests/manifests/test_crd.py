"""The GPUPool CustomResourceDefinition (manifests/base/crd.yaml): `kubectl get gpupools` shows each pool's
figures in columns, kube-apiserver accepts the schema (structural), and every namespace user may read the
objects while only gpupool writes them.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.builders import gpu_node, index_of
from tests.manifests.rendered import KUBECTL, VIEW_ROLE, WEBHOOK_ROLE, Obj, Rendering, granted
from webhook.pools.statuses import pool_statuses

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)

CRD = "gpupools.gpupool.io"
COLUMNS = [
    "Vendor",
    "Class",
    "Product",
    "Kind",
    "Nodes",
    "Capacity",
    "Allocated",
    "Free",
    "Largest free",
    "Queued",
    "Age",
]


def version(r: Rendering) -> Obj:
    (served,) = r.named("CustomResourceDefinition", CRD)["spec"]["versions"]
    return dict(served)


def structural_problems(schema: dict[str, Any], at: str = "") -> list[str]:
    """Where a schema breaks kube-apiserver's rules for a structural schema (a `type` on every node but
    the root's apiVersion/kind/metadata, `properties` only on objects, no `additionalProperties` beside
    `properties`); empty when it keeps them."""
    problems = []
    if "type" not in schema:
        problems.append(f"{at or '.'}: no type")
    if "properties" in schema and schema.get("type") != "object":
        problems.append(f"{at}: properties on a {schema.get('type')}")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{at}: properties and additionalProperties")
    for name, sub in schema.get("properties", {}).items():
        problems += structural_problems(sub, f"{at}.{name}")
    if "items" in schema:
        problems += structural_problems(schema["items"], f"{at}[]")
    return problems


def field_at(schema: dict[str, Any], json_path: str) -> dict[str, Any] | None:
    """The schema node a printer column's jsonPath (`.status.free`) names; None when there is none."""
    node: dict[str, Any] | None = schema
    for part in json_path.lstrip(".").split("."):
        node = (node or {}).get("properties", {}).get(part)
    return node


class TestDefinition:
    def test_a_cluster_scoped_kind_with_a_status_subresource(self, rendering: Rendering) -> None:
        """GPUPool, v1alpha1, cluster-scoped (a pool belongs to no namespace), with a status subresource so
        that gpupool writes figures without touching what an object is."""
        spec = rendering.named("CustomResourceDefinition", CRD)["spec"]
        assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
            "gpupool.io",
            "Cluster",
            "GPUPool",
            "gpupools",
        )
        served = version(rendering)
        assert (served["name"], served["served"], served["storage"]) == ("v1alpha1", True, True)
        assert served["subresources"] == {"status": {}}

    def test_the_schema_is_structural(self, rendered: dict[str, Rendering]) -> None:
        """kube-apiserver refuses a CRD whose schema is not structural; every field here has a type."""
        schema = version(rendered["base"])["schema"]["openAPIV3Schema"]
        assert structural_problems(schema) == []
        assert structural_problems({"type": "object", "properties": {"status": {"properties": {}}}}) == [
            ".status: no type",
            ".status: properties on a None",
        ]

    def test_kubectl_get_shows_each_figure_in_a_column(self, rendered: dict[str, Rendering]) -> None:
        """`kubectl get gpupools` prints these columns, each a field of the schema of the column's type."""
        served = version(rendered["base"])
        schema = served["schema"]["openAPIV3Schema"]
        assert [c["name"] for c in served["additionalPrinterColumns"]] == COLUMNS
        for column in served["additionalPrinterColumns"]:
            if column["type"] == "date":
                assert column["jsonPath"] == ".metadata.creationTimestamp"
                continue
            node = field_at(schema, column["jsonPath"])
            assert node is not None, f"column {column['name']}: {column['jsonPath']} is not in the schema"
            assert node["type"] == column["type"], column["name"]

    def test_what_the_leader_writes_is_what_the_schema_holds(self, rendered: dict[str, Rendering]) -> None:
        """Each status the leader writes validates against the schema, and names every field the schema
        has: kube-apiserver prunes unknown fields, so a field the CRD lacks would be lost silently."""
        schema = version(rendered["base"])["schema"]["openAPIV3Schema"]
        index = index_of([gpu_node("t4-a", "Tesla-T4", 4), gpu_node("l4-a", "NVIDIA-L4", 2, memory_mib=23034)])
        for name, status in pool_statuses(index.capacity.pool_stats(), {}).items():
            obj = {"apiVersion": "gpupool.io/v1alpha1", "kind": "GPUPool", "metadata": {"name": name}}
            jsonschema.validate({**obj, "spec": {"pool": status["pool"]}, "status": status}, schema)
            assert set(status) == set(schema["properties"]["status"]["properties"])


class TestAccess:
    def test_every_namespace_user_may_read_the_pools(self, rendering: Rendering) -> None:
        """The built-in `view` role (and so `edit` and `admin`) aggregates gpupool-view: read, never write."""
        role = rendering.named("ClusterRole", VIEW_ROLE)
        assert role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
        assert granted(role) == {("gpupool.io", "gpupools", v) for v in ("get", "list", "watch")}
        assert not [b for b in rendering.all("ClusterRoleBinding") if b["roleRef"]["name"] == VIEW_ROLE]

    def test_only_gpupool_writes_them(self, rendering: Rendering) -> None:
        """Of the install's roles, only gpupool's own may create, delete or write the status of GPUPools."""
        writers = {
            role["metadata"]["name"]
            for role in rendering.all("ClusterRole")
            if {(g, r) for g, r, v in granted(role) if v not in ("get", "list", "watch")}
            & {("gpupool.io", "gpupools"), ("gpupool.io", "gpupools/status")}
        }
        assert writers == {WEBHOOK_ROLE}
