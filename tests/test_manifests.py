"""Tests for what an admin installs: manifests/ (kustomize) and manifests/render.py (the image: tests/test_image.py).

The manifests are rendered for real with `kubectl kustomize` (through render.py, as `make manifests`
does), validated against the Kubernetes OpenAPI schemas, and their webhook filter (matchConditions)
is evaluated with a real CEL implementation. The Deployment's settings go through `gpupool serve`'s
own parser, so the manifests cannot drift from the server.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import ipaddress
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

import webhook
from webhook.admission.pod import read_pod
from webhook.admission.request import wants_gpus
from webhook.commands.cli import build_parser
from webhook.commands.serve import DOWNWARD_ENV, NAMESPACE_ENV, SERVE_ENV, check_client_ca, resolve_options
from webhook.domain.policy import Policy, default_policy_text, load_policy_text
from webhook.domain.quantity import parse_bytes
from webhook.serving.certs import dns_names, ensure_certificates
from webhook.serving.server import ServeOptions

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
RENDER = MANIFESTS / "render.py"
INSTALL_GUIDE = REPO / "docs" / "install.md"  # the install steps the tests hold to the manifests
KUBECTL = shutil.which("kubectl")
NAMESPACE = "gpupool-system"
SERVICE = "gpupool-webhook"
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
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)

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


@pytest.fixture(scope="module")
def certs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Certificates made for these tests by render.py (through `gpupool certs`), not the repo's certs/."""
    return tmp_path_factory.mktemp("certs")


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("build")


@pytest.fixture(scope="module")
def client_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA certificate of kube-apiserver's client certificate (a CA of its own, made by gpupool certs)."""
    directory = tmp_path_factory.mktemp("client-ca")
    ensure_certificates(directory, SERVICE, NAMESPACE)
    return directory / "ca.crt"


@pytest.fixture(scope="module")
def rendered(certs_dir: Path, out_dir: Path, client_ca: Path) -> dict[str, Rendering]:
    """Every rendering, once: the base with plain `kubectl kustomize`, the overlays through render.py."""
    result = {"base": parse_objects(kustomize(MANIFESTS / "base"), "base")}
    locked = ["--client-ca", str(client_ca)]
    for cidr in CONTROL_PLANE:
        locked += ["--control-plane-cidr", cidr]
    options = {
        "self-signed": ["--overlay", "self-signed"],
        "self-signed+ignore": ["--overlay", "self-signed", "--failure-policy", "Ignore"],
        "cert-manager": ["--overlay", "cert-manager"],
        "cert-manager+locked": ["--overlay", "cert-manager", *locked],
        "cert-manager+single-node": ["--overlay", "cert-manager", "--single-node"],
    }
    for name, args in options.items():
        out = out_dir / f"{name}.yaml"
        done = run_render(*args, "--certs-dir", certs_dir, "--out", out)
        assert done.returncode == 0, done.stderr
        result[name] = parse_objects(out.read_text(), name)
    return result


@pytest.fixture(params=RENDERINGS)
def rendering(request: pytest.FixtureRequest, rendered: dict[str, Rendering]) -> Rendering:
    return rendered[request.param]


@pytest.fixture(params=DEPLOYABLE)
def deployable(request: pytest.FixtureRequest, rendered: dict[str, Rendering]) -> Rendering:
    return rendered[request.param]


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


# --- render.py -----------------------------------------------------------------------------------


