"""Render gpupool's manifests for one overlay into a single file that `kubectl apply -f` installs.

`make manifests OVERLAY=self-signed|cert-manager [FAILURE_POLICY=Ignore] [IMAGE=ref] [CLIENT_CA=file]
[CONTROL_PLANE_CIDRS="cidr ..."] [METRICS_NAMESPACES="ns ..."] [HEALTH_CIDRS="cidr ..."]
[EXCLUDE_NAMESPACES="ns ..."] [IGNORE_LABEL=false] [SINGLE_NODE=true]` runs this:

1. self-signed only: `gpupool certs` creates or renews the CA and the serving certificate in certs/
   (it keeps a valid CA, so the caBundle stays stable; the serving certificate is renewed once 30 days or
   fewer are left, so re-running `make deploy` is how it is renewed) and names only the Service unless
   --host is given. `make run`'s certificate lives in certs/dev/, so neither re-issues the other.
2. manifests/ is copied to a scratch directory, and for self-signed ca.crt, tls.crt and tls.key go
   into the copy's overlay directory: kustomize reads files only from inside a kustomization's root,
   and rendering from a copy leaves no keys in the source tree.
3. A scratch kustomization stacks the overlay, the failure-policy-ignore and single-node components if
   asked for, an image override if given, the client-ca component with a ConfigMap made from --client-ca, and the
   webhook-port-from-control-plane component with the --control-plane-cidr addresses, a patch of the
   NetworkPolicy's health-port rule for --metrics-namespace and --health-cidr, and a patch of both
   webhooks' namespaceSelector (mutating and validating) for --exclude-namespace and --no-ignore-label;
   `kubectl kustomize` renders it.
4. The output is checked for the one thing that breaks silently (a webhook without a CA source) and
   written to build/gpupool-<overlay>.yaml, mode 0600: the self-signed output holds the private key.

`make release VERSION=x.y.z` (`--release x.y.z`) writes what a release ships instead, into dist/: one file
for `kubectl apply -f` (the cert-manager overlay, failurePolicy Fail, the image tag pinned to the
version), the monitoring component on its own, and their SHA-256 sums. It refuses a version that the
package, pyproject.toml or the CHANGELOG do not name. The NetworkPolicy's and the namespace opt-out's
options apply to it as to `make manifests` (CONTROL_PLANE_CIDRS, METRICS_NAMESPACES, HEALTH_CIDRS,
EXCLUDE_NAMESPACES, IGNORE_LABEL), so a release can be made for one cluster; what the release fixes itself
(overlay, failure policy, image, a client CA file, single-node) it refuses.

Standard library only, so it runs before anything else is installed; `gpupool certs` runs with the
same interpreter (`python -m webhook certs`).
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

MANIFESTS = Path(__file__).resolve().parent
REPO = MANIFESTS.parent
OVERLAYS = ("self-signed", "cert-manager")
FAILURE_POLICIES = ("Fail", "Ignore")
# The Service the certificate must name; kube-apiserver connects to <service>.<namespace>.svc.
SERVICE = "gpupool-webhook"
NAMESPACE = "gpupool-system"
# The image the base Deployment names; kustomize's `images:` entries match it by name.
IMAGE_NAME = "ghcr.io/gpupool/gpupool-webhook"
CERT_FILES = ("ca.crt", "tls.crt", "tls.key")
CLIENT_CA_FILE = "client-ca.crt"  # the --client-ca copy, next to the scratch kustomization
# A release needs no file from the machine that made it: cert-manager issues the certificates in the cluster.
RELEASE_OVERLAY = "cert-manager"
# The alerts' runbook_url points at docs/operations.md on main; a release points at its own tag's.
RUNBOOKS = "https://github.com/gpupool/gpupool/blob/main/docs/"
VERSION_FORMAT = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?")
# Who may reach the health port by default (manifests/base/networkpolicy.yaml): Prometheus' namespace.
METRICS_NAMESPACES = ("monitoring",)
# What the base's namespaceSelector leaves out by name (manifests/base/webhook.yaml), and its label.
EXCLUDED_BY_DEFAULT = ("kube-system", NAMESPACE, "gpu-operator")
IGNORE_LABEL = "gpupool.io/ignore"
# The webhook configurations (manifests/base/webhook.yaml, validating-webhook.yaml), one webhook each.
WEBHOOK_CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# What a release fixes itself (or would take from this machine): the options --release refuses, by flag.
RELEASE_REFUSES = {
    "--overlay": "overlay",
    "--failure-policy": "failure_policy",
    "--image": "image",
    "--out": "out",
    "--host": "host",
    "--client-ca": "client_ca",
    "--single-node": "single_node",
}


class RenderError(Exception):
    """A failed step, printed as one line without a traceback."""


def image_override(ref: str) -> list[str]:
    """The kustomize `images:` entry (as YAML lines) that replaces the base's image with `ref`.

    `ref` is `name:tag`, `name@sha256:...` or a bare `name` (which keeps the base's tag); a registry
    port (`host:5000/name`) is not a tag.
    """
    if not ref or any(c.isspace() for c in ref):
        raise RenderError(f"--image: {ref!r} is not an image reference")
    lines = [f"  - name: {IMAGE_NAME}"]
    if "@" in ref:
        name, digest = ref.split("@", 1)
        return [*lines, f"    newName: {json.dumps(name)}", f"    digest: {json.dumps(digest)}"]
    name, sep, tag = ref.rpartition(":")
    if sep and "/" not in tag:
        return [*lines, f"    newName: {json.dumps(name)}", f"    newTag: {json.dumps(tag)}"]
    return [*lines, f"    newName: {json.dumps(ref)}"]


def control_plane_cidr(value: str) -> str:
    """A --control-plane-cidr value as the NetworkPolicy's ipBlock takes it; a bare address is a /32 (/128)."""
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an IP address or CIDR ({exc}); e.g. 10.0.0.10 or 10.0.0.0/28"
        ) from None


