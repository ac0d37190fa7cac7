"""Which Pods the webhook configurations must send to gpupool: the rule the matchConditions implement,
and Pods as the API server hands them to admission (shared with tests/test_validating_webhook.py).
"""

from __future__ import annotations

from tests.manifests.rendered import (
    Obj,
)
from webhook.domain.policy import default_policy_text, load_policy_text

MIRROR = "kubernetes.io/config.mirror"


def is_gpu_resource(name: str) -> bool:
    return name in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "amd.com/gpu") or name.startswith(
        ("nvidia.com/mig-", "huawei.com/Ascend")
    )


DEFAULT_POLICY = load_policy_text(default_policy_text())


def should_be_sent(obj: Obj) -> bool:
    """The rule the matchConditions implement, for a Pod CREATE in a namespace the namespaceSelector lets
    through: sent exactly when it is not a mirror Pod (annotation kubernetes.io/config.mirror) and it
    carries a gpupool.io/ annotation, or names a GPU resource (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*,
    amd.com/gpu, huawei.com/Ascend*) in the limits or requests of any container or init container, or
    has an env entry named NVIDIA_VISIBLE_DEVICES in any of them. spec.nodeName and DaemonSet owners
    make no difference."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    if MIRROR in annotations:
        return False
    spec = obj.get("spec") or {}
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    resources = [
        r for c in containers for part in ("limits", "requests") for r in c.get("resources", {}).get(part) or {}
    ]
    env_names = [e.get("name") for c in containers for e in c.get("env") or []]
    return (
        any(k.startswith("gpupool.io/") for k in annotations)
        or any(is_gpu_resource(r) for r in resources)
        or "NVIDIA_VISIBLE_DEVICES" in env_names
    )


def pod(  # noqa: PLR0913 (a test builder: each field a keyword)
    *,
    annotations: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    env: list[str] | None = None,
    init_limits: dict[str, str] | None = None,
    init_requests: dict[str, str] | None = None,
    init_env: list[str] | None = None,
    node_name: str | None = None,
    owner_kind: str | None = None,
) -> Obj:
    """A Pod as the API server hands it to admission: only fields that are set are present. `env` and
    `init_env` are the names of the containers' environment variables."""
    metadata: Obj = {"generateName": "job-", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if owner_kind is not None:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": "owner", "uid": "u1"}]

    def container(name: str, limits: Obj | None, requests: Obj | None, env: list[str] | None) -> Obj:
        resources: Obj = {}
        if limits is not None:
            resources["limits"] = limits
        if requests is not None:
            resources["requests"] = requests
        made: Obj = {"name": name, "image": "cuda:12", "resources": resources}
        if env is not None:
            made["env"] = [{"name": n, "value": "all"} for n in env]
        return made

    spec: Obj = {"containers": [container("main", limits, requests, env)]}
    if (init_limits, init_requests, init_env) != (None, None, None):
        spec["initContainers"] = [container("init", init_limits, init_requests, init_env)]
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
