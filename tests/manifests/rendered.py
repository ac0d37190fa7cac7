"""What an admin installs, rendered: manifests/ (kustomize) through manifests/render.py, as objects, and
the questions the tests of tests/manifests/ ask of them (the image: tests/test_image.py).

The manifests are rendered for real with `kubectl kustomize` (through render.py, as `make manifests`
does), validated against the Kubernetes OpenAPI schemas, and their webhook filter (matchConditions)
is evaluated with a real CEL implementation. The Deployment's settings go through `gpupool serve`'s
own parser, so the manifests cannot drift from the server.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.commands.cli import build_parser
from webhook.commands.serve import resolve_options
from webhook.serving.server import ServeOptions

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
RENDER = MANIFESTS / "render.py"
INSTALL_GUIDE = REPO / "docs" / "install.md"  # the install steps the tests hold to the manifests
KUBECTL = shutil.which("kubectl")
NAMESPACE = "gpupool-system"
SERVICE = "gpupool-webhook"
WEBHOOK_ROLE = "gpupool-webhook"  # the ClusterRole of gpupool's own ServiceAccount
VIEW_ROLE = "gpupool-view"  # the ClusterRole aggregated to `view`: anyone may read the GPUPools
TLS_SECRET = "gpupool-webhook-tls"
# For the property test of the webhook's matchConditions: GPU resources, and names that only look like one.
RESOURCE_NAMES = (
    *("nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "amd.com/gpu", "huawei.com/Ascend910", "huawei.com/Ascend310P"),
    *("nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb.shared", "huawei.com/Ascend910-4c"),
    *("cpu", "memory", "nvidia.com/gpux", "nvidia.com/mig", "example.com/gpu", "amd.com/gpu-x", "nvidia.com/gpu.x"),
)
ENV_NAMES = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "nvidia_visible_devices", "PATH")
# Schemas to validate against. 1.30 is the first release where webhook matchConditions are GA (its
# schema drops "This is a beta feature ... feature gate"); 1.28 is the oldest release that has them
# on by default (beta). Older API servers drop the field, which would send every Pod to gpupool.
SCHEMA_VERSIONS = ("1.28", "1.30")
# "+locked": only kube-apiserver is heard (render.py --client-ca and --control-plane-cidr).
# "+single-node": components/single-node, for test clusters with one node (render.py --single-node).
RENDERINGS = (
    "base",
    "self-signed",
    "self-signed+ignore",
    "cert-manager",
    "cert-manager+locked",
    "cert-manager+single-node",
)
DEPLOYABLE = ("self-signed", "self-signed+ignore", "cert-manager", "cert-manager+locked", "cert-manager+single-node")
# As given to render.py, and as the NetworkPolicy must hold them (a bare address is a /32).
CONTROL_PLANE = {"10.0.0.10": "10.0.0.10/32", "192.0.2.0/28": "192.0.2.0/28", "fd00::5": "fd00::5/128"}
COMPONENT = "app.kubernetes.io/component"
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}


Obj = dict[str, Any]


# --- rendering -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendering:
    """The objects of one rendered overlay, with lookups by kind."""

    name: str
    objects: tuple[Obj, ...]

    def all(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> Obj:
        found = self.all(kind)
        assert len(found) == 1, f"{self.name}: expected one {kind}, found {len(found)}"
        return found[0]

    def named(self, kind: str, name: str) -> Obj:
        """The one object of a kind with that name (a kind may have several: two ClusterRoles)."""
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name}, found {len(found)}"
        return found[0]

    @property
    def webhook(self) -> Obj:
        config = self.one("MutatingWebhookConfiguration")
        assert len(config["webhooks"]) == 1
        webhook: Obj = config["webhooks"][0]
        return webhook

    @property
    def pod_spec(self) -> Obj:
        spec: Obj = self.one("Deployment")["spec"]["template"]["spec"]
        return spec

    @property
    def container(self) -> Obj:
        containers = self.pod_spec["containers"]
        assert len(containers) == 1
        container: Obj = containers[0]
        return container


def granted(role: Obj) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every permission a ClusterRole's rules grant; a rule limited to
    some names grants `resource/name` for each (`configmaps/gpupool-queue`)."""
    out = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}  # no nonResourceURLs
        resources = [f"{r}/{n}" for r in rule["resources"] for n in rule.get("resourceNames", [])] or rule["resources"]
        out |= {(g, r, v) for g in rule["apiGroups"] for r in resources for v in rule["verbs"]}
    return out