def namespace_name(value: str) -> str:
    """An --exclude-namespace value: a namespace name (an RFC 1123 label), as kubernetes.io/metadata.name holds it."""
    if not _NAMESPACE_NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a namespace name (lowercase letters, digits and '-', at most 63 characters)"
        )
    return value


def namespace_selector_patch(exclude: Sequence[str], *, ignore_label: bool) -> list[str]:
    """JSON patch lines (for the patch of the webhook configuration) that leave out the `exclude`
    namespaces by name, besides the base's, and drop the gpupool.io/ignore label unless `ignore_label`.
    The `test` ops make the render fail, rather than patch the wrong expression, if the base changes."""
    selector = "/webhooks/0/namespaceSelector/matchExpressions"
    ops = [f"- op: test\n  path: {selector}/0/key\n  value: kubernetes.io/metadata.name"]
    for name in dict.fromkeys(exclude):
        if name not in EXCLUDED_BY_DEFAULT:
            ops.append(f"- op: add\n  path: {selector}/0/values/-\n  value: {json.dumps(name)}")
    if not ignore_label:
        ops.append(f"- op: test\n  path: {selector}/1/key\n  value: {IGNORE_LABEL}")
        ops.append(f"- op: remove\n  path: {selector}/1")
    return [] if len(ops) == 1 else [line for op in ops for line in op.split("\n")]


