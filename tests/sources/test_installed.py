"""Where the webhook's Deployment reads its policy from (webhook.sources.installed.locate_policy): the
file `serve` is told (`--policy` wins over GPUPOOL_POLICY), the mount that holds it, the ConfigMap and
the key. Reading them from a cluster is tested through `kubectl gpupool` (tests/commands/test_kubectl.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.sources.installed import NotLocated, PolicyLocation, locate_policy

REPO = Path(__file__).resolve().parents[2]


def base() -> dict[str, Any]:
    """manifests/base/deployment.yaml, in its namespace, its volume's ConfigMap renamed as an older install
    named it (kustomize's hash suffix; the shipped name is gpupool-policy), so the name is read, not assumed."""
    deployment: dict[str, Any] = yaml.safe_load((REPO / "manifests" / "base" / "deployment.yaml").read_text())
    deployment["metadata"]["namespace"] = "gpupool-system"
    for volume in deployment["spec"]["template"]["spec"]["volumes"]:
        if "configMap" in volume:
            volume["configMap"]["name"] = "gpupool-policy-7b9g2hd5mt"
    return deployment


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return found


def test_the_shipped_deployment_reads_its_configmaps_policy_yaml() -> None:
    assert locate_policy(base()) == PolicyLocation("gpupool-system", "gpupool-policy-7b9g2hd5mt", "policy.yaml")


def test_the_policy_flag_wins_over_the_variable_as_in_serve() -> None:
    deployment = base()
    spec = deployment["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "other", "configMap": {"name": "other-policy"}})
    container(deployment)["volumeMounts"].append({"name": "other", "mountPath": "/etc/other"})
    container(deployment)["args"] = ["--policy", "/etc/other/mine.yaml"]
    assert locate_policy(deployment) == PolicyLocation("gpupool-system", "other-policy", "mine.yaml")
    container(deployment)["args"] = ["--policy=/etc/other/x.yaml"]
    assert locate_policy(deployment) == PolicyLocation("gpupool-system", "other-policy", "x.yaml")


def test_items_and_sub_paths_map_the_file_to_its_key() -> None:
    """`items` renames keys to paths; a subPath mount puts one key at the mount path."""
    deployment = base()
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "policy"]
    volume["configMap"]["items"] = [{"key": "gpu-policy", "path": "policy.yaml"}]
    assert locate_policy(deployment) == PolicyLocation("gpupool-system", "gpupool-policy-7b9g2hd5mt", "gpu-policy")
    deployment = base()
    mount = next(m for m in container(deployment)["volumeMounts"] if m["name"] == "policy")
    mount.update(mountPath="/etc/gpupool/policy/policy.yaml", subPath="rules.yaml")
    assert locate_policy(deployment) == PolicyLocation(
        "gpupool-system", "gpupool-policy-7b9g2hd5mt", "rules.yaml", sub_path=True
    )


def test_a_webhook_told_no_policy_runs_the_built_in_default() -> None:
    deployment = base()
    container(deployment)["env"] = [e for e in container(deployment)["env"] if e["name"] != "GPUPOOL_POLICY"]
    assert locate_policy(deployment) is None


def reshaped(change: str) -> dict[str, Any]:
    deployment = copy.deepcopy(base())
    spec = deployment["spec"]["template"]["spec"]
    policy_env = next(e for e in container(deployment)["env"] if e["name"] == "GPUPOOL_POLICY")
    if change == "secret":
        (volume,) = [v for v in spec["volumes"] if v["name"] == "policy"]
        volume.pop("configMap")
        volume["secret"] = {"secretName": "policy"}
    elif change == "not-mounted":
        policy_env["value"] = "/srv/policy.yaml"
    elif change == "value-from":
        policy_env.pop("value")
        policy_env["valueFrom"] = {"configMapKeyRef": {"name": "x", "key": "y"}}
    elif change == "relative":
        policy_env["value"] = "policy.yaml"
    elif change == "no-containers":
        spec["containers"] = []
    elif change == "hostile":
        deployment["spec"] = {"template": {"spec": {"containers": "nope", "volumes": 5}}}
    return deployment


@pytest.mark.parametrize(
    "change, why",
    [
        ("secret", "on volume 'policy', a secret volume, not a ConfigMap"),
        ("not-mounted", "its policy file /srv/policy.yaml is on no volume"),
        ("value-from", "its GPUPOOL_POLICY comes from valueFrom"),
        ("relative", "relative to the image's working directory"),
        ("no-containers", "its Pod template has no container"),
        ("hostile", "its Pod template has no container"),
    ],
)
def test_what_cannot_be_located_says_why(change: str, why: str) -> None:
    with pytest.raises(NotLocated, match=why):
        locate_policy(reshaped(change))