def parse_objects(text: str, name: str) -> Rendering:
    return Rendering(name, tuple(d for d in yaml.safe_load_all(text) if d))


def run_render(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RENDER), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def make_dry_run(target: str, *assignments: str) -> str:
    """The commands `make TARGET [VAR=value ...]` would run, as make prints them (-n: nothing is run)."""
    done = subprocess.run(
        ["make", "-n", "-s", target, *assignments], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.replace("\\\n", " ")


def kustomize(directory: Path) -> str:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def env_value(r: Rendering, entry: Obj) -> str:
    """An env entry's value as the kubelet sets it: `value`, or the downward API's Pod name, namespace or
    service account."""
    if "value" in entry:
        return str(entry["value"])
    path = entry["valueFrom"]["fieldRef"]["fieldPath"]
    deployment = r.one("Deployment")["metadata"]
    fields = {"metadata.namespace": deployment["namespace"], "metadata.name": f"{deployment['name']}-5d8f7c9b4-x2kqp"}
    fields["spec.serviceAccountName"] = r.pod_spec["serviceAccountName"]
    return fields[path]


def serve_options(r: Rendering) -> ServeOptions:
    """The options `gpupool serve` resolves from the Deployment's args and environment."""
    container = r.container
    env = {e["name"]: env_value(r, e) for e in container.get("env", [])}
    args = build_parser(["serve"]).parse_args(["serve", *container.get("args", [])])
    return resolve_options(args, env)


def mount_of(r: Rendering, volume: str) -> str:
    (path,) = [m["mountPath"] for m in r.container["volumeMounts"] if m["name"] == volume]
    return str(path)


def volume_named(r: Rendering, name: str) -> Obj:
    (volume,) = [v for v in r.pod_spec["volumes"] if v["name"] == name]
    return dict(volume)


def container_port(r: Rendering, name: str) -> int:
    (port,) = [p["containerPort"] for p in r.container["ports"] if p["name"] == name]
    return int(port)


def network_policy_sources(r: Rendering) -> dict[int, list[str] | None]:
    """For each port the NetworkPolicy opens: who may reach it (CIDRs, and `ns:<name>` for namespaces
    selected by name), or None for every source."""
    sources: dict[int, list[str] | None] = {}
    for rule in r.one("NetworkPolicy")["spec"]["ingress"]:
        peers = rule.get("from")
        for port in rule["ports"]:
            assert port["port"] not in sources, f"port {port['port']} in two rules"
            sources[port["port"]] = None if peers is None else sorted(peer_names(p) for p in peers)
    return sources


def peer_names(peer: Obj) -> str:
    if "ipBlock" in peer:
        return str(peer["ipBlock"]["cidr"])
    (expr,) = peer["namespaceSelector"]["matchExpressions"]
    assert (expr["key"], expr["operator"], set(peer)) == ("kubernetes.io/metadata.name", "In", {"namespaceSelector"})
    return " ".join(f"ns:{name}" for name in expr["values"])


def admitted(r: Rendering, port: int, *, namespace: str | None = None, ip: str = "10.244.1.7") -> bool:
    """Whether the NetworkPolicy lets a connection to the webhook Pods' `port` in: from a Pod of
    `namespace` with address `ip`, or (namespace None) from an address outside the cluster's Pods."""
    for rule in r.one("NetworkPolicy")["spec"]["ingress"]:
        if port not in [p["port"] for p in rule["ports"]]:
            continue
        peers = rule.get("from")
        if peers is None:
            return True
        for peer in peers:
            if "ipBlock" in peer and ipaddress.ip_address(ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"]):
                return True
            by_name = {"kubernetes.io/metadata.name": namespace or ""}
            if namespace is not None and "namespaceSelector" in peer and selects(peer["namespaceSelector"], by_name):
                return True
    return False


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) applied to `labels`."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True
