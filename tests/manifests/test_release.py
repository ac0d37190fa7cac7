"""The release (`make release VERSION=...`): one file installs everything with the image pinned."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest

import webhook
from tests.manifests.rendered import (
    COMPONENT,
    INSTALL_GUIDE,
    KUBECTL,
    NAMESPACE,
    REPO,
    SCHEMA_VERSIONS,
    Obj,
    make_dry_run,
    network_policy_sources,
    parse_objects,
    run_render,
)

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)


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

    def test_the_mig_reshaping_file_grants_the_installs_service_account_what_re_cutting_needs(
        self, release: tuple[str, Path]
    ) -> None:
        """gpupool-mig-reshaping-<version>.yaml is the opt-in mig-reshaping component alone: `patch` on nodes
        and the reads of mig-parted's ConfigMap by name, bound to the ServiceAccount the install runs the
        leader as; the install itself grants no node patch (re-cutting stays opt-in)."""
        version, out = release
        text = (out / f"gpupool-mig-reshaping-{version}.yaml").read_text()
        assert text.startswith(f"# gpupool {version}: opt-in RBAC for MIG re-cutting")
        mig = parse_objects(text, "mig-reshaping")
        assert sorted(o["kind"] for o in mig.objects) == ["ClusterRole", "ClusterRoleBinding"]
        for obj in mig.objects:
            kubernetes_validate.validate(obj, SCHEMA_VERSIONS[-1], strict=True)
        rules = mig.one("ClusterRole")["rules"]
        assert {"resources": ["nodes"], "verbs": ["patch"], "apiGroups": [""]} in rules
        assert any(r["resources"] == ["configmaps"] and r.get("resourceNames") == ["default-mig-parted-config"]
                   for r in rules)  # fmt: skip
        install = parse_objects((out / f"gpupool-{version}.yaml").read_text(), "release")
        (account,) = install.all("ServiceAccount")
        (subject,) = mig.one("ClusterRoleBinding")["subjects"]
        assert (subject["name"], subject["namespace"]) == (account["metadata"]["name"], NAMESPACE)
        assert account["metadata"]["namespace"] == NAMESPACE
        assert not [r for role in install.all("ClusterRole") for r in role["rules"]
                    if "nodes" in r["resources"] and "patch" in r["verbs"]]  # fmt: skip

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

    def test_the_release_names_the_image_by_its_digest_and_labels_monitoring_for_the_prometheus_release(
        self, tmp_path: Path
    ) -> None:
        """make release IMAGE_DIGEST=sha256:... PROMETHEUS_RELEASE=...: the install names the image by the
        digest (kubelet pulls exactly that image, whatever the tag points at later), and the monitoring
        file's PodMonitor and PrometheusRule carry the `release` label kube-prometheus-stack of that Helm
        release selects by; the dashboard's ConfigMap is found by its own label and keeps none."""
        version, digest = webhook.__version__, "sha256:" + "0123456789abcdef" * 4
        done = run_render("--release", version, "--image-digest", digest, "--prometheus-release", "prom",
                          "--out-dir", tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        install = (tmp_path / f"gpupool-{version}.yaml").read_text()
        assert parse_objects(install, "release").container["image"] == f"ghcr.io/gpupool/gpupool-webhook@{digest}"
        assert install.startswith(f"# gpupool {version}, image ghcr.io/gpupool/gpupool-webhook:{version} by its digest")
        monitoring = parse_objects((tmp_path / f"gpupool-monitoring-{version}.yaml").read_text(), "monitoring")
        labelled = {o["kind"]: (o["metadata"].get("labels") or {}).get("release") for o in monitoring.objects}
        assert labelled == {"PodMonitor": "prom", "PrometheusRule": "prom", "ConfigMap": None}
        dry_run = make_dry_run("release", f"VERSION={version}", f"IMAGE_DIGEST={digest}", "PROMETHEUS_RELEASE=prom")
        (render,) = [line for line in dry_run.splitlines() if "render.py" in line]
        assert f"--image-digest {digest} --prometheus-release prom" in render

    @pytest.mark.parametrize(
        ("args", "said"),
        [
            (["--image-digest", "sha256:abc"], "is not an image digest: expected sha256: and 64 hex digits"),
            (["--prometheus-release", "my release"], "is not a label value"),
        ],
        ids=["short-digest", "label-with-space"],
    )
    def test_a_bad_digest_or_label_is_refused_naming_what_is_accepted(
        self, tmp_path: Path, args: list[str], said: str
    ) -> None:
        done = run_render("--release", webhook.__version__, *args, "--out-dir", tmp_path)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert not list(tmp_path.iterdir())

    def test_the_release_options_are_refused_without_a_release(self) -> None:
        done = run_render("--prometheus-release", "prom")
        assert done.returncode == 2 and "--prometheus-release: only with --release (make release)" in done.stderr

    def test_the_release_of_the_base_admits_what_the_base_does(self, release: tuple[str, Path]) -> None:
        """Without options, the release's NetworkPolicy is the base's: 8443 from anywhere, 8080 from the
        monitoring namespace (where the monitoring component's Prometheus must run)."""
        version, out = release
        r = parse_objects((out / f"gpupool-{version}.yaml").read_text(), "release")
        assert network_policy_sources(r) == {8443: None, 8080: ["ns:monitoring"]}

    @pytest.mark.parametrize(
        "given",
        [["--image", "registry.example/gpupool:1"], ["--single-node"], ["--mig-reshaping"],
         ["--overlay", "self-signed"], ["--failure-policy", "Ignore"], ["--client-ca", "ca.crt"],
         ["--host", "localhost"]],
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
            [
                "make",
                "-s",
                "release",
                f"VERSION={webhook.__version__}",
                "IMAGE=x",
                "SINGLE_NODE=true",
                "MIG_RESHAPING=true",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert "IMAGE SINGLE_NODE MIG_RESHAPING cannot be given" in done.stderr

    def test_the_checksums_are_of_the_files(self, release: tuple[str, Path]) -> None:
        version, out = release
        sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
        assert set(sums) == {
            f"gpupool-{version}.yaml",
            f"gpupool-monitoring-{version}.yaml",
            f"gpupool-mig-reshaping-{version}.yaml",
        }
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
