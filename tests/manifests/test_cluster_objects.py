"""The installed objects are valid for the Kubernetes schemas, the policy ConfigMap is the policy gpupool
reads, and RBAC grants exactly what gpupool needs.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import kubernetes_validate
import pytest

from tests.manifests.rendered import (
    KUBECTL,
    MANIFESTS,
    SCHEMA_VERSIONS,
    WEBHOOK_ROLE,
    Obj,
    Rendering,
    env_value,
    granted,
    kustomize,
    mount_of,
    parse_objects,
    serve_options,
    volume_named,
)
from webhook.commands.serve import NAMESPACE_ENV
from webhook.domain.exactness import policy_warnings
from webhook.domain.policy import Policy, default_policy_text, load_policy_text

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)


# --- schemas -------------------------------------------------------------------------------------


class TestSchemas:
    @pytest.mark.parametrize("version", SCHEMA_VERSIONS)
    def test_every_object_validates(self, rendering: Rendering, version: str) -> None:
        """Every Kubernetes object validates, strictly (no unknown fields), against the OpenAPI schema."""
        for obj in rendering.objects:
            if obj["apiVersion"].startswith("cert-manager.io/"):
                continue  # a CRD: no schema in kubernetes-validate; see TestCertManager
            kubernetes_validate.validate(obj, version, strict=True)

    def test_the_validator_rejects_an_unknown_field(self, rendered: dict[str, Rendering]) -> None:
        """The validation above can fail: a misspelt field in the webhook configuration is rejected."""
        config = copy.deepcopy(rendered["base"].one("MutatingWebhookConfiguration"))
        config["webhooks"][0]["matchCondition"] = config["webhooks"][0].pop("matchConditions")
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(config, SCHEMA_VERSIONS[-1], strict=True)


# --- the policy ConfigMap ------------------------------------------------------------------------


class TestPolicyConfigMap:
    def policy_map(self, r: Rendering) -> Obj:
        (cm,) = [c for c in r.all("ConfigMap") if c["metadata"]["name"].startswith("gpupool-policy")]
        return cm

    def test_configmap_is_the_default_policy_file(self, rendering: Rendering) -> None:
        """The ConfigMap holds byte for byte the policy the code loads by default: no copy to drift."""
        text = self.policy_map(rendering)["data"]["policy.yaml"]
        assert text == (MANIFESTS / "base" / "policy.yaml").read_text(encoding="utf-8")
        assert text == default_policy_text()

    def test_configmap_loads_with_the_project_loader(self, rendered: dict[str, Rendering]) -> None:
        """The ConfigMap's policy passes gpupool's own policy validation."""
        policy = load_policy_text(self.policy_map(rendered["base"])["data"]["policy.yaml"], source="ConfigMap")
        assert isinstance(policy, Policy)
        assert policy.vendors

    def test_the_installed_policy_queues_gpu_pods(self, rendered: dict[str, Rendering]) -> None:
        """As `kubectl kustomize manifests/base` installs it, the policy queues a GPU Pod of a namespace it
        does not mention, and warns of nothing with the Deployment's replicas: every quota is exact."""
        policy = load_policy_text(self.policy_map(rendered["base"])["data"]["policy.yaml"], source="ConfigMap")
        assert policy.placement("a-namespace-the-policy-does-not-mention") == "queue"
        replicas = rendered["base"].one("Deployment")["spec"]["replicas"]
        assert policy_warnings(policy, replicas) == []

    def test_the_server_reads_the_configmap(self, rendering: Rendering) -> None:
        """GPUPOOL_POLICY points at the ConfigMap's key inside the volume that mounts this ConfigMap."""
        cm = self.policy_map(rendering)
        volume = volume_named(rendering, "policy")
        assert volume["configMap"]["name"] == cm["metadata"]["name"]
        assert serve_options(rendering).policy == f"{mount_of(rendering, 'policy')}/policy.yaml"

    def test_a_policy_change_is_made_in_place_without_a_rollout(self, tmp_path: Path) -> None:
        """Editing policy.yaml changes the ConfigMap's data under the same name, and not the Pod template:
        `kubectl apply` updates the mounted file and the running Pods switch to it (the server follows the
        file, tests/serving/test_policyfile.py) instead of a rollout re-listing the cluster per Pod."""
        shutil.copytree(MANIFESTS / "base", tmp_path / "base")
        before = parse_objects(kustomize(tmp_path / "base"), "before")
        with (tmp_path / "base" / "policy.yaml").open("a", encoding="utf-8") as f:
            f.write("\n# an admin's edit\n")
        after = parse_objects(kustomize(tmp_path / "base"), "after")
        assert self.policy_map(before)["metadata"]["name"] == self.policy_map(after)["metadata"]["name"]
        assert self.policy_map(before)["data"] != self.policy_map(after)["data"]
        assert before.one("Deployment")["spec"]["template"] == after.one("Deployment")["spec"]["template"]


# --- RBAC ----------------------------------------------------------------------------------------


class TestRbac:
    def test_reads_nodes_pods_and_quotas_and_writes_only_what_the_queue_needs(self, rendering: Rendering) -> None:
        """Cluster-wide: get, list and watch on nodes, pods and resourcequotas; patch of pods (the queue's
        release), create of events (telling the Pod), the pools' GPUPool objects (list, create and delete
        them, patch their status) and the namespaces' queue summaries (create ConfigMaps; list, patch and
        delete only those named gpupool-queue). In its own namespace only: the Lease."""
        reads = {("", r, v) for r in ("nodes", "pods", "resourcequotas") for v in ("get", "list", "watch")}
        pools = {("gpupool.io", "gpupools", v) for v in ("list", "create", "delete")}
        summaries = {("", "configmaps", "create")}
        summaries |= {("", "configmaps/gpupool-queue", v) for v in ("list", "patch", "delete")}
        assert granted(rendering.named("ClusterRole", WEBHOOK_ROLE)) == reads | pools | summaries | {
            ("", "pods", "patch"),
            ("", "events", "create"),
            ("gpupool.io", "gpupools/status", "patch"),
        }
        (role,) = rendering.all("Role")
        assert role["metadata"]["namespace"] == rendering.one("Deployment")["metadata"]["namespace"]
        assert role["rules"] == [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
        ]
        (binding,) = rendering.all("RoleBinding")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        account = rendering.one("ServiceAccount")["metadata"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]

    def test_the_replicas_know_who_they_are_for_leader_election(self, rendering: Rendering) -> None:
        """POD_NAME and POD_NAMESPACE come from the downward API: the election's identity and the Lease's
        namespace."""
        (container,) = rendering.pod_spec["containers"]
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
        assert (env["POD_NAME"], env["POD_NAMESPACE"]) == ("metadata.name", "metadata.namespace")

    def test_bound_to_the_deployments_service_account(self, rendering: Rendering) -> None:
        """The ClusterRoleBinding grants that role to the ServiceAccount the Pods run as, and no one else."""
        binding = rendering.named("ClusterRoleBinding", WEBHOOK_ROLE)
        account = rendering.one("ServiceAccount")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": WEBHOOK_ROLE,
        }
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"],
            }
        ]
        assert rendering.pod_spec["serviceAccountName"] == account["metadata"]["name"]
        # ... and `gpupool serve` knows itself by that account, as kube-apiserver names it in userInfo.
        env = {e["name"]: env_value(rendering, e) for e in rendering.container["env"]}
        username = f"system:serviceaccount:{env[NAMESPACE_ENV]}:{serve_options(rendering).service_account}"
        assert username == f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
