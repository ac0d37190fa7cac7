"""The AdmissionReviews the soak sends: Pods of a mix of shapes, each with the answer it must get."""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.testing.synthetic import pod_spec_defaults


@dataclass(frozen=True)
class Shape:
    """A kind of Pod the load sends, and the answer it must get."""

    name: str
    weight: int
    annotations: dict[str, str]
    expect: str  # "mutated", "denied-400" or "denied-403"
    gpu_limit: int = 0  # nvidia.com/gpu in the container's limits
    node_selector: dict[str, str] = field(default_factory=dict)
    quota_namespace: bool = False  # sent to a namespace with a GPU ResourceQuota


SHAPES = (
    Shape("class medium, 1 GPU", 28, {"gpupool.io/gpu-class": "medium"}, "mutated"),
    Shape("GPU limit only, 1 GPU", 14, {}, "mutated", gpu_limit=1),
    Shape("min-memory 40Gi, 2 GPUs", 10, {"gpupool.io/min-memory": "40Gi", "gpupool.io/gpu-count": "2"}, "mutated"),
    Shape("product L4, 4 GPUs", 8, {"gpupool.io/gpu-product": "L4", "gpupool.io/gpu-count": "4"}, "mutated"),
    Shape("product H100, 8 GPUs", 5, {"gpupool.io/gpu-product": "H100", "gpupool.io/gpu-count": "8"}, "mutated"),
    Shape("class high, 4 GPUs", 6, {"gpupool.io/gpu-class": "high", "gpupool.io/gpu-count": "4"}, "mutated"),
    Shape(
        "medium,high with fallback, 2 GPUs",
        6,
        {"gpupool.io/gpu-class": "medium,high", "gpupool.io/gpu-count": "2", "gpupool.io/fallback": "true"},
        "mutated",
    ),
    Shape(
        "class medium, pinned to T4",
        7,
        {"gpupool.io/gpu-class": "medium"},
        "mutated",
        node_selector={"nvidia.com/gpu.product": "Tesla-T4"},
    ),
    Shape("min-memory 20Gi, 1 GPU", 10, {"gpupool.io/min-memory": "20Gi"}, "mutated"),
    Shape("malformed gpu-count (400)", 3, {"gpupool.io/gpu-count": "two"}, "denied-400"),
    Shape("product the cluster lacks (403)", 2, {"gpupool.io/gpu-product": "H20"}, "denied-403"),
    Shape(
        "64 GPUs over a namespace quota (403)", 1, {"gpupool.io/gpu-count": "64"}, "denied-403", quota_namespace=True
    ),
)
DRY_RUN_SHARE = 0.10


def pod_object(shape: Shape, namespace: str, rng: random.Random) -> dict[str, Any]:
    """A Pod as a ReplicaSet creates it (generateName, owner, defaults filled in by the API server's
    own admission plugins), about 1.5 KB of JSON."""
    app = re.sub(r"[^a-z0-9]+", "-", shape.name.lower()).strip("-")[:30]
    resources: dict[str, Any] = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
    if shape.gpu_limit:
        resources["limits"]["nvidia.com/gpu"] = str(shape.gpu_limit)
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": f"registry.example.com/{namespace}/{app}:v1.{rng.randrange(20)}.0",
                "command": ["python", "-m", "train"],
                "args": ["--config", "/etc/train/config.yaml"],
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "OMP_NUM_THREADS", "value": "8"}],
                "resources": resources,
                "volumeMounts": [{"name": "config", "mountPath": "/etc/train"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            },
            {
                "name": "log-shipper",
                "image": "registry.example.com/infra/fluent-bit:3.0",
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
            },
        ],
        "volumes": [{"name": "config", "configMap": {"name": f"{app}-config"}}],
        "restartPolicy": "Always",
        **pod_spec_defaults(),
    }
    if shape.node_selector:
        spec["nodeSelector"] = dict(shape.node_selector)
    template_hash = f"{rng.getrandbits(36):09x}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{app}-{template_hash}-",
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": template_hash},
            "annotations": dict(shape.annotations),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-{template_hash}",
                    "uid": str(uuid.UUID(int=rng.getrandbits(128))),
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
            ],
        },
        "spec": spec,
    }


def review_body(pod: dict[str, Any], uid: str, dry_run: bool) -> bytes:
    """The AdmissionReview kube-apiserver sends for a Pod creation."""
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": pod["metadata"]["namespace"],
                "userInfo": {
                    "username": "system:serviceaccount:kube-system:replicaset-controller",
                    "uid": "5b7c9a1e-0000-4000-8000-000000000001",
                    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
                },
                "object": pod,
                "oldObject": None,
                "dryRun": dry_run,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
    )


@dataclass(frozen=True)
class Request:
    uid: str
    body: bytes
    pod: dict[str, Any]
    shape: str
    expect: str
    dry_run: bool


class RequestMaker:
    """Requests of the shape mix, each with its own uid, in namespaces without (or, for the quota shape,
    with) a GPU ResourceQuota."""

    def __init__(self, quotas: list[dict[str, Any]], namespaces: list[str], seed: int) -> None:
        self._rng = random.Random(seed)
        # Every form of a GPU quota gpupool enforces: `requests.`, and the bare and `limits.` forms that
        # Kubernetes stores but only gpupool enforces. A namespace under any of them fills up and denies.
        forms = {f"{prefix}nvidia.com/gpu" for prefix in ("requests.", "", "limits.")}
        limited = {q["metadata"]["namespace"] for q in quotas if forms & set(q.get("spec", {}).get("hard") or {})}
        self.free = sorted(ns for ns in namespaces if ns not in limited and ns.startswith(("team-", "ml-")))
        self.limited = sorted(limited)
        self._weights = [s.weight for s in SHAPES]

    def next(self) -> Request:
        rng = self._rng
        shape = rng.choices(SHAPES, self._weights)[0]
        namespace = rng.choice(self.limited if shape.quota_namespace else self.free)
        pod = pod_object(shape, namespace, rng)
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        dry_run = rng.random() < DRY_RUN_SHARE
        return Request(uid, review_body(pod, uid, dry_run), pod, shape.name, shape.expect, dry_run)
