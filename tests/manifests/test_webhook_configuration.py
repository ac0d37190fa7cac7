"""The MutatingWebhookConfiguration: what it sends, how kube-apiserver calls and trusts gpupool, and the
cert-manager overlay's certificates.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tests.manifests.rendered import (
    INSTALL_GUIDE,
    KUBECTL,
    MANIFESTS,
    NAMESPACE,
    SERVICE,
    TLS_SECRET,
    Obj,
    Rendering,
    container_port,
    make_dry_run,
    parse_objects,
    run_render,
    selects,
    serve_options,
    volume_named,
)

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)


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