class TestRender:
    def test_each_overlay_renders_a_complete_install(self, deployable: Rendering) -> None:
        """Every deployable rendering holds everything the install needs, in one file."""
        kinds = {o["kind"] for o in deployable.objects}
        assert kinds >= {
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        }
        namespaced = [o for o in deployable.objects if o["kind"] not in CLUSTER_SCOPED]
        assert {o["metadata"].get("namespace") for o in namespaced} == {NAMESPACE}

    def test_self_signed_brings_its_secret_and_cert_manager_its_certificate(
        self, rendered: dict[str, Rendering]
    ) -> None:
        """self-signed ships the TLS Secret; with cert-manager the Secret comes from a Certificate."""
        secrets = [s["metadata"]["name"] for s in rendered["self-signed"].all("Secret")]
        assert secrets == [TLS_SECRET]
        assert rendered["cert-manager"].all("Secret") == []
        certificates = rendered["cert-manager"].all("Certificate")
        assert TLS_SECRET in {c["spec"]["secretName"] for c in certificates}

    def test_deploy_applies_the_webhook_configuration_last(self, deployable: Rendering) -> None:
        """`make deploy` first applies what `-l app.kubernetes.io/component!=webhook-configuration`
        selects: everything except the webhook configurations, which it applies once the Pods are ready,
        the mutating one first (kubectl applies a file in order): a Pod validated before gpupool could
        place it would be refused as unplaced. `make undeploy` deletes them the other way round."""
        first = {"matchExpressions": [{"key": COMPONENT, "operator": "NotIn", "values": ["webhook-configuration"]}]}
        held_back = [o["kind"] for o in deployable.objects if not selects(first, o["metadata"].get("labels", {}))]
        assert held_back == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
        kinds = [o["kind"] for o in deployable.objects]
        assert kinds[-2:] == held_back
        deleted = re.findall(r"delete (\w+webhookconfiguration)", make_dry_run("undeploy"))
        assert deleted == ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"]

    def test_every_object_is_labelled_part_of_gpupool(self, deployable: Rendering) -> None:
        """`kubectl get -l app.kubernetes.io/part-of=gpupool` finds every object of the install."""
        for obj in deployable.objects:
            assert obj["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "gpupool", obj["kind"]

    def test_output_with_a_private_key_is_private(self, out_dir: Path) -> None:
        """The rendered self-signed file holds the TLS key, so only its owner may read it."""
        mode = stat.S_IMODE((out_dir / "self-signed.yaml").stat().st_mode)
        assert mode == 0o600

    def test_rendering_leaves_the_source_tree_untouched(self, certs_dir: Path, tmp_path: Path) -> None:
        """render.py works on a scratch copy: no certificate or key is written under manifests/."""

        def tree() -> dict[str, bytes]:
            return {
                str(p): p.read_bytes() for p in MANIFESTS.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            }

        before = tree()
        done = run_render("--certs-dir", certs_dir, "--out", tmp_path / "out.yaml")
        assert done.returncode == 0, done.stderr
        assert tree() == before

    def test_the_cluster_certificate_names_the_service_only(self, rendered: dict[str, Rendering]) -> None:
        """The serving certificate installed in the cluster names the Service's four in-cluster names and
        nothing else: no localhost, no 127.0.0.1 (those are `make run`'s, in a certificate of its own)."""
        for name in ("self-signed", "self-signed+ignore"):
            serving = x509.load_pem_x509_certificate(base64.b64decode(rendered[name].one("Secret")["data"]["tls.crt"]))
            names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert names.get_values_for_type(x509.DNSName) == dns_names(SERVICE, NAMESPACE)
            assert names.get_values_for_type(x509.IPAddress) == []

    def test_make_run_and_make_deploy_never_share_a_certificate(self) -> None:
        """`make run` serves its own certificate from certs/dev/ (made by `make certs` for localhost), and
        `make manifests` (so `make deploy`) renders certs/ with no extra host: neither run re-issues the
        other's certificate, and the cluster's never names localhost."""
        run = make_dry_run("run")
        (dev_certs,) = re.findall(r"gpupool certs --out (\S+)", run)
        assert re.search(
            rf"gpupool serve --cert {re.escape(dev_certs)}/tls\.crt --key {re.escape(dev_certs)}/tls\.key", run
        )
        assert "--host localhost" in run
        (render,) = [line for line in make_dry_run("manifests").splitlines() if "render.py" in line]
        assert "--host" not in render
        assert "--certs-dir" not in render  # render.py's default, REPO/certs
        assert (REPO / dev_certs).resolve() != (REPO / "certs").resolve()

    def test_make_deploy_renews_a_serving_certificate_that_is_due(self, tmp_path: Path) -> None:
        """Re-running `make deploy` (render.py) is how the self-signed certificate is renewed: with 30 days
        or fewer left, the rendered Secret carries a new certificate for a year, signed by the same CA (the
        caBundle does not change), and render.py says it renewed it."""
        certs = tmp_path / "certs"
        ensure_certificates(certs, SERVICE, NAMESPACE, days=40, now=datetime.now(UTC) - timedelta(days=15))
        ca_before = (certs / "ca.crt").read_bytes()
        out = tmp_path / "out.yaml"
        done = run_render("--overlay", "self-signed", "--certs-dir", certs, "--out", out)
        assert done.returncode == 0, done.stderr
        assert re.search(r"^renewed .*tls\.crt: expires on \S+, within 30 days; valid until ", done.stdout, re.M)
        r = parse_objects(out.read_text(), "renewed")
        serving = x509.load_pem_x509_certificate(base64.b64decode(r.one("Secret")["data"]["tls.crt"]))
        assert serving.not_valid_after_utc - datetime.now(UTC) > timedelta(days=360)
        assert (certs / "ca.crt").read_bytes() == ca_before
        assert base64.b64decode(re.sub(r"\s", "", r.webhook["clientConfig"]["caBundle"])) == ca_before
        again = run_render("--overlay", "self-signed", "--certs-dir", certs, "--out", out)
        assert again.stdout.splitlines() == [f"wrote {out} (self-signed, failurePolicy Fail)"]  # nothing due

    @pytest.mark.parametrize(
        ("ref", "image"),
        [
            ("registry.example.com:5000/team/gpupool:dev", "registry.example.com:5000/team/gpupool:dev"),
            ("registry.example.com/gpupool@sha256:" + "a" * 64, "registry.example.com/gpupool@sha256:" + "a" * 64),
            ("registry.example.com:5000/gpupool", "registry.example.com:5000/gpupool:0.1.0"),
        ],
        ids=["tag", "digest", "name-keeps-release-tag"],
    )
    def test_image_override(self, tmp_path: Path, ref: str, image: str) -> None:
        """--image (make manifests IMAGE=...) sets the Deployment's image, a registry port is no tag."""
        out = tmp_path / "out.yaml"
        done = run_render("--overlay", "cert-manager", "--image", ref, "--out", out)
        assert done.returncode == 0, done.stderr
        assert parse_objects(out.read_text(), "image").container["image"] == image

    def test_release_image(self, deployable: Rendering) -> None:
        """Without an override the Deployment runs the release image."""
        assert deployable.container["image"] == "ghcr.io/gpupool/gpupool-webhook:0.1.0"

    @pytest.mark.parametrize(
        ("args", "code", "words"),
        [
            (["--control-plane-cidr", "10.0.0.1/24"], 2, "'10.0.0.1/24' is not an IP address or CIDR"),
            (["--control-plane-cidr", "apiserver.example"], 2, "e.g. 10.0.0.10 or 10.0.0.0/28"),
            (["--client-ca", "{ca_dir}/ca.key"], 1, "holds a private key; give the CA certificate (ca.crt) alone"),
            (["--client-ca", "{policy}"], 1, "no PEM certificate in it"),
            (["--client-ca", "{ca_dir}/none.crt"], 1, "cannot read: No such file"),
            (["--exclude-namespace", "Team_A"], 2, "'Team_A' is not a namespace name"),
        ],
        ids=["host-bits", "not-an-address", "ca-key", "not-pem", "missing", "bad-namespace"],
    )
    def test_bad_lock_down_options_are_one_line_errors(
        self, client_ca: Path, tmp_path: Path, args: list[str], code: int, words: str
    ) -> None:
        """A bad --control-plane-cidr or --client-ca is refused with one line naming it, and nothing is
        written: above all, a CA key never goes into a ConfigMap."""
        out = tmp_path / "out.yaml"
        given = [a.format(ca_dir=client_ca.parent, policy=MANIFESTS / "base" / "policy.yaml") for a in args]
        done = run_render("--overlay", "cert-manager", *given, "--out", out)
        assert done.returncode == code
        assert words in done.stderr and done.stderr.strip().splitlines()[-1].startswith("render.py: error: ")
        assert not out.exists()

    def test_missing_kubectl_is_a_one_line_error(self, tmp_path: Path) -> None:
        """Without kubectl, render.py says so in one line and exits 1, leaving no output file."""
        out = tmp_path / "out.yaml"
        done = run_render("--overlay", "cert-manager", "--kubectl", str(tmp_path / "no-kubectl"), "--out", out)
        assert done.returncode == 1
        assert "not found on PATH" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert not out.exists()


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


# --- the webhook configuration -------------------------------------------------------------------


class TestWebhookConfiguration:
    def test_only_pod_create_and_ephemeral_containers_are_sent(self, rendering: Rendering) -> None:
        """Only CREATE of core/v1 Pods and UPDATE of pods/ephemeralcontainers (`kubectl debug`): no other
        UPDATE, no DELETE, no other subresource such as pods/binding."""
        assert rendering.webhook["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            },
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["pods/ephemeralcontainers"],
                "scope": "Namespaced",
            },
        ]

    def test_call_settings(self, rendering: Rendering) -> None:
        """v1 reviews, no side effects (dry-run works), ≤ 5 s, reinvoked if needed, Fail unless asked."""
        webhook = rendering.webhook
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["sideEffects"] == "None"
        assert 1 <= webhook["timeoutSeconds"] <= 5
        assert webhook["reinvocationPolicy"] == "IfNeeded"
        assert webhook["matchPolicy"] == "Equivalent"
        expected = "Ignore" if rendering.name.endswith("+ignore") else "Fail"
        assert webhook["failurePolicy"] == expected
        assert "objectSelector" not in webhook  # users control labels; opting in is by annotation

    @pytest.mark.parametrize(
        ("labels", "sent"),
        [
            ({"kubernetes.io/metadata.name": "kube-system"}, False),
            ({"kubernetes.io/metadata.name": NAMESPACE}, False),
            ({"kubernetes.io/metadata.name": "gpu-operator"}, False),
            ({"kubernetes.io/metadata.name": "team-a", "gpupool.io/ignore": "true"}, False),
            ({"kubernetes.io/metadata.name": "team-a", "gpupool.io/ignore": "false"}, True),
            ({"kubernetes.io/metadata.name": "team-a", "gpupool.io/ignore": ""}, True),
            ({"kubernetes.io/metadata.name": "team-a", "gpupool.io/ignore": "True"}, True),
            ({"kubernetes.io/metadata.name": "team-a"}, True),
            ({"kubernetes.io/metadata.name": "default", "team": "ml"}, True),
        ],
        ids=[
            "kube-system",
            "own-namespace",
            "gpu-operator",
            "ignore-true",
            "ignore-false",
            "ignore-empty",
            "ignore-capitalised",
            "team-a",
            "default",
        ],
    )
    def test_namespace_selector(self, rendering: Rendering, labels: dict[str, str], sent: bool) -> None:
        """kube-system, gpupool's own namespace and the GPU Operator's are left out by name (a label only
        the API server sets); a namespace labelled gpupool.io/ignore is left out only for the value
        `true`: `false`, an empty value or `True` opt nothing out."""
        assert selects(rendering.webhook["namespaceSelector"], labels) is sent

    def test_namespaces_excluded_at_install_time_and_the_label_dropped(self, tmp_path: Path) -> None:
        """render.py --exclude-namespace (make manifests EXCLUDE_NAMESPACES=...) adds names to the ones
        always left out; --no-ignore-label (IGNORE_LABEL=false) makes names the only way out, for clusters
        where tenants may label their own namespaces."""
        out = tmp_path / "out.yaml"
        args = ["--exclude-namespace", "nvidia-gpu-operator", "--exclude-namespace", "kube-system"]
        done = run_render("--overlay", "cert-manager", *args, "--no-ignore-label", "--out", out)
        assert done.returncode == 0, done.stderr
        selector = parse_objects(out.read_text(), "excluded").webhook["namespaceSelector"]
        assert selector == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", NAMESPACE, "gpu-operator", "nvidia-gpu-operator"],
                }
            ]
        }
        assert not selects(selector, {"kubernetes.io/metadata.name": "nvidia-gpu-operator"})
        assert selects(selector, {"kubernetes.io/metadata.name": "team-a", "gpupool.io/ignore": "true"})
        (render,) = [
            line
            for line in make_dry_run("manifests", "EXCLUDE_NAMESPACES=a b", "IGNORE_LABEL=false").splitlines()
            if "render.py" in line
        ]
        assert "--exclude-namespace a --exclude-namespace b" in render
        assert "--no-ignore-label" in render

    def test_calls_the_rendered_service(self, rendering: Rendering) -> None:
        """The webhook calls /mutate on the rendered Service, whose port leads to the server's TLS port."""
        ref = rendering.webhook["clientConfig"]["service"]
        service = rendering.one("Service")
        assert (ref["name"], ref["namespace"], ref["path"]) == (
            service["metadata"]["name"],
            service["metadata"]["namespace"],
            "/mutate",
        )
        (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]]
        assert ref["port"] == 443
        assert container_port(rendering, port["targetPort"]) == serve_options(rendering).port

    def test_names_are_valid(self, rendering: Rendering) -> None:
        """kube-apiserver's rules: a fully qualified webhook name, unique qualified condition names."""
        assert re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+){2,}", rendering.webhook["name"])
        names = [c["name"] for c in rendering.webhook["matchConditions"]]
        assert 1 <= len(names) <= 64
        assert len(set(names)) == len(names)
        assert all(re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", n) for n in names)

    def test_the_install_guide_shows_the_condition_names_kubectl_prints(self, rendered: dict[str, Rendering]) -> None:
        """Step 4 of the install checks the API server kept the matchConditions by their names: the ones
        docs/install.md prints are the rendered ones, in order."""
        names = " ".join(c["name"] for c in rendered["base"].webhook["matchConditions"])
        guide = INSTALL_GUIDE.read_text(encoding="utf-8")
        assert f'.matchConditions[*].name}}{{"\\n"}}\'\n# {names}\n' in guide

    def test_self_signed_ca_bundle_is_certs_ca(self, rendered: dict[str, Rendering], certs_dir: Path) -> None:
        """caBundle is certs/ca.crt, and the mounted certificate is issued by it for the Service name."""
        ca_pem = (certs_dir / "ca.crt").read_bytes()
        for name in ("self-signed", "self-signed+ignore"):
            r = rendered[name]
            # kustomize wraps long base64 lines; kube-apiserver's base64 decoder ignores newlines.
            bundle = re.sub(r"\s", "", r.webhook["clientConfig"]["caBundle"])
            assert base64.b64decode(bundle, validate=True) == ca_pem
            secret = r.one("Secret")
            assert secret["metadata"]["name"] == volume_named(r, "tls")["secret"]["secretName"]
            assert secret["type"] == "kubernetes.io/tls"
            serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
            serving.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
            names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert f"{SERVICE}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)

    def test_base_and_cert_manager_carry_no_ca_bundle(self, rendered: dict[str, Rendering]) -> None:
        """No caBundle to manage in the base or with cert-manager (its cainjector fills it)."""
        for name in ("base", "cert-manager"):
            assert "caBundle" not in rendered[name].webhook["clientConfig"]


class TestKubeApiserverSide:
    """What docs/install.md has admins give kube-apiserver, so that it shows its client certificate to gpupool."""

    def admission_configuration(self) -> Obj:
        config: Obj = yaml.safe_load((MANIFESTS / "kube-apiserver" / "admission-configuration.yaml").read_text())
        return config

    def test_both_webhook_plugins_get_the_kubeconfig(self) -> None:
        """The AdmissionConfiguration (apiserver.config.k8s.io/v1) gives the MutatingAdmissionWebhook and
        the ValidatingAdmissionWebhook plugin the same WebhookAdmissionConfiguration with an absolute
        kubeConfigFile, and nothing else: both webhooks call the Service, and under client certificates a
        plugin without them would have every call refused."""
        config = self.admission_configuration()
        assert (config["apiVersion"], config["kind"]) == ("apiserver.config.k8s.io/v1", "AdmissionConfiguration")
        plugins = {p["name"]: p["configuration"] for p in config["plugins"]}
        assert set(plugins) == {"MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"}
        assert plugins["MutatingAdmissionWebhook"] == plugins["ValidatingAdmissionWebhook"]
        configuration = plugins["MutatingAdmissionWebhook"]
        assert set(configuration) == {"apiVersion", "kind", "kubeConfigFile"}
        assert configuration["apiVersion"] == "apiserver.config.k8s.io/v1"
        assert configuration["kind"] == "WebhookAdmissionConfiguration"
        assert configuration["kubeConfigFile"].startswith("/etc/kubernetes/pki/")

    def test_the_install_guide_names_the_user_kube_apiserver_looks_up(self, rendered: dict[str, Rendering]) -> None:
        """kube-apiserver picks the kubeconfig user named <service>.<namespace>.svc for a webhook that calls
        a Service on port 443 (with ':<port>' for any other port): docs/install.md writes that user, into
        the file the admission configuration names."""
        ref = rendered["base"].webhook["clientConfig"]["service"]
        user = f"{ref['name']}.{ref['namespace']}.svc" + ("" if ref["port"] == 443 else f":{ref['port']}")
        kubeconfig = self.admission_configuration()["plugins"][0]["configuration"]["kubeConfigFile"]
        guide = INSTALL_GUIDE.read_text(encoding="utf-8")
        command = re.search(r"kubectl config set-credentials (\S+) .*?--kubeconfig=(\S+)", guide, re.DOTALL)
        assert command is not None
        assert command.groups() == (user, kubeconfig)
        assert f"  - name: {user}\n    user:\n      client-certificate-data:" in guide


class TestCertManager:
    def test_cainjector_gets_the_serving_certificates_ca(self, rendered: dict[str, Rendering]) -> None:
        """inject-ca-from names the Certificate whose Secret the Deployment mounts, for the Service name."""
        r = rendered["cert-manager"]
        annotation = r.one("MutatingWebhookConfiguration")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        namespace, name = annotation.split("/")
        (certificate,) = [c for c in r.all("Certificate") if c["metadata"]["name"] == name]
        assert certificate["metadata"]["namespace"] == namespace == NAMESPACE
        assert certificate["spec"]["secretName"] == volume_named(r, "tls")["secret"]["secretName"]
        assert f"{SERVICE}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
        assert "server auth" in certificate["spec"]["usages"]

    def test_serving_certificate_comes_from_a_stable_ca(self, rendered: dict[str, Rendering]) -> None:
        """The serving certificate is issued by a CA Issuer backed by an isCA Certificate, so renewing
        it does not change the caBundle."""
        r = rendered["cert-manager"]
        issuers = {i["metadata"]["name"]: i["spec"] for i in r.all("Issuer")}
        certificates = {c["metadata"]["name"]: c["spec"] for c in r.all("Certificate")}
        serving = next(c for c in certificates.values() if c["secretName"] == TLS_SECRET)
        ca_issuer = issuers[serving["issuerRef"]["name"]]
        (ca,) = [c for c in certificates.values() if c["secretName"] == ca_issuer["ca"]["secretName"]]
        assert ca["isCA"] is True
        assert "selfSigned" in issuers[ca["issuerRef"]["name"]]
        for obj in (*r.all("Issuer"), *r.all("Certificate")):
            assert obj["apiVersion"] == "cert-manager.io/v1"
            assert obj["metadata"]["namespace"] == NAMESPACE


# --- matchConditions, evaluated with CEL ---------------------------------------------------------


Condition = Callable[..., Any]  # (object, subresource="") -> CEL result


@pytest.fixture(scope="module")
def conditions(rendered: dict[str, Rendering]) -> dict[str, Condition]:
    """The webhook's matchConditions compiled with cel-python, by name; each takes the object and the
    request's subresource ("" for a Pod CREATE, "ephemeralcontainers" for its UPDATE)."""
    env = celpy.Environment()
    compiled: dict[str, Condition] = {}
    for condition in rendered["base"].webhook["matchConditions"]:
        program = env.program(env.compile(condition["expression"]))

        def evaluate(obj: Obj, sub_resource: str = "", program: Any = program) -> Any:
            request: Obj = {"operation": "CREATE", "namespace": "team-a", "object": obj, "dryRun": False}
            if sub_resource:  # kube-apiserver leaves the field out when there is none
                request |= {"operation": "UPDATE", "subResource": sub_resource, "oldObject": obj}
            return program.evaluate({"object": json_to_cel(obj), "request": json_to_cel(request)})

        compiled[condition["name"]] = evaluate
    return compiled


def sent(conditions: Mapping[str, Condition], obj: Obj, sub_resource: str = "") -> bool:
    """What kube-apiserver does: send the request only when every condition is true."""
    results = [conditions[name](obj, sub_resource) for name in conditions]
    assert all(isinstance(r, celtypes.BoolType) for r in results), results
    return all(bool(r) for r in results)


MIRROR = "kubernetes.io/config.mirror"


def is_gpu_resource(name: str) -> bool:
    return name in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "amd.com/gpu") or name.startswith(
        ("nvidia.com/mig-", "huawei.com/Ascend")
    )


