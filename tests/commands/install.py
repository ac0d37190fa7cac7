"""gpupool as `manifests/base` installs it, for the commands that read the installed policy (`kubectl
gpupool explain|quota|queue` find the webhook's Deployment and its policy ConfigMap)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "examples" / "policy.yaml"


def installed(configmap: str = "gpupool-policy") -> list[dict[str, Any]]:
    """The webhook's Deployment as manifests/base/deployment.yaml has it, in gpupool-system, its policy
    volume naming `configmap` (the shipped name; an older install's had kustomize's hash suffix), and that
    ConfigMap with the demo policy."""
    deployment: dict[str, Any] = yaml.safe_load((REPO / "manifests" / "base" / "deployment.yaml").read_text())
    deployment["metadata"]["namespace"] = "gpupool-system"
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    volume["configMap"]["name"] = configmap
    data = {"policy.yaml": POLICY.read_text()}
    meta = {"name": configmap, "namespace": "gpupool-system"}
    return [deployment, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}]