def health_port_patch(metrics_namespaces: Sequence[str], health_cidrs: Sequence[str]) -> list[str]:
    """JSON patch lines for the NetworkPolicy: the health port (8080) admits the `metrics_namespaces` by
    name (instead of the base's), and the `health_cidrs` (the nodes, for a CNI that polices the kubelet's
    probes). Empty when both are the base's."""
    rule = "/spec/ingress/1"
    ops = []
    names = list(dict.fromkeys(metrics_namespaces))
    if names and tuple(names) != METRICS_NAMESPACES:
        ops += [
            f"- op: test\n  path: {rule}/from/0/namespaceSelector/matchExpressions/0/key\n"
            "  value: kubernetes.io/metadata.name",
            f"- op: replace\n  path: {rule}/from/0/namespaceSelector/matchExpressions/0/values\n"
            f"  value: {json.dumps(names)}",
        ]
    for cidr in dict.fromkeys(health_cidrs):
        ops.append(f"- op: add\n  path: {rule}/from/-\n  value: {{ipBlock: {{cidr: {json.dumps(cidr)}}}}}")
    if not ops:
        return []
    ops.insert(0, f"- op: test\n  path: {rule}/ports/0/port\n  value: 8080")
    return [line for op in ops for line in op.split("\n")]


def stacked_kustomization(
    overlay: str,
    failure_policy: str,
    image: str | None,
    *,
    client_ca: bool = False,
    control_plane_cidrs: Sequence[str] = (),
    exclude_namespaces: Sequence[str] = (),
    ignore_label: bool = True,
    single_node: bool = False,
    metrics_namespaces: Sequence[str] = (),
    health_cidrs: Sequence[str] = (),
) -> str:
    """A kustomization, placed next to the copy of manifests/, that renders `overlay` as asked.

    Paths are relative because kustomize refuses absolute resource paths. With `client_ca`, the
    ConfigMap the client-ca component mounts is generated from CLIENT_CA_FILE next to it.
    """
    lines = ["apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization", "resources:"]
    lines.append(f"  - ../manifests/overlays/{overlay}")
    components = []
    if failure_policy == "Ignore":
        components.append("failure-policy-ignore")
    if single_node:
        components.append("single-node")
    if client_ca:
        components.append("client-ca")
    if control_plane_cidrs:
        components.append("webhook-port-from-control-plane")
    if components:
        lines += ["components:", *(f"  - ../manifests/components/{c}" for c in components)]
    if image:
        lines += ["images:", *image_override(image)]
    if client_ca:
        # A fixed name, like the TLS Secret's: a changed CA updates it in place and the server reloads it.
        lines += [
            "configMapGenerator:",
            "  - name: gpupool-client-ca",
            f"    namespace: {NAMESPACE}",
            f"    files: [ca.crt={CLIENT_CA_FILE}]",
            "    options:",
            "      disableNameSuffixHash: true",
            "      labels: {app.kubernetes.io/name: gpupool-webhook, app.kubernetes.io/part-of: gpupool}",
        ]
    patches = []
    policy_ops = health_port_patch(metrics_namespaces, health_cidrs)
    if control_plane_cidrs:
        blocks = ", ".join(f"{{ipBlock: {{cidr: {json.dumps(c)}}}}}" for c in control_plane_cidrs)
        policy_ops += ["- op: replace", "  path: /spec/ingress/0/from", f"  value: [{blocks}]"]
    if policy_ops:
        patches += [
            "  - target: {kind: NetworkPolicy, name: gpupool-webhook}",
            "    patch: |-",
            *(f"      {line}" for line in policy_ops),
        ]
    selector = namespace_selector_patch(exclude_namespaces, ignore_label=ignore_label)
    for kind in WEBHOOK_CONFIGURATIONS if selector else ():  # both leave out the same namespaces
        patches += [
            f"  - target: {{kind: {kind}, name: gpupool-webhook}}",
            "    patch: |-",
            *(f"      {line}" for line in selector),
        ]
    if patches:
        lines += ["patches:", *patches]
    return "\n".join(lines) + "\n"


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