DEFAULT_POLICY = load_policy_text(default_policy_text())


def should_be_sent(obj: Obj) -> bool:
    """The rule the matchConditions implement, for a Pod CREATE in a namespace the namespaceSelector lets
    through: sent exactly when it is not a mirror Pod (annotation kubernetes.io/config.mirror) and it
    carries a gpupool.io/ annotation, or names a GPU resource (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*,
    amd.com/gpu, huawei.com/Ascend*) in the limits or requests of any container or init container, or
    has an env entry named NVIDIA_VISIBLE_DEVICES in any of them. spec.nodeName and DaemonSet owners
    make no difference."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    if MIRROR in annotations:
        return False
    spec = obj.get("spec") or {}
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    resources = [
        r for c in containers for part in ("limits", "requests") for r in c.get("resources", {}).get(part) or {}
    ]
    env_names = [e.get("name") for c in containers for e in c.get("env") or []]
    return (
        any(k.startswith("gpupool.io/") for k in annotations)
        or any(is_gpu_resource(r) for r in resources)
        or "NVIDIA_VISIBLE_DEVICES" in env_names
    )


def pod(
    *,
    annotations: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    env: list[str] | None = None,
    init_limits: dict[str, str] | None = None,
    init_requests: dict[str, str] | None = None,
    init_env: list[str] | None = None,
    node_name: str | None = None,
    owner_kind: str | None = None,
) -> Obj:
    """A Pod as the API server hands it to admission: only fields that are set are present. `env` and
    `init_env` are the names of the containers' environment variables."""
    metadata: Obj = {"generateName": "job-", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if owner_kind is not None:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": "owner", "uid": "u1"}]

    def container(name: str, limits: Obj | None, requests: Obj | None, env: list[str] | None) -> Obj:
        resources: Obj = {}
        if limits is not None:
            resources["limits"] = limits
        if requests is not None:
            resources["requests"] = requests
        made: Obj = {"name": name, "image": "cuda:12", "resources": resources}
        if env is not None:
            made["env"] = [{"name": n, "value": "all"} for n in env]
        return made

    spec: Obj = {"containers": [container("main", limits, requests, env)]}
    if (init_limits, init_requests, init_env) != (None, None, None):
        spec["initContainers"] = [container("init", init_limits, init_requests, init_env)]
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


class TestMatchConditions:
    @pytest.mark.parametrize(
        "obj",
        [
            pod(annotations={"gpupool.io/gpu-class": "high"}),
            pod(annotations={"gpupool.io/min-memory": "24Gi", "team": "ml"}),
            pod(limits={"nvidia.com/gpu": "1"}),
            pod(requests={"nvidia.com/gpu": "2"}),
            pod(limits={"cpu": "1"}, init_limits={"nvidia.com/gpu": "1"}),
            pod(init_requests={"amd.com/gpu": "1"}),
            pod(limits={"nvidia.com/mig-1g.5gb": "1"}),
            pod(limits={"nvidia.com/gpu.shared": "1"}),
            pod(requests={"huawei.com/Ascend910-4c": "1"}),
            pod(requests={"nvidia.com/mig-3g.20gb": "1"}),
            pod(limits={"amd.com/gpu": "1"}),
            pod(limits={"huawei.com/Ascend910": "1"}),
            pod(requests={"huawei.com/Ascend310P": "1"}),
            pod(env=["PATH", "NVIDIA_VISIBLE_DEVICES"]),
            pod(init_env=["NVIDIA_VISIBLE_DEVICES"]),
            pod(limits={"nvidia.com/gpu": "1"}, owner_kind="ReplicaSet"),
            pod(limits={"nvidia.com/gpu": "1"}, node_name="gpu-node-1"),
            pod(annotations={"gpupool.io/gpu-class": "high"}, owner_kind="DaemonSet"),
            pod(env=["NVIDIA_VISIBLE_DEVICES"], owner_kind="DaemonSet", node_name="gpu-node-1"),
        ],
        ids=[
            "annotated",
            "annotated-among-others",
            "gpu-limit",
            "gpu-requests-only",
            "init-container-gpu",
            "init-container-requests",
            "mig-limit",
            "renamed-shared-replica",
            "ascend-virtual-npu",
            "mig-requests",
            "amd",
            "ascend",
            "ascend-requests",
            "visible-devices-env",
            "init-container-visible-devices",
            "replicaset-pod",
            "bound-to-a-node",
            "daemonset",
            "daemonset-with-visible-devices",
        ],
    )
    def test_sent(self, conditions: dict[str, Condition], obj: Obj) -> None:
        """A Pod that opted in with a gpupool.io/ annotation or uses a GPU (a GPU resource, MIG slices
        included, or NVIDIA_VISIBLE_DEVICES) is sent to gpupool, bound to a node or a DaemonSet's or not."""
        assert should_be_sent(obj) is True
        assert sent(conditions, obj) is True

    @pytest.mark.parametrize(
        "obj",
        [
            pod(),
            pod(limits={"cpu": "2", "memory": "4Gi"}, requests={"cpu": "1"}),
            pod(annotations={"example.com/owner": "ml"}),
            pod(annotations={"notgpupool.io/gpu-class": "high", "gpupool.io.example/x": "y"}),
            pod(annotations={}),
            pod(limits={"nvidia.com/gpux": "1", "nvidia.com/mig": "1", "example.com/gpu": "1"}),
            pod(env=["NVIDIA_DRIVER_CAPABILITIES", "nvidia_visible_devices", "CUDA_VISIBLE_DEVICES"], init_env=[]),
            pod(annotations={MIRROR: "hash", "gpupool.io/gpu-class": "high"}, limits={"nvidia.com/gpu": "1"}),
            pod(annotations={MIRROR: ""}, env=["NVIDIA_VISIBLE_DEVICES"], node_name="gpu-node-1"),
        ],
        ids=[
            "plain",
            "cpu-only",
            "unrelated-annotation",
            "lookalike-prefix",
            "empty-annotations",
            "lookalike-resources",
            "other-env",
            "mirror-pod",
            "mirror-pod-empty-value",
        ],
    )
    def test_not_sent(self, conditions: dict[str, Condition], obj: Obj) -> None:
        """Plain Pods, look-alike annotations, resources and variables, and mirror Pods are never sent,
        so they cannot be blocked by gpupool."""
        assert should_be_sent(obj) is False
        assert sent(conditions, obj) is False

    def test_every_resource_of_the_policy_is_sent(self, conditions: dict[str, Condition]) -> None:
        """Every device resource of the default policy's vendors (their GPUs, other cards, renamed
        replicas) and a partition of each partition prefix is one the conditions recognise."""
        for vendor in DEFAULT_POLICY.vendors.values():
            for resource in (*vendor.resources, *(f"{p}x" for p in vendor.partition_prefixes)):
                assert DEFAULT_POLICY.vendor_of(resource) is vendor
                assert sent(conditions, pod(limits={resource: "1"})), resource

    @pytest.mark.parametrize(
        "obj",
        [
            {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "a"}]}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}},
            {"metadata": {"ownerReferences": []}, "spec": {"containers": [{"name": "a", "resources": {"limits": {}}}]}},
            {"metadata": {"annotations": {}}, "spec": {"containers": [{"name": "a", "env": [{"value": "x"}, {}]}]}},
            {"metadata": {}, "spec": {"containers": [], "initContainers": [{"name": "i", "env": []}]}},
        ],
        ids=["no-resources", "no-containers", "no-spec", "empty-lists", "env-without-names", "only-init-containers"],
    )
    def test_conditions_never_fail_to_evaluate(self, conditions: dict[str, Condition], obj: Obj) -> None:
        """Odd but decodable Pods give false or true, never an error (which failurePolicy Fail turns into
        a rejected Pod)."""
        for name, evaluate in conditions.items():
            assert isinstance(evaluate(obj), celtypes.BoolType), name

    @settings(max_examples=150, deadline=None)
    @given(
        parts=st.fixed_dictionaries(
            {
                "annotations": st.none()
                | st.dictionaries(
                    st.sampled_from(["gpupool.io/gpu-count", "app", "x.gpupool.io/y", MIRROR]), st.just("1")
                ),
                "limits": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "requests": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "env": st.none() | st.lists(st.sampled_from(ENV_NAMES), max_size=3),
                "init_limits": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "init_requests": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "init_env": st.none() | st.lists(st.sampled_from(ENV_NAMES), max_size=3),
                "node_name": st.none() | st.sampled_from(["", "node-1"]),
                "owner_kind": st.none() | st.sampled_from(["ReplicaSet", "Job", "DaemonSet"]),
            }
        )
    )
    def test_conditions_agree_with_the_rule(self, conditions: dict[str, Condition], parts: dict[str, Any]) -> None:
        """For any mix of annotations, resources, variables, nodeName and owner, the conditions send the
        Pod exactly when `should_be_sent` says so; and every Pod the core itself checks with the default
        policy is sent (one it would check but kube-apiserver never sends is a hole in the policy). The
        conditions may send more: any huawei.com/Ascend* model, where the default policy knows Ascend910."""
        obj = pod(**parts)
        assert sent(conditions, obj) is should_be_sent(obj)
        view = read_pod(obj, "ml")
        if not view.mirror and wants_gpus(view.shape, DEFAULT_POLICY):
            assert should_be_sent(obj)


