"""What `make manifests` does on disk and in subprocesses: certificates, the scratch copy, kubectl kustomize."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import RenderError
from .kustomization import (
    CLIENT_CA_FILE,
    NAMESPACE,
    SERVICE,
    WEBHOOK_CONFIGURATIONS,
    Access,
    stacked_kustomization,
)

MANIFESTS = Path(__file__).resolve().parent.parent
REPO = MANIFESTS.parent
CERT_FILES = ("ca.crt", "tls.crt", "tls.key")


def read_client_ca(path: Path) -> bytes:
    """The --client-ca file's bytes: PEM certificates and nothing secret, since a ConfigMap is readable
    by anyone who may read the namespace. `gpupool serve` checks the certificates themselves at start."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RenderError(f"--client-ca {path}: cannot read: {exc.strerror}") from None
    if b"PRIVATE KEY-----" in data:
        raise RenderError(f"--client-ca {path}: holds a private key; give the CA certificate (ca.crt) alone")
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise RenderError(f"--client-ca {path}: no PEM certificate in it; give the client CA's certificate")
    return data


def ensure_certs(certs_dir: Path, hosts: Sequence[str]) -> list[str]:
    """Create the CA and serving certificate with `gpupool certs`, or renew what needs renewing (a serving
    certificate with 30 days or fewer left, one whose names changed); returns its lines for what it
    created or renewed. The serving certificate names the Service, plus `hosts` only if given."""
    command = [sys.executable, "-m", "webhook", "certs", "--out", str(certs_dir)]
    command += ["--service", SERVICE, "--namespace", NAMESPACE]
    for host in hosts:
        command += ["--host", host]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RenderError(f"`gpupool certs` failed: {done.stderr.strip() or done.stdout.strip()}")
    return [line for line in done.stdout.splitlines() if line and not line.startswith("kept ")]


def require_kubectl(kubectl: str) -> None:
    if shutil.which(kubectl) is None:
        raise RenderError(f"{kubectl!r} not found on PATH; kubectl (with kustomize) renders the manifests")


def stage(scratch: Path, overlay: str, certs_dir: Path) -> None:
    """Copy manifests/ into `scratch` (minus this code and stray keys), with the certificates if needed."""
    copy = scratch / "manifests"
    ignore = shutil.ignore_patterns("*.py", "__pycache__", Path(__file__).parent.name, *CERT_FILES)
    shutil.copytree(MANIFESTS, copy, ignore=ignore)
    if overlay == "self-signed":
        for name in CERT_FILES:
            source = certs_dir / name
            if not source.is_file():
                raise RenderError(f"{source} is missing (`gpupool certs --out {certs_dir}` writes it)")
            write_private(copy / "overlays" / "self-signed" / name, source.read_bytes())


def kustomize(kubectl: str, directory: Path, kustomization: str, files: Mapping[str, bytes] | None = None) -> str:
    """`kubectl kustomize` of `kustomization`, written into `directory` (made here) with `files` beside it."""
    directory.mkdir()
    for name, data in (files or {}).items():
        (directory / name).write_bytes(data)
    (directory / "kustomization.yaml").write_text(kustomization)
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RenderError(f"`kubectl kustomize` failed: {done.stderr.strip()}")
    return done.stdout


def check_ca_source(rendered: str, overlay: str) -> None:
    """Refuse output whose webhooks have no CA: kube-apiserver would reject every call (x509 errors)."""
    mark = {"self-signed": "caBundle:", "cert-manager": "cert-manager.io/inject-ca-from:"}[overlay]
    if rendered.count(mark) < len(WEBHOOK_CONFIGURATIONS):
        raise RenderError(f"a rendered webhook configuration has no {mark.rstrip(':')}")


def render_overlay(
    kubectl: str, scratch: Path, overlay: str, kustomization: str, *, certs_dir: Path, files: Mapping[str, bytes]
) -> str:
    """The install `kustomization` renders from a copy of manifests/ staged in `scratch`, checked."""
    stage(scratch, overlay, certs_dir)
    rendered = kustomize(kubectl, scratch / "render", kustomization, files)
    check_ca_source(rendered, overlay)
    return rendered


def render(  # noqa: PLR0913 (the render command's flags, one keyword each)
    overlay: str,
    *,
    failure_policy: str,
    image: str | None,
    out: Path,
    certs_dir: Path,
    hosts: Sequence[str],
    kubectl: str,
    access: Access,
    client_ca: Path | None = None,
    single_node: bool = False,
    mig_reshaping: bool = False,
) -> None:
    """Write the install for `overlay` to `out` (mode 0600), creating or renewing the self-signed certificates."""
    require_kubectl(kubectl)
    client_ca_pem = None if client_ca is None else read_client_ca(client_ca)
    if overlay == "self-signed":
        for line in ensure_certs(certs_dir, hosts):
            print(line)  # the admin sees a new CA (a new caBundle) or a renewal happen
    kustomization = stacked_kustomization(
        overlay,
        failure_policy,
        image,
        access,
        client_ca=client_ca_pem is not None,
        single_node=single_node,
        mig_reshaping=mig_reshaping,
    )
    files = {} if client_ca_pem is None else {CLIENT_CA_FILE: client_ca_pem}
    with tempfile.TemporaryDirectory(prefix="gpupool-render-") as tmp:
        rendered = render_overlay(kubectl, Path(tmp), overlay, kustomization, certs_dir=certs_dir, files=files)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_private(out, rendered.encode())


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` readable by the owner only, replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply when the file already existed
    os.replace(tmp, path)