def stage(scratch: Path, overlay: str, certs_dir: Path) -> None:
    """Copy manifests/ into `scratch` (minus scripts and stray keys), with the certificates if needed."""
    copy = scratch / "manifests"
    ignore = shutil.ignore_patterns("*.py", "__pycache__", *CERT_FILES)
    shutil.copytree(MANIFESTS, copy, ignore=ignore)
    if overlay == "self-signed":
        for name in CERT_FILES:
            source = certs_dir / name
            if not source.is_file():
                raise RenderError(f"{source} is missing (`gpupool certs --out {certs_dir}` writes it)")
            _write_private(copy / "overlays" / "self-signed" / name, source.read_bytes())


def kustomize(kubectl: str, directory: Path) -> str:
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RenderError(f"`kubectl kustomize` failed: {done.stderr.strip()}")
    return done.stdout


def check_ca_source(rendered: str, overlay: str) -> None:
    """Refuse output whose webhooks have no CA: kube-apiserver would reject every call (x509 errors)."""
    mark = {"self-signed": "caBundle:", "cert-manager": "cert-manager.io/inject-ca-from:"}[overlay]
    if rendered.count(mark) < len(WEBHOOK_CONFIGURATIONS):
        raise RenderError(f"a rendered webhook configuration has no {mark.rstrip(':')}")