def debugged(*envs: list[str], annotations: dict[str, str] | None = None) -> Obj:
    """A GPU Pod as kube-apiserver sends it for an update of pods/ephemeralcontainers: one ephemeral
    container per entry of `envs`, with those environment variables."""
    obj = pod(annotations=annotations, limits={"nvidia.com/gpu": "1"}, env=["NVIDIA_VISIBLE_DEVICES"])
    obj["spec"]["ephemeralContainers"] = [
        {"name": f"debugger-{i}", "image": "busybox", "env": [{"name": n, "value": "all"} for n in names]}
        for i, names in enumerate(envs)
    ]
    return obj


class TestEphemeralContainerConditions:
    @pytest.mark.parametrize(
        "obj",
        [debugged(["NVIDIA_VISIBLE_DEVICES"]), debugged(["PATH"], ["PATH", "NVIDIA_VISIBLE_DEVICES"])],
        ids=["one", "the-second-of-two"],
    )
    def test_an_ephemeral_container_that_sets_visible_devices_is_sent(
        self, conditions: dict[str, Condition], obj: Obj
    ) -> None:
        """`kubectl debug` adding a container that sets NVIDIA_VISIBLE_DEVICES is sent to gpupool."""
        assert sent(conditions, obj, "ephemeralcontainers") is True

    @pytest.mark.parametrize(
        "obj",
        [
            debugged(["PATH"], annotations={"gpupool.io/gpu-class": "high"}),
            debugged(),
            debugged([], ["nvidia_visible_devices", "CUDA_VISIBLE_DEVICES"]),
            {"metadata": {}, "spec": {"containers": [{"name": "a"}], "ephemeralContainers": [{"name": "d"}]}},
            {"metadata": {}, "spec": {"containers": [{"name": "a"}]}},
        ],
        ids=["annotated-gpu-pod", "no-ephemeral-containers", "other-variables", "no-env", "no-list"],
    )
    def test_any_other_ephemeral_container_update_is_not_sent(self, conditions: dict[str, Condition], obj: Obj) -> None:
        """Whatever the Pod (a GPU Pod that opted in, with NVIDIA_VISIBLE_DEVICES in a regular container),
        `kubectl debug` without the variable never reaches gpupool, so it cannot be blocked by it."""
        assert sent(conditions, obj, "ephemeralcontainers") is False
        for name, evaluate in conditions.items():
            assert isinstance(evaluate(obj, "ephemeralcontainers"), celtypes.BoolType), name

    def test_the_ephemeral_condition_lets_every_pod_create_through(self, conditions: dict[str, Condition]) -> None:
        """On a Pod CREATE the condition for ephemeral containers holds, so only the others decide."""
        for obj in (pod(), pod(limits={"nvidia.com/gpu": "1"}), debugged()):
            assert conditions["ephemeral-container-sets-visible-devices"](obj) == celtypes.BoolType(True)


