"""The scratch kustomization that stacks an overlay with the components and patches asked for (pure text).

What it patches is the base's (manifests/base/): the constants below name what the patches expect there,
and every patch starts with `test` operations so that a changed base fails the render instead of being
patched in the wrong place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import RenderError

# The Service the certificate must name; kube-apiserver connects to <service>.<namespace>.svc.
SERVICE = "gpupool-webhook"
NAMESPACE = "gpupool-system"
# The image the base Deployment names; kustomize's `images:` entries match it by name.
IMAGE_NAME = "ghcr.io/gpupool/gpupool-webhook"
CLIENT_CA_FILE = "client-ca.crt"  # the --client-ca copy, next to the scratch kustomization
# Who may reach the health port by default (manifests/base/networkpolicy.yaml): Prometheus' namespace.
METRICS_NAMESPACES = ("monitoring",)
# What the base's namespaceSelector leaves out by name (manifests/base/webhook.yaml), and its label.
EXCLUDED_BY_DEFAULT = ("kube-system", NAMESPACE, "gpu-operator")
IGNORE_LABEL = "gpupool.io/ignore"
# The label kube-prometheus-stack selects PodMonitors and PrometheusRules by (`release: <its Helm release>`),
# as manifests/components/monitoring sets it.
PROMETHEUS_RELEASE = "kube-prometheus-stack"
# The webhook configurations (manifests/base/webhook.yaml, validating-webhook.yaml), one webhook each.
WEBHOOK_CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
_HEADER = ("apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization")


@dataclass(frozen=True)
class Access:
    """Who may reach the two ports and which namespaces are left out: the options `make manifests` and
    `make release` share (the Makefile's ACCESS_OPTIONS). The defaults are the base's."""

    control_plane_cidrs: tuple[str, ...] = ()
    metrics_namespaces: tuple[str, ...] = ()
    health_cidrs: tuple[str, ...] = ()
    exclude_namespaces: tuple[str, ...] = ()
    ignore_label: bool = True

    @property
    def metrics_readers(self) -> tuple[str, ...]:
        """The namespaces the health port admits by name, each once (empty: the base's)."""
        return tuple(dict.fromkeys(self.metrics_namespaces))

    @property
    def health_ranges(self) -> tuple[str, ...]:
        """The address ranges the health port admits besides, each once."""
        return tuple(dict.fromkeys(self.health_cidrs))

    @property
    def also_excluded(self) -> tuple[str, ...]:
        """The namespaces left out besides the base's, each once."""
        return tuple(n for n in dict.fromkeys(self.exclude_namespaces) if n not in EXCLUDED_BY_DEFAULT)


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


def _op(op: str, path: str, value: str | None = None) -> list[str]:
    """One JSON patch operation as the lines of a YAML list item; `value` is written as given (YAML)."""
    lines = [f"- op: {op}", f"  path: {path}"]
    return lines if value is None else [*lines, f"  value: {value}"]


def _ip_blocks(cidrs: Iterable[str]) -> list[str]:
    """NetworkPolicy peers (flow-style YAML) for `cidrs`."""
    return [f"{{ipBlock: {{cidr: {json.dumps(cidr)}}}}}" for cidr in cidrs]


def namespace_selector_patch(access: Access) -> list[str]:
    """JSON patch lines (for the patch of each webhook configuration) that leave out the namespaces of
    `access` by name, besides the base's, and drop the gpupool.io/ignore label unless it is honoured.
    Empty when both are the base's."""
    if not access.also_excluded and access.ignore_label:
        return []
    selector = "/webhooks/0/namespaceSelector/matchExpressions"
    ops = _op("test", f"{selector}/0/key", "kubernetes.io/metadata.name")
    for name in access.also_excluded:
        ops += _op("add", f"{selector}/0/values/-", json.dumps(name))
    if not access.ignore_label:
        ops += _op("test", f"{selector}/1/key", IGNORE_LABEL) + _op("remove", f"{selector}/1")
    return ops


def network_policy_patch(access: Access) -> list[str]:
    """JSON patch lines for the NetworkPolicy: the health port (8080) admits the metrics namespaces by
    name (instead of the base's) and the health ranges (the nodes, for a CNI that polices the kubelet's
    probes); the webhook port (8443) only the control-plane ranges, if given. Empty when all are the base's."""
    rule = "/spec/ingress/1"
    ops = []
    names = access.metrics_readers
    if names and names != METRICS_NAMESPACES:
        match = f"{rule}/from/0/namespaceSelector/matchExpressions/0"
        ops += _op("test", f"{match}/key", "kubernetes.io/metadata.name")
        ops += _op("replace", f"{match}/values", json.dumps(list(names)))
    for block in _ip_blocks(access.health_ranges):
        ops += _op("add", f"{rule}/from/-", block)
    if ops:
        ops = _op("test", f"{rule}/ports/0/port", "8080") + ops
    if access.control_plane_cidrs:
        ops += _op("replace", "/spec/ingress/0/from", f"[{', '.join(_ip_blocks(access.control_plane_cidrs))}]")
    return ops


def _patch(kind: str, ops: list[str]) -> list[str]:
    """A `patches:` entry applying the JSON patch `ops` to the base's object of `kind`."""
    return [f"  - target: {{kind: {kind}, name: gpupool-webhook}}", "    patch: |-", *(f"      {op}" for op in ops)]


def _components(names: Iterable[str]) -> list[str]:
    return [f"  - ../manifests/components/{name}" for name in names]


def stacked_kustomization(  # noqa: PLR0913 (the render command's choices, the components by keyword)
    overlay: str,
    failure_policy: str,
    image: str | None,
    access: Access,
    *,
    client_ca: bool = False,
    single_node: bool = False,
    mig_reshaping: bool = False,
) -> str:
    """A kustomization, placed next to the copy of manifests/, that renders `overlay` as asked.

    Paths are relative because kustomize refuses absolute resource paths. With `client_ca`, the
    ConfigMap the client-ca component mounts is generated from CLIENT_CA_FILE next to it.
    """
    lines = [*_HEADER, "resources:", f"  - ../manifests/overlays/{overlay}"]
    wanted = {
        "failure-policy-ignore": failure_policy == "Ignore",
        "single-node": single_node,
        "mig-reshaping": mig_reshaping,
        "client-ca": client_ca,
        "webhook-port-from-control-plane": bool(access.control_plane_cidrs),
    }
    if components := [name for name, asked in wanted.items() if asked]:
        lines += ["components:", *_components(components)]
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
    if policy := network_policy_patch(access):
        patches += _patch("NetworkPolicy", policy)
    if selector := namespace_selector_patch(access):
        for kind in WEBHOOK_CONFIGURATIONS:  # both leave out the same namespaces
            patches += _patch(kind, selector)
    if patches:
        lines += ["patches:", *patches]
    return "\n".join(lines) + "\n"


def component_kustomization(name: str) -> str:
    """A kustomization that renders the component `name` alone, for a release file of its own."""
    return "\n".join([*_HEADER, "components:", *_components([name])]) + "\n"


def monitoring_kustomization(prometheus_release: str = PROMETHEUS_RELEASE) -> str:
    """A kustomization that renders the monitoring component alone (it ships apart from the install), its
    PodMonitor and PrometheusRule labelled `release: <prometheus_release>`."""
    lines = component_kustomization("monitoring").splitlines()
    if prometheus_release != PROMETHEUS_RELEASE:
        ops = _op("test", "/metadata/labels/release", PROMETHEUS_RELEASE)
        ops += _op("replace", "/metadata/labels/release", json.dumps(prometheus_release))
        lines += [
            "patches:",
            "  - target: {group: monitoring.coreos.com}",
            "    patch: |-",
            *(f"      {op}" for op in ops),
        ]
    return "\n".join(lines) + "\n"
