"""manifests/render.py: every overlay renders a complete install, with its options (failure policy,
certificates, client CA, control-plane addresses, single node) and refusing what it cannot render.
"""

from __future__ import annotations

import base64
import re
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from tests.manifests.rendered import (
    CLUSTER_SCOPED,
    COMPONENT,
    KUBECTL,
    MANIFESTS,
    NAMESPACE,
    REPO,
    SERVICE,
    TLS_SECRET,
    Rendering,
    make_dry_run,
    parse_objects,
    run_render,
    selects,
)
from webhook.serving.certs import dns_names, ensure_certificates

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)


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