# --- RBAC ----------------------------------------------------------------------------------------


class TestRbac:
    def test_reads_nodes_pods_and_quotas_and_writes_only_what_the_queue_needs(self, rendering: Rendering) -> None:
        """Cluster-wide: get, list and watch on nodes, pods and resourcequotas; patch of pods (the queue's
        release) and create of events (telling the Pod). In its own namespace only: the Lease."""
        granted = set()
        for rule in rendering.one("ClusterRole")["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no nonResourceURLs
            granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
        reads = {("", r, v) for r in ("nodes", "pods", "resourcequotas") for v in ("get", "list", "watch")}
        assert granted == reads | {("", "pods", "patch"), ("", "events", "create")}
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
        binding = rendering.one("ClusterRoleBinding")
        account = rendering.one("ServiceAccount")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": rendering.one("ClusterRole")["metadata"]["name"],
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


# --- the release: make release VERSION=... ------------------------------------------------------------


def selected(objects: tuple[Obj, ...], key: str, excluded: set[str]) -> list[Obj]:
    """The objects `kubectl -l 'key notin (excluded)'` acts on: those whose label is absent or not excluded."""
    return [o for o in objects if (o["metadata"].get("labels") or {}).get(key) not in excluded]


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """`render.py --release` at the package's version, as `make release VERSION=<it>` runs it."""
    version = webhook.__version__
    out = tmp_path_factory.mktemp("dist")
    done = run_render("--release", version, "--out-dir", out)
    assert done.returncode == 0, done.stderr
    return version, out


class TestRelease:
    def test_one_file_installs_everything_with_the_image_pinned(self, release: tuple[str, Path]) -> None:
        """gpupool-<version>.yaml is the cert-manager install (no key in it: the certificates are issued in
        the cluster) with the image tag of the version, failurePolicy Fail, in the order `kubectl apply -f`
        needs: the Namespace first, the webhook configurations last (the mutating one, then the validating one)."""
        version, out = release
        rendering = parse_objects((out / f"gpupool-{version}.yaml").read_text(), "release")
        assert rendering.container["image"] == f"ghcr.io/gpupool/gpupool-webhook:{version}"
        assert rendering.webhook["failurePolicy"] == "Fail"
        assert rendering.objects[0]["kind"] == "Namespace"
        assert [o["kind"] for o in rendering.objects[-2:]] == [
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ]
        assert rendering.all("Certificate") and not rendering.all("Secret")
        for obj in rendering.objects:
            if not obj["apiVersion"].startswith("cert-manager.io/"):
                kubernetes_validate.validate(obj, SCHEMA_VERSIONS[-1], strict=True)

    def test_the_documented_selectors_split_the_file_as_the_install_guide_says(self, release: tuple[str, Path]) -> None:
        """docs/install.md applies everything but the webhook configuration first, and upgrades without the
        policy ConfigMap: each selector leaves out exactly that object."""
        version, out = release
        objects = parse_objects((out / f"gpupool-{version}.yaml").read_text(), "release").objects
        guide = INSTALL_GUIDE.read_text(encoding="utf-8")
        assert "-l 'app.kubernetes.io/component!=webhook-configuration'" in guide
        assert "-l 'app.kubernetes.io/component notin (webhook-configuration,policy)'" in guide
        left_out = [o for o in objects if o not in selected(objects, COMPONENT, {"webhook-configuration"})]
        assert [o["kind"] for o in left_out] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
        left_out = [o for o in objects if o not in selected(objects, COMPONENT, {"webhook-configuration", "policy"})]
        assert sorted((o["kind"], o["metadata"]["name"]) for o in left_out) == [
            ("ConfigMap", "gpupool-policy"),
            ("MutatingWebhookConfiguration", "gpupool-webhook"),
            ("ValidatingWebhookConfiguration", "gpupool-webhook"),
        ]

    def test_the_monitoring_file_holds_the_component_alone_with_runbooks_of_the_release(
        self, release: tuple[str, Path]
    ) -> None:
        """gpupool-monitoring-<version>.yaml is the monitoring component, in gpupool's namespace, and each
        alert's runbook_url points at the release's own docs (its tag), which say what that version does."""
        version, out = release
        rendering = parse_objects((out / f"gpupool-monitoring-{version}.yaml").read_text(), "monitoring")
        assert sorted(o["kind"] for o in rendering.objects) == ["ConfigMap", "PodMonitor", "PrometheusRule"]
        assert {o["metadata"]["namespace"] for o in rendering.objects} == {NAMESPACE}
        urls = [r["annotations"]["runbook_url"] for g in rendering.one("PrometheusRule")["spec"]["groups"]
                for r in g["rules"] if "alert" in r]  # fmt: skip
        assert urls and all(u.startswith(f"https://github.com/gpupool/gpupool/blob/v{version}/docs/") for u in urls)

    def test_the_release_takes_the_networkpolicy_and_namespace_options(self, tmp_path: Path) -> None:
        """A release made for one cluster (make release METRICS_NAMESPACES=... CONTROL_PLANE_CIDRS=...
        EXCLUDE_NAMESPACES=... IGNORE_LABEL=false) carries those choices, as make manifests does, and is
        otherwise the release: the image tag pinned, failurePolicy Fail."""
        version = webhook.__version__
        args = ["--metrics-namespace", "gmp-system", "--control-plane-cidr", "10.9.0.1"]
        args += ["--exclude-namespace", "nvidia-gpu-operator", "--no-ignore-label"]
        done = run_render("--release", version, *args, "--out-dir", tmp_path)
        assert done.returncode == 0, done.stderr
        r = parse_objects((tmp_path / f"gpupool-{version}.yaml").read_text(), "release for a cluster")
        assert network_policy_sources(r) == {8443: ["10.9.0.1/32"], 8080: ["ns:gmp-system"]}
        assert r.webhook["namespaceSelector"] == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", NAMESPACE, "gpu-operator", "nvidia-gpu-operator"],
                }
            ]
        }
        assert r.container["image"] == f"ghcr.io/gpupool/gpupool-webhook:{version}"
        assert r.webhook["failurePolicy"] == "Fail"
        (render,) = [
            line
            for line in make_dry_run(
                "release", f"VERSION={version}", "METRICS_NAMESPACES=a b", "EXCLUDE_NAMESPACES=c", "IGNORE_LABEL=false"
            ).splitlines()
            if "render.py" in line
        ]
        for option in ("--metrics-namespace a --metrics-namespace b", "--exclude-namespace c", "--no-ignore-label"):
            assert option in render, render

    def test_the_release_of_the_base_admits_what_the_base_does(self, release: tuple[str, Path]) -> None:
        """Without options, the release's NetworkPolicy is the base's: 8443 from anywhere, 8080 from the
        monitoring namespace (where the monitoring component's Prometheus must run)."""
        version, out = release
        r = parse_objects((out / f"gpupool-{version}.yaml").read_text(), "release")
        assert network_policy_sources(r) == {8443: None, 8080: ["ns:monitoring"]}

    @pytest.mark.parametrize(
        "given",
        [["--image", "registry.example/gpupool:1"], ["--single-node"], ["--overlay", "self-signed"],
         ["--failure-policy", "Ignore"], ["--client-ca", "ca.crt"], ["--host", "localhost"]],
        ids=lambda g: g[0],
    )  # fmt: skip
    def test_what_a_release_decides_itself_is_refused(self, tmp_path: Path, given: list[str]) -> None:
        """An option the release fixes (or a file of this machine) is refused naming it, not dropped."""
        done = run_render("--release", webhook.__version__, *given, "--out-dir", tmp_path / "dist")
        assert done.returncode == 2
        assert f"{given[0]} cannot be given with it" in done.stderr
        assert not (tmp_path / "dist").exists()

    def test_make_release_refuses_them_too(self) -> None:
        """Given to make on the command line, they stop it before anything is rendered."""
        done = subprocess.run(
            ["make", "-s", "release", f"VERSION={webhook.__version__}", "IMAGE=x", "SINGLE_NODE=true"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert "IMAGE SINGLE_NODE cannot be given" in done.stderr

    def test_the_checksums_are_of_the_files(self, release: tuple[str, Path]) -> None:
        version, out = release
        sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
        assert set(sums) == {f"gpupool-{version}.yaml", f"gpupool-monitoring-{version}.yaml"}
        for name, digest in sums.items():
            assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest

    @pytest.mark.parametrize(
        ("version", "changelog", "message"),
        [
            ("v1", None, "is not x.y.z"),
            ("99.0.0", None, "webhook/__init__.py says version"),
            (webhook.__version__, "# Changelog\n\n## 0.0.1\n", f"has no section `## {webhook.__version__}`"),
        ],
        ids=["format", "not-the-package-version", "no-changelog-section"],
    )
    def test_a_version_the_tree_does_not_name_is_refused(
        self, tmp_path: Path, version: str, changelog: str | None, message: str
    ) -> None:
        """A release whose image would report another version, or that the CHANGELOG says nothing about, is
        refused with the reason, and nothing is written."""
        args: list[str | Path] = ["--release", version, "--out-dir", tmp_path / "dist"]
        if changelog is not None:
            (tmp_path / "CHANGELOG.md").write_text(changelog)
            args += ["--changelog", tmp_path / "CHANGELOG.md"]
        done = run_render(*args)
        assert done.returncode == 1
        assert message in done.stderr
        assert not (tmp_path / "dist").exists()