def render(
    overlay: str,
    *,
    failure_policy: str,
    image: str | None,
    out: Path,
    certs_dir: Path,
    hosts: Sequence[str],
    kubectl: str,
    client_ca: Path | None = None,
    control_plane_cidrs: Sequence[str] = (),
    exclude_namespaces: Sequence[str] = (),
    ignore_label: bool = True,
    single_node: bool = False,
    metrics_namespaces: Sequence[str] = (),
    health_cidrs: Sequence[str] = (),
) -> None:
    if shutil.which(kubectl) is None:
        raise RenderError(f"{kubectl!r} not found on PATH; kubectl (with kustomize) renders the manifests")
    client_ca_pem = None if client_ca is None else read_client_ca(client_ca)
    if overlay == "self-signed":
        for line in ensure_certs(certs_dir, hosts):
            print(line)  # the admin sees a new CA (a new caBundle) or a renewal happen
    with tempfile.TemporaryDirectory(prefix="gpupool-render-") as tmp:
        scratch = Path(tmp)
        stage(scratch, overlay, certs_dir)
        (scratch / "render").mkdir()
        if client_ca_pem is not None:
            (scratch / "render" / CLIENT_CA_FILE).write_bytes(client_ca_pem)
        kustomization = stacked_kustomization(
            overlay,
            failure_policy,
            image,
            client_ca=client_ca_pem is not None,
            control_plane_cidrs=control_plane_cidrs,
            exclude_namespaces=exclude_namespaces,
            ignore_label=ignore_label,
            single_node=single_node,
            metrics_namespaces=metrics_namespaces,
            health_cidrs=health_cidrs,
        )
        (scratch / "render" / "kustomization.yaml").write_text(kustomization)
        rendered = kustomize(kubectl, scratch / "render")
    check_ca_source(rendered, overlay)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_private(out, rendered.encode())


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` readable by the owner only, replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply when the file already existed
    os.replace(tmp, path)


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


def release(
    version: str,
    *,
    out_dir: Path,
    kubectl: str,
    changelog: Path,
    control_plane_cidrs: Sequence[str] = (),
    exclude_namespaces: Sequence[str] = (),
    ignore_label: bool = True,
    metrics_namespaces: Sequence[str] = (),
    health_cidrs: Sequence[str] = (),
) -> list[Path]:
    """Write the release's files into `out_dir`; returns them. RenderError when the tree cannot be released.

    Who may reach the two ports and which namespaces are left out are the cluster's to say, as for
    `render`: a release built for one cluster passes them (the defaults are the base's)."""
    problems = release_version_problems(version, changelog)
    if problems:
        raise RenderError("; ".join(problems))
    if shutil.which(kubectl) is None:
        raise RenderError(f"{kubectl!r} not found on PATH; kubectl (with kustomize) renders the manifests")
    tag = f"https://github.com/gpupool/gpupool/blob/v{version}/docs/"
    install = out_dir / f"gpupool-{version}.yaml"
    monitoring = out_dir / f"gpupool-monitoring-{version}.yaml"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpupool-release-") as tmp:
        scratch = Path(tmp)
        stage(scratch, RELEASE_OVERLAY, scratch)
        (scratch / "render").mkdir()
        kustomization = stacked_kustomization(
            RELEASE_OVERLAY,
            "Fail",
            f"{IMAGE_NAME}:{version}",
            control_plane_cidrs=control_plane_cidrs,
            exclude_namespaces=exclude_namespaces,
            ignore_label=ignore_label,
            metrics_namespaces=metrics_namespaces,
            health_cidrs=health_cidrs,
        )
        (scratch / "render" / "kustomization.yaml").write_text(kustomization)
        rendered = kustomize(kubectl, scratch / "render")
        check_ca_source(rendered, RELEASE_OVERLAY)
        (scratch / "monitoring").mkdir()
        (scratch / "monitoring" / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "components:\n  - ../manifests/components/monitoring\n"
        )
        alerts = kustomize(kubectl, scratch / "monitoring")
    if RUNBOOKS not in alerts:
        raise RenderError(f"the alerts' runbook_url no longer starts with {RUNBOOKS}")
    header = f"# gpupool {version}: {{}}\n"
    install.write_text(header.format("kubectl apply -f (docs/install.md, Installing a release)") + rendered)
    monitoring.write_text(header.format("monitoring for the Prometheus Operator") + alerts.replace(RUNBOOKS, tag))
    sums = out_dir / "SHA256SUMS"
    sums.write_text("".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in (install, monitoring)))
    return [install, monitoring, sums]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="render.py", description=__doc__.splitlines()[0])
    # No argparse defaults for these two: --release refuses them when given (`RELEASE_REFUSES`).
    parser.add_argument("--overlay", choices=OVERLAYS, help="default: self-signed")
    parser.add_argument(
        "--failure-policy",
        choices=FAILURE_POLICIES,
        help="Ignore adds the failure-policy-ignore component, for a first rollout (default: Fail)",
    )
    parser.add_argument("--image", metavar="REF", help="image for the Deployment (default: the base's)")
    parser.add_argument("--out", metavar="FILE", type=Path, help="default: build/gpupool-<overlay>.yaml")
    parser.add_argument("--certs-dir", metavar="DIR", type=Path, default=REPO / "certs")
    parser.add_argument(
        "--host",
        metavar="NAME_OR_IP",
        action="append",
        default=[],
        help="one more name for the serving certificate, passed to `gpupool certs` (self-signed only; by "
        "default it names only the Service)",
    )
    parser.add_argument(
        "--client-ca",
        metavar="FILE",
        type=Path,
        help="PEM certificate(s) of the CA that signs kube-apiserver's client certificate: the webhook port "
        "then answers only clients with such a certificate (components/client-ca)",
    )
    parser.add_argument(
        "--control-plane-cidr",
        metavar="CIDR",
        action="append",
        type=control_plane_cidr,
        default=[],
        help="an address range kube-apiserver calls the webhook from; repeatable. The NetworkPolicy then "
        "admits only these to port 8443 (components/webhook-port-from-control-plane)",
    )
    parser.add_argument(
        "--metrics-namespace",
        metavar="NAME",
        action="append",
        type=namespace_name,
        default=[],
        help="a namespace whose Pods (Prometheus) may reach the health and metrics port 8080; repeatable "
        f"(default: {', '.join(METRICS_NAMESPACES)}). The kubelet's probes come from the node and need none",
    )
    parser.add_argument(
        "--health-cidr",
        metavar="CIDR",
        action="append",
        type=control_plane_cidr,
        default=[],
        help="an address range also admitted to port 8080, e.g. the nodes', for a CNI that applies "
        "NetworkPolicy to the kubelet's probes; repeatable",
    )
    parser.add_argument(
        "--exclude-namespace",
        metavar="NAME",
        action="append",
        type=namespace_name,
        default=[],
        help="a namespace whose Pods are never sent to gpupool, by name; repeatable. Always left out: "
        + ", ".join(EXCLUDED_BY_DEFAULT),
    )
    parser.add_argument(
        "--no-ignore-label",
        dest="ignore_label",
        action="store_false",
        help=f"namespaces labelled {IGNORE_LABEL}=true are sent too: only names leave a namespace out "
        "(for clusters where tenants may label their namespaces)",
    )
    parser.add_argument(
        "--single-node",
        action="store_true",
        help="for single-node test clusters: both replicas may run on one node (components/single-node); "
        "never on a cluster with real GPU workloads",
    )
    parser.add_argument("--kubectl", default="kubectl", metavar="PATH")
    parser.add_argument(
        "--release",
        metavar="VERSION",
        help="write the release's files into --out-dir instead: the cert-manager install with the image tag "
        "VERSION, the monitoring component, SHA256SUMS; takes the options of the NetworkPolicy and of the "
        "namespaces left out, and refuses the others",
    )
    parser.add_argument("--out-dir", metavar="DIR", type=Path, default=REPO / "dist", help="for --release")
    parser.add_argument("--changelog", metavar="FILE", type=Path, default=REPO / "CHANGELOG.md", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.release is not None:
        given = [flag for flag, dest in RELEASE_REFUSES.items() if getattr(args, dest) not in (None, False, [])]
        if given:
            parser.error(
                f"--release renders the cert-manager overlay, failurePolicy Fail, the image tagged VERSION and no "
                f"file of this machine; {', '.join(given)} cannot be given with it"
            )
        try:
            files = release(
                args.release,
                out_dir=args.out_dir,
                kubectl=args.kubectl,
                changelog=args.changelog,
                control_plane_cidrs=args.control_plane_cidr,
                exclude_namespaces=args.exclude_namespace,
                ignore_label=args.ignore_label,
                metrics_namespaces=args.metrics_namespace,
                health_cidrs=args.health_cidr,
            )
        except RenderError as exc:
            print(f"render.py: error: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {', '.join(str(f) for f in files)} (release {args.release})")
        return 0
    overlay: str = args.overlay or "self-signed"
    failure_policy: str = args.failure_policy or "Fail"
    out: Path = args.out or REPO / "build" / f"gpupool-{overlay}.yaml"
    try:
        render(
            overlay,
            failure_policy=failure_policy,
            image=args.image,
            out=out,
            certs_dir=args.certs_dir,
            hosts=args.host,
            kubectl=args.kubectl,
            client_ca=args.client_ca,
            control_plane_cidrs=args.control_plane_cidr,
            exclude_namespaces=args.exclude_namespace,
            ignore_label=args.ignore_label,
            single_node=args.single_node,
            metrics_namespaces=args.metrics_namespace,
            health_cidrs=args.health_cidr,
        )
    except RenderError as exc:
        print(f"render.py: error: {exc}", file=sys.stderr)
        return 1
    extras = ", client certificates required" if args.client_ca else ""
    if args.control_plane_cidr:
        extras += f", port 8443 from {' '.join(args.control_plane_cidr)} only"
    if args.metrics_namespace or args.health_cidr:
        readers = [*dict.fromkeys(args.metrics_namespace or METRICS_NAMESPACES), *dict.fromkeys(args.health_cidr)]
        extras += f", port 8080 from {' '.join(readers)} (and the node's probes)"
    if added := [n for n in dict.fromkeys(args.exclude_namespace) if n not in EXCLUDED_BY_DEFAULT]:
        extras += f", also leaving out {' '.join(added)}"
    if not args.ignore_label:
        extras += f", {IGNORE_LABEL} not honoured"
    if args.single_node:
        extras += ", both replicas may share a node (single-node test cluster)"
    print(f"wrote {out} ({overlay}, failurePolicy {failure_policy}{extras})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
