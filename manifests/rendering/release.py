"""What `make release VERSION=x.y.z` writes: the install for `kubectl apply -f`, the monitoring file, the
opt-in MIG re-cutting RBAC file, their sums."""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path

from .build import REPO, kustomize, render_overlay, require_kubectl
from .errors import RenderError
from .kustomization import (
    IMAGE_NAME,
    PROMETHEUS_RELEASE,
    Access,
    component_kustomization,
    monitoring_kustomization,
    stacked_kustomization,
)

# A release needs no file from the machine that made it: cert-manager issues the certificates in the cluster.
RELEASE_OVERLAY = "cert-manager"
# The alerts' runbook_url points at docs/operations.md on main; a release points at its own tag's.
RUNBOOKS = "https://github.com/gpupool/gpupool/blob/main/docs/"
VERSION_FORMAT = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?")


def release_version_problems(version: str, changelog: Path) -> list[str]:
    """Why `version` cannot be released from this tree: its format, the version the package and
    pyproject.toml say (what gpupool_build_info will report), a CHANGELOG without a section for it."""
    if not VERSION_FORMAT.fullmatch(version):
        return [f"VERSION {version!r} is not x.y.z (or x.y.z-suffix)"]
    problems = []
    package = re.search(r'^__version__ = "([^"]+)"', (REPO / "webhook" / "__init__.py").read_text(), re.M)
    project = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    for where, found in (("webhook/__init__.py", package), ("pyproject.toml", project)):
        if found is None or found.group(1) != version:
            said = found.group(1) if found else "nothing"
            problems.append(f"{where} says version {said}, not {version}: the image would report another version")
    try:
        text = changelog.read_text(encoding="utf-8")
    except OSError as exc:
        return [*problems, f"cannot read {changelog}: {exc.strerror}"]
    if not re.search(rf"^## {re.escape(version)}(\s|$)", text, re.M):
        problems.append(f"{changelog.name} has no section `## {version}`: say what the release changes")
    return problems


def release(  # noqa: PLR0913 (the release's choices, each by keyword)
    version: str,
    *,
    out_dir: Path,
    kubectl: str,
    changelog: Path,
    access: Access,
    image_digest: str | None = None,
    prometheus_release: str = PROMETHEUS_RELEASE,
) -> list[Path]:
    """Write the release's files into `out_dir`; returns them. RenderError when the tree cannot be released.

    Who may reach the two ports and which namespaces are left out are the cluster's to say, as for
    `render`: a release built for one cluster passes them (the defaults are the base's). With
    `image_digest` (`sha256:...`, of the image pushed as tag `version`) the Deployment names the image by
    it, so the file runs exactly that image; `prometheus_release` is the `release` label the monitoring
    file's PodMonitor and PrometheusRule carry, for kube-prometheus-stack's selectors."""
    problems = release_version_problems(version, changelog)
    if problems:
        raise RenderError("; ".join(problems))
    require_kubectl(kubectl)
    tag = f"https://github.com/gpupool/gpupool/blob/v{version}/docs/"
    install = out_dir / f"gpupool-{version}.yaml"
    monitoring = out_dir / f"gpupool-monitoring-{version}.yaml"
    mig = out_dir / f"gpupool-mig-reshaping-{version}.yaml"
    out_dir.mkdir(parents=True, exist_ok=True)
    image = f"{IMAGE_NAME}@{image_digest}" if image_digest else f"{IMAGE_NAME}:{version}"
    kustomization = stacked_kustomization(RELEASE_OVERLAY, "Fail", image, access)
    with tempfile.TemporaryDirectory(prefix="gpupool-release-") as tmp:
        scratch = Path(tmp)
        rendered = render_overlay(kubectl, scratch, RELEASE_OVERLAY, kustomization, certs_dir=scratch, files={})
        alerts = kustomize(kubectl, scratch / "monitoring", monitoring_kustomization(prometheus_release))
        mig_rbac = kustomize(kubectl, scratch / "mig-reshaping", component_kustomization("mig-reshaping"))
    if RUNBOOKS not in alerts:
        raise RenderError(f"the alerts' runbook_url no longer starts with {RUNBOOKS}")
    pinned = f", image {IMAGE_NAME}:{version} by its digest" if image_digest else ""
    header = f"# gpupool {version}{pinned}: {{}}\n"
    install.write_text(header.format("kubectl apply -f (docs/install.md, Installing a release)") + rendered)
    monitoring.write_text(header.format("monitoring for the Prometheus Operator") + alerts.replace(RUNBOOKS, tag))
    mig.write_text(header.format("opt-in RBAC for MIG re-cutting (docs/mig.md), after the install") + mig_rbac)
    sums = out_dir / "SHA256SUMS"
    files = (install, monitoring, mig)
    sums.write_text("".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in files))
    return [*files, sums]
