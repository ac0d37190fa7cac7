"""Render gpupool's manifests for one overlay into a single file that `kubectl apply -f` installs.

`make manifests OVERLAY=self-signed|cert-manager [FAILURE_POLICY=Ignore] [IMAGE=ref] [CLIENT_CA=file]
[CONTROL_PLANE_CIDRS="cidr ..."] [METRICS_NAMESPACES="ns ..."] [HEALTH_CIDRS="cidr ..."]
[EXCLUDE_NAMESPACES="ns ..."] [IGNORE_LABEL=false] [SINGLE_NODE=true] [MIG_RESHAPING=true]` runs this:

1. self-signed only: `gpupool certs` creates or renews the CA and the serving certificate in certs/
   (it keeps a valid CA, so the caBundle stays stable; the serving certificate is renewed once 30 days or
   fewer are left, so re-running `make deploy` is how it is renewed) and names only the Service unless
   --host is given. `make run`'s certificate lives in certs/dev/, so neither re-issues the other.
2. manifests/ is copied to a scratch directory, and for self-signed ca.crt, tls.crt and tls.key go
   into the copy's overlay directory: kustomize reads files only from inside a kustomization's root,
   and rendering from a copy leaves no keys in the source tree.
3. A scratch kustomization stacks the overlay, the failure-policy-ignore, single-node and mig-reshaping
   components if asked for, an image override if given, the client-ca component with a ConfigMap made from
   --client-ca, and the webhook-port-from-control-plane component with the --control-plane-cidr addresses,
   a patch of the NetworkPolicy's health-port rule for --metrics-namespace and --health-cidr, and a patch of both
   webhooks' namespaceSelector (mutating and validating) for --exclude-namespace and --no-ignore-label;
   `kubectl kustomize` renders it.
4. The output is checked for the one thing that breaks silently (a webhook without a CA source) and
   written to build/gpupool-<overlay>.yaml, mode 0600: the self-signed output holds the private key.

`make release VERSION=x.y.z` (`--release x.y.z`) writes what a release ships instead, into dist/: one file
for `kubectl apply -f` (the cert-manager overlay, failurePolicy Fail, the image tag pinned to the
version, or with --image-digest the image by digest), the monitoring component on its own (labelled
`release: <--prometheus-release>` for kube-prometheus-stack), the mig-reshaping component on its own
(opt-in RBAC for MIG re-cutting), and their SHA-256 sums. It refuses a version that the
package, pyproject.toml or the CHANGELOG do not name. The NetworkPolicy's and the namespace opt-out's
options apply to it as to `make manifests` (CONTROL_PLANE_CIDRS, METRICS_NAMESPACES, HEALTH_CIDRS,
EXCLUDE_NAMESPACES, IGNORE_LABEL), so a release can be made for one cluster; what the release fixes itself
(overlay, failure policy, image, a client CA file, single-node, mig-reshaping) it refuses.

Standard library only, so it runs before anything else is installed; `gpupool certs` runs with the
same interpreter (`python -m webhook certs`). This file is the command line; the steps are in
manifests/rendering/ (the kustomization's text, the files and subprocesses, the release).
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rendering.build import REPO, render
from rendering.errors import RenderError
from rendering.kustomization import EXCLUDED_BY_DEFAULT, IGNORE_LABEL, METRICS_NAMESPACES, PROMETHEUS_RELEASE, Access
from rendering.release import release

OVERLAYS = ("self-signed", "cert-manager")
FAILURE_POLICIES = ("Fail", "Ignore")
_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
# What only a release renders: refused without --release.
RELEASE_ONLY = {"--image-digest": "image_digest", "--prometheus-release": "prometheus_release"}
# What a release fixes itself (or would take from this machine): the options --release refuses, by flag.
RELEASE_REFUSES = {
    "--overlay": "overlay",
    "--failure-policy": "failure_policy",
    "--image": "image",
    "--out": "out",
    "--host": "host",
    "--client-ca": "client_ca",
    "--single-node": "single_node",
    "--mig-reshaping": "mig_reshaping",
}


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


def image_digest(value: str) -> str:
    """An image digest as registries give it: sha256: and 64 lowercase hex digits."""
    if not _DIGEST.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an image digest: expected sha256: and 64 hex digits")
    return value


def label_value(value: str) -> str:
    """A Kubernetes label value: at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric."""
    if not _LABEL_VALUE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a label value: at most 63 letters, digits, '-', '_' and '.', beginning and ending "
            "with a letter or digit"
        )
    return value


def _add_repeatable(
    parser: argparse.ArgumentParser, flag: str, metavar: str, help_text: str, value: Callable[[str], str] = str
) -> None:
    """An option given once per value, checked by `value`; `[]` when absent, which --release reads as not given."""
    parser.add_argument(flag, metavar=metavar, action="append", type=value, default=[], help=help_text)


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
    _add_repeatable(
        parser,
        "--host",
        "NAME_OR_IP",
        "one more name for the serving certificate, passed to `gpupool certs` (self-signed only; by "
        "default it names only the Service)",
    )
    parser.add_argument(
        "--client-ca",
        metavar="FILE",
        type=Path,
        help="PEM certificate(s) of the CA that signs kube-apiserver's client certificate: the webhook port "
        "then answers only clients with such a certificate (components/client-ca)",
    )
    _add_repeatable(
        parser,
        "--control-plane-cidr",
        "CIDR",
        "an address range kube-apiserver calls the webhook from; repeatable. The NetworkPolicy then "
        "admits only these to port 8443 (components/webhook-port-from-control-plane)",
        control_plane_cidr,
    )
    _add_repeatable(
        parser,
        "--metrics-namespace",
        "NAME",
        "a namespace whose Pods (Prometheus) may reach the health and metrics port 8080; repeatable "
        f"(default: {', '.join(METRICS_NAMESPACES)}). The kubelet's probes come from the node and need none",
        namespace_name,
    )
    _add_repeatable(
        parser,
        "--health-cidr",
        "CIDR",
        "an address range also admitted to port 8080, e.g. the nodes', for a CNI that applies "
        "NetworkPolicy to the kubelet's probes; repeatable",
        control_plane_cidr,
    )
    _add_repeatable(
        parser,
        "--exclude-namespace",
        "NAME",
        "a namespace whose Pods are never sent to gpupool, by name; repeatable. Always left out: "
        + ", ".join(EXCLUDED_BY_DEFAULT),
        namespace_name,
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
    parser.add_argument(
        "--mig-reshaping",
        action="store_true",
        help="let the queue's leader label MIG nodes and read mig-parted's ConfigMap (components/mig-reshaping), "
        "for the policy's migReshaping (docs/mig.md)",
    )
    parser.add_argument("--kubectl", default="kubectl", metavar="PATH")
    parser.add_argument(
        "--release",
        metavar="VERSION",
        help="write the release's files into --out-dir instead: the cert-manager install with the image tag "
        "VERSION, the monitoring component, the mig-reshaping component, SHA256SUMS; takes the options of the "
        "NetworkPolicy and of the namespaces left out, and refuses the others",
    )
    parser.add_argument("--out-dir", metavar="DIR", type=Path, default=REPO / "dist", help="for --release")
    parser.add_argument(
        "--image-digest",
        metavar="sha256:HEX",
        type=image_digest,
        help="for --release: the digest of the image pushed as tag VERSION; the install then names the image by "
        "it (default: by the tag)",
    )
    parser.add_argument(
        "--prometheus-release",
        metavar="NAME",
        type=label_value,
        help="for --release: the `release` label of the monitoring file's PodMonitor and PrometheusRule, the "
        f"Helm release name kube-prometheus-stack selects them by (default: {PROMETHEUS_RELEASE})",
    )
    parser.add_argument("--changelog", metavar="FILE", type=Path, default=REPO / "CHANGELOG.md", help=argparse.SUPPRESS)
    return parser


def access_of(args: argparse.Namespace) -> Access:
    """The options `make manifests` and `make release` share, as parsed."""
    return Access(
        control_plane_cidrs=tuple(args.control_plane_cidr),
        metrics_namespaces=tuple(args.metrics_namespace),
        health_cidrs=tuple(args.health_cidr),
        exclude_namespaces=tuple(args.exclude_namespace),
        ignore_label=args.ignore_label,
    )


def described(access: Access, *, client_ca: bool, single_node: bool, mig_reshaping: bool = False) -> str:
    """What the install does beyond the overlay's defaults, for the `wrote` line (empty: nothing)."""
    extras = ", client certificates required" if client_ca else ""
    if access.control_plane_cidrs:
        extras += f", port 8443 from {' '.join(access.control_plane_cidrs)} only"
    if access.metrics_namespaces or access.health_cidrs:
        readers = [*(access.metrics_readers or METRICS_NAMESPACES), *access.health_ranges]
        extras += f", port 8080 from {' '.join(readers)} (and the node's probes)"
    if access.also_excluded:
        extras += f", also leaving out {' '.join(access.also_excluded)}"
    if not access.ignore_label:
        extras += f", {IGNORE_LABEL} not honoured"
    if single_node:
        extras += ", both replicas may share a node (single-node test cluster)"
    if mig_reshaping:
        extras += ", may label MIG nodes (mig-reshaping)"
    return extras


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    access = access_of(args)
    if args.release is None:
        given = [flag for flag, dest in RELEASE_ONLY.items() if getattr(args, dest) is not None]
        if given:
            parser.error(f"{', '.join(given)}: only with --release (make release)")
    if args.release is not None:
        given = [flag for flag, dest in RELEASE_REFUSES.items() if getattr(args, dest) not in (None, False, [])]
        if given:
            parser.error(
                f"--release renders the cert-manager overlay, failurePolicy Fail, the image tagged VERSION and no "
                f"file of this machine; {', '.join(given)} cannot be given with it"
            )
    try:
        if args.release is not None:
            files = release(
                args.release,
                out_dir=args.out_dir,
                kubectl=args.kubectl,
                changelog=args.changelog,
                access=access,
                image_digest=args.image_digest,
                prometheus_release=args.prometheus_release or PROMETHEUS_RELEASE,
            )
            wrote = f"wrote {', '.join(str(f) for f in files)} (release {args.release})"
        else:
            overlay: str = args.overlay or "self-signed"
            failure_policy: str = args.failure_policy or "Fail"
            out: Path = args.out or REPO / "build" / f"gpupool-{overlay}.yaml"
            render(
                overlay,
                failure_policy=failure_policy,
                image=args.image,
                out=out,
                certs_dir=args.certs_dir,
                hosts=args.host,
                kubectl=args.kubectl,
                access=access,
                client_ca=args.client_ca,
                single_node=args.single_node,
                mig_reshaping=args.mig_reshaping,
            )
            extras = described(
                access,
                client_ca=args.client_ca is not None,
                single_node=args.single_node,
                mig_reshaping=args.mig_reshaping,
            )
            wrote = f"wrote {out} ({overlay}, failurePolicy {failure_policy}{extras})"
    except RenderError as exc:
        print(f"render.py: error: {exc}", file=sys.stderr)
        return 1
    print(wrote)
    return 0


if __name__ == "__main__":
    sys.exit(main())
