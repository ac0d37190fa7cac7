"""The Deployment and the objects around it (Service, NetworkPolicy, PodDisruptionBudget): settings that
`gpupool serve` itself resolves, who may reach each port, replicas that never share a node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.manifests.rendered import (
    CONTROL_PLANE,
    KUBECTL,
    NAMESPACE,
    TLS_SECRET,
    Obj,
    Rendering,
    admitted,
    container_port,
    make_dry_run,
    mount_of,
    network_policy_sources,
    parse_objects,
    run_render,
    selects,
    serve_options,
    volume_named,
)
from webhook.commands.serve import DOWNWARD_ENV, NAMESPACE_ENV, SERVE_ENV, check_client_ca
from webhook.domain.quantity import parse_bytes

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)


# --- the Deployment and the objects around it ----------------------------------------------------


class TestDeployment:
    def test_every_setting_is_a_serve_option(self, rendering: Rendering) -> None:
        """The Deployment passes only variables `gpupool serve` knows, and serve accepts their values."""
        container = rendering.container
        assert "command" not in container  # the image's entrypoint: gpupool serve
        names = [e["name"] for e in container["env"]]
        assert set(names) <= {*SERVE_ENV, *DOWNWARD_ENV}, set(names) - set(SERVE_ENV) - set(DOWNWARD_ENV)
        # Only who gpupool is comes from the downward API, so it cannot drift from the install.
        from_api = {e["name"]: e["valueFrom"] for e in container["env"] if "valueFrom" in e}
        assert from_api == {
            **{name: {"fieldRef": {"fieldPath": path}} for name, path in DOWNWARD_ENV.items()},
            "GPUPOOL_SERVICE_ACCOUNT": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}},
        }
        assert NAMESPACE_ENV in DOWNWARD_ENV
        options = serve_options(rendering)
        assert options.inventory is None  # the live cluster, through the ServiceAccount

    def test_ports_line_up(self, rendering: Rendering) -> None:
        """Server ports = container ports = Service targets = probe port = NetworkPolicy's open ports."""
        options = serve_options(rendering)
        assert container_port(rendering, "https") == options.port
        assert container_port(rendering, "health") == options.health_port
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert rendering.container[probe]["httpGet"]["port"] == "health"
        targets = {p["name"]: p["targetPort"] for p in rendering.one("Service")["spec"]["ports"]}
        assert targets == {"https": "https", "metrics": "health"}
        assert set(network_policy_sources(rendering)) == {options.port, options.health_port}
        assert options.host in {"0.0.0.0", "::"}

    def test_network_policy_admits_the_control_plane_to_the_webhook_port(self, rendering: Rendering) -> None:
        """The webhook port is open to every source unless --control-plane-cidr ranges are given; then
        only to those."""
        options = serve_options(rendering)
        expected = sorted(CONTROL_PLANE.values()) if rendering.name.endswith("+locked") else None
        assert network_policy_sources(rendering)[options.port] == expected
        assert admitted(rendering, options.port, namespace="team-a") is (expected is None)
        assert admitted(rendering, options.port, ip="10.0.0.10") is True

    def test_the_health_and_metrics_port_admits_the_monitoring_namespace_only(self, rendering: Rendering) -> None:
        """/metrics names quotas, usage and denials per namespace: port 8080 admits Pods of the
        `monitoring` namespace (by name, a label only the API server sets) and nobody else; the kubelet's
        probes come from the Pod's own node, which NetworkPolicy implementations always admit."""
        options = serve_options(rendering)
        assert network_policy_sources(rendering)[options.health_port] == ["ns:monitoring"]
        assert admitted(rendering, options.health_port, namespace="monitoring")
        for tenant in ("team-a", "default", "kube-system"):
            assert not admitted(rendering, options.health_port, namespace=tenant), tenant
        assert not admitted(rendering, options.health_port, ip="203.0.113.9")

    def test_who_reaches_the_health_port_is_set_at_install_time(self, tmp_path: Path) -> None:
        """render.py --metrics-namespace (make manifests METRICS_NAMESPACES=...) replaces the monitoring
        namespace; --health-cidr (HEALTH_CIDRS=...) adds address ranges, for a CNI that polices probes."""
        out = tmp_path / "out.yaml"
        args = [
            "--metrics-namespace",
            "prometheus",
            "--metrics-namespace",
            "gmp-system",
            "--health-cidr",
            "10.0.0.0/16",
        ]
        done = run_render("--overlay", "cert-manager", *args, "--control-plane-cidr", "10.9.0.1", "--out", out)
        assert done.returncode == 0, done.stderr
        r = parse_objects(out.read_text(), "health")
        assert network_policy_sources(r) == {
            8443: ["10.9.0.1/32"],
            8080: ["10.0.0.0/16", "ns:prometheus ns:gmp-system"],
        }
        assert admitted(r, 8080, namespace="gmp-system") and admitted(r, 8080, ip="10.0.3.4")
        assert not admitted(r, 8080, namespace="monitoring")
        (render,) = [
            line
            for line in make_dry_run("manifests", "METRICS_NAMESPACES=a b", "HEALTH_CIDRS=10.1.0.0/16").splitlines()
            if "render.py" in line
        ]
        assert "--metrics-namespace a --metrics-namespace b --health-cidr 10.1.0.0/16" in render

    def test_client_certificates_are_required_exactly_when_a_client_ca_is_given(
        self, rendering: Rendering, client_ca: Path, tmp_path: Path
    ) -> None:
        """With --client-ca, GPUPOOL_CLIENT_CA is ca.crt of a mounted ConfigMap that holds that very file
        and passes serve's own start-up check; without it, no client certificate is asked for."""
        options = serve_options(rendering)
        if not rendering.name.endswith("+locked"):
            assert options.client_ca is None
            assert "client-ca" not in {v["name"] for v in rendering.pod_spec["volumes"]}
            return
        assert options.client_ca == f"{mount_of(rendering, 'client-ca')}/ca.crt"
        source = volume_named(rendering, "client-ca")["configMap"]
        assert source["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
        (config_map,) = [c for c in rendering.all("ConfigMap") if c["metadata"]["name"] == source["name"]]
        assert config_map["data"]["ca.crt"] == client_ca.read_text()
        mounted = tmp_path / "ca.crt"
        mounted.write_text(config_map["data"]["ca.crt"])
        check_client_ca(str(mounted))

    def test_probes(self, rendering: Rendering) -> None:
        """Readiness asks /readyz (inventory synced), liveness and startup ask /healthz."""
        container = rendering.container
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"

    def test_certificates_come_from_the_tls_secret(self, rendering: Rendering) -> None:
        """--cert and --key are tls.crt and tls.key of the Secret gpupool-webhook-tls, mounted read-only."""
        options = serve_options(rendering)
        tls = mount_of(rendering, "tls")
        assert tls == "/etc/gpupool/tls"
        assert (options.cert, options.key) == (f"{tls}/tls.crt", f"{tls}/tls.key")
        assert volume_named(rendering, "tls")["secret"]["secretName"] == TLS_SECRET

    def test_hardened(self, rendering: Rendering) -> None:
        """Non-root numeric user, read-only root, no privilege escalation, no capabilities, seccomp."""
        pod_security = rendering.pod_spec["securityContext"]
        container_security = rendering.container["securityContext"]
        assert pod_security["runAsNonRoot"] is True
        assert isinstance(pod_security["runAsUser"], int)
        assert pod_security["runAsUser"] > 0
        assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container_security["readOnlyRootFilesystem"] is True
        assert container_security["allowPrivilegeEscalation"] is False
        assert container_security["capabilities"] == {"drop": ["ALL"]}
        assert all(m.get("readOnly") for m in rendering.container["volumeMounts"] if m["name"] != "tmp")
        assert "emptyDir" in volume_named(rendering, "tmp")
        assert mount_of(rendering, "tmp") == "/tmp"
        assert rendering.pod_spec["priorityClassName"] == "system-cluster-critical"
        assert rendering.pod_spec["enableServiceLinks"] is False

    def test_namespace_enforces_restricted_pod_security(self, rendering: Rendering) -> None:
        """The namespace enforces the restricted Pod Security Standard that the Pods meet."""
        labels = rendering.one("Namespace")["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert rendering.one("Namespace")["metadata"]["name"] == NAMESPACE

    def test_highly_available(self, rendering: Rendering) -> None:
        """Two replicas, rollouts never go below them, a drain leaves one running."""
        deployment = rendering.one("Deployment")
        assert deployment["spec"]["replicas"] >= 2
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert rendering.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1

    def test_the_server_knows_how_many_replicas_admit(self, rendering: Rendering) -> None:
        """GPUPOOL_REPLICAS is the Deployment's own replica count, so the policy's warnings about what
        `placement: now` cannot keep exact count the processes that really admit."""
        options = serve_options(rendering)
        assert options.replicas == rendering.one("Deployment")["spec"]["replicas"]

    @pytest.mark.parametrize("nodes", [2, 3, 50])
    def test_two_replicas_never_share_a_node(self, rendering: Rendering, nodes: int) -> None:
        """On a cluster of several nodes, kube-scheduler's topology-spread filter never lets the second
        replica onto the first one's node, so one node failing cannot take both (under failurePolicy Fail
        that would block every GPU Pod); only components/single-node relaxes it. The spread counts one
        rollout's Pods only (pod-template-hash), so a rollout's surge Pod is not held up by old ones."""
        names = [f"node-{i}" for i in range(nodes)]
        constraints = rendering.pod_spec["topologySpreadConstraints"]
        first = spread_filter(constraints, names, placed=[])[0]
        second = spread_filter(constraints, names, placed=[first])
        if rendering.name.endswith("+single-node"):
            assert first in second
        else:
            assert second == [n for n in names if n != first]
        (hostname,) = [c for c in constraints if c["topologyKey"] == "kubernetes.io/hostname"]
        assert "pod-template-hash" in hostname["matchLabelKeys"]

    def test_on_a_single_node_the_second_replica_waits_unless_the_component_says_otherwise(
        self, rendering: Rendering
    ) -> None:
        """With one node, the base keeps the second replica Pending (minDomains 2) rather than next to the
        first; components/single-node (render.py --single-node) lets both run there, for test clusters."""
        constraints = rendering.pod_spec["topologySpreadConstraints"]
        expected = ["only"] if rendering.name.endswith("+single-node") else []
        assert spread_filter(constraints, ["only"], placed=["only"]) == expected

    def test_selectors_pick_the_webhook_pods(self, rendering: Rendering) -> None:
        """Service, PodDisruptionBudget, NetworkPolicy and spread constraints select the Deployment's Pods."""
        deployment = rendering.one("Deployment")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(deployment["spec"]["selector"], labels)
        assert selects({"matchLabels": rendering.one("Service")["spec"]["selector"]}, labels)
        assert selects(rendering.one("PodDisruptionBudget")["spec"]["selector"], labels)
        assert selects(rendering.one("NetworkPolicy")["spec"]["podSelector"], labels)
        for constraint in rendering.pod_spec["topologySpreadConstraints"]:
            assert selects(constraint["labelSelector"], labels)

    def test_resources_fit_a_full_size_cluster(self, rendering: Rendering) -> None:
        """Memory for the cache of 150,000 Pods (about 300 MB) is requested, with a higher limit."""
        resources = rendering.container["resources"]
        request = parse_bytes(resources["requests"]["memory"])
        assert request >= 300 * 2**20
        assert parse_bytes(resources["limits"]["memory"]) > request
        assert "cpu" in resources["requests"]


def spread_filter(constraints: list[Obj], nodes: list[str], placed: list[str]) -> list[str]:
    """The nodes kube-scheduler's PodTopologySpread filter lets the next replica onto, when the replicas
    of its rollout are on `placed`: for each DoNotSchedule constraint on the hostname (the zone one only
    scores), the node's count plus one, minus the least count over the nodes (0 when there are fewer than
    minDomains nodes), must not exceed maxSkew. Nodes carry no taints here, so nodeTaintsPolicy is moot."""
    allowed = []
    for node in nodes:
        fits = True
        for c in constraints:
            if c["topologyKey"] != "kubernetes.io/hostname" or c["whenUnsatisfiable"] != "DoNotSchedule":
                continue
            counts = {n: placed.count(n) for n in nodes}
            least = 0 if len(nodes) < c.get("minDomains", 1) else min(counts.values())
            fits = fits and counts[node] + 1 - least <= c["maxSkew"]
        if fits:
            allowed.append(node)
    return allowed
