"""The demo inventory and the end-to-end checks of a patch, shared by the core's tests (test_core_*.py).

Every patch is applied to the original Pod with a real RFC 6902 engine (jsonpatch) and, where kubectl
is installed, with `kubectl patch --local` (the Go library kube-apiserver uses); the patched Pod must
validate against the Kubernetes 1.29 Pod schema and evaluate again to an empty patch, as a
reinvoked webhook must. The sample Pods of examples/pods/ are checked against the demo inventory
(examples/cluster.yaml, examples/policy.yaml) for the outcome a user cares about; expectations come
from the rules of issue 2 and the demo data, not from the code's output.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from referencing import Registry, Resource

from tests import scheduling
from webhook.admission.core import evaluate
from webhook.admission.verdict import Verdict
from webhook.domain.policy import Policy, load_policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_gpu_requests
from webhook.sources.snapshot import build_index, parse_objects

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SAMPLES = EXAMPLES / "pods"
K8S_VERSION = "1.29"
POOL_KEY = "gpupool.io/pool"

T4 = "nvidia/medium/Tesla-T4"
T4_SHARED = "nvidia/medium/Tesla-T4-SHARED"
L4 = "nvidia/medium/NVIDIA-L4"
A100 = "nvidia/high/NVIDIA-A100-SXM4-40GB"
A100_3G = "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb"
A100_1G_MIXED = "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-1g.5gb/nvidia.com/mig-1g.5gb"
A100_1G_SINGLE = "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
RTX3060 = "nvidia/low/NVIDIA-GeForce-RTX-3060"
RTX4090 = "nvidia/low/NVIDIA-GeForce-RTX-4090"
H100 = "nvidia/high/NVIDIA-H100-80GB-HBM3"


# --- the demo inventory ----------------------------------------------------------------------------------


@functools.cache
def demo_policy() -> Policy:
    return load_policy(str(EXAMPLES / "policy.yaml"))


@functools.cache
def _demo_objects() -> tuple[Mapping[str, Any], ...]:
    path = EXAMPLES / "cluster.yaml"
    return tuple(parse_objects(path.read_text("utf-8"), str(path)))


def demo_index() -> PoolIndex:
    """A fresh index of the demo cluster (evaluate only reads it; Admitter tests get their own)."""
    return build_index(list(_demo_objects()), demo_policy(), "examples/cluster.yaml")


@functools.cache
def shared_demo_index() -> PoolIndex:
    """One index for the read-only tests (hypothesis runs hundreds of examples against it)."""
    return demo_index()


def load_sample(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((SAMPLES / name).read_text("utf-8"))
    assert isinstance(loaded, dict)
    return loaded


# --- applying and checking patches -----------------------------------------------------------------------


def apply(obj: Mapping[str, Any], patch: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> dict[str, Any]:
    """The Pod after the patch, by a real RFC 6902 engine; the original is left as it was."""
    patched = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), list(patch))
    assert isinstance(patched, dict)
    return patched


def validate_pod(obj: Mapping[str, Any]) -> None:
    """The Pod is valid for the Kubernetes 1.29 schema, strictly (no unknown fields)."""
    error = jsonschema.exceptions.best_match(_pod_validator().iter_errors(dict(obj)))
    if error is not None:
        where = ".".join(str(p) for p in error.path)
        raise AssertionError(f"patched Pod is not a valid 1.29 Pod: {where}: {error.message}")


@functools.cache
def _pod_validator() -> Any:
    """The validator `kubernetes_validate.validate(pod, "1.29", strict=True)` checks a v1 Pod with, built once:
    that function reads the Pod schema and every definition from disk and builds its validator on each
    call, three tenths of the placement property test."""
    utils = kubernetes_validate.utils
    version = [v for v in utils.all_versions() if utils.major_minor(v) <= K8S_VERSION][-1]
    directory = f"kubernetes-json-schema/v{version}-local-strict"
    schema = utils.schema_contents(f"{directory}/pod-v1.json", version)
    definitions = utils.schema_contents(f"{directory}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def kubectl_patch(obj: Mapping[str, Any], patch: list[dict[str, Any]], workdir: Path) -> dict[str, Any]:
    """The Pod after `kubectl patch --local --type=json`: the JSON patch code kube-apiserver runs."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH; the RFC 6902 check with kube-apiserver's library is skipped")
    path = workdir / "pod.json"
    path.write_text(json.dumps(obj), "utf-8")
    argv = [kubectl, "patch", "--local", "-f", str(path), "--type=json", "-p", json.dumps(patch), "-o", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"kubectl patch failed: {proc.stderr}"
    out = json.loads(proc.stdout)
    assert isinstance(out, dict)
    return out


def assert_feasible(
    result: Verdict,
    patched: Mapping[str, Any],
    policy: Policy,
    index: PoolIndex,
    objects: list[Mapping[str, Any]],
    *,
    original: Mapping[str, Any] | None = None,
) -> None:
    """Where the scheduler may put the patched Pod (tests/scheduling.py, Kubernetes' rules): among the
    nodes that offer its device resource, exactly the chosen pool's nodes that the Pod itself (`original`,
    before the patch) allowed — never a node of another pool, one gpupool does not pool (a MIG layout
    being applied) or one the Pod's own constraints exclude — and among those some that could run it
    (enough of the resource, every blocking taint tolerated)."""
    placement = result.placement
    assert placement is not None
    requests = pod_gpu_requests(patched["spec"], policy.gpu_resources, policy.partition_prefixes)
    assert set(requests) == {placement.resource}, f"the Pod requests {requests}, its pool {placement.resource}"
    offering = [o for o in objects if o["kind"] == "Node" and scheduling.offers(o, placement.resource, 0)]
    reached = scheduling.reachable(patched, offering)
    members = {n.name for n in index.capacity.members(placement.pool)}
    wanted = members & scheduling.reachable(original, offering) if original is not None else members
    constraint = placement.constraint.text()
    assert reached <= members, f"{sorted(reached - members)} are reached by {constraint} but not in {placement.pool}"
    assert reached == wanted, (
        f"{constraint} reaches {sorted(reached)}, the pool's nodes the Pod allows are {sorted(wanted)}"
    )
    runnable = [
        n
        for n in offering
        if n["metadata"]["name"] in reached
        and scheduling.offers(n, placement.resource, placement.pod_total)
        and scheduling.tolerated(patched, n)
    ]
    assert runnable, f"no node reached by {constraint} can run {placement.pod_total} x {placement.resource}"


def pod_count(node: Mapping[str, Any], resource: str) -> int:
    return int((node.get("status") or {}).get("allocatable", {}).get(resource, 0))


def check_placed(
    obj: Mapping[str, Any],
    namespace: str,
    policy: Policy,
    index: PoolIndex,
    objects: list[Mapping[str, Any]] | None = None,
) -> tuple[Verdict, dict[str, Any]]:
    """Evaluate a Pod that must be placed; check its patch end to end (and where it can run, on the
    demo cluster unless `objects` says otherwise) and return the patched Pod."""
    original = copy.deepcopy(dict(obj))
    result = evaluate(obj, namespace, policy, index)
    assert obj == original, "evaluate changed the Pod it was given"
    assert result.allowed, result.message
    assert result.placement is not None
    assert result.patch, "a placed Pod that did not carry the placement must get a patch"
    patched = apply(obj, result.patch)
    validate_pod(patched)
    fleet = objects if objects is not None else list(_demo_objects())
    assert_feasible(result, patched, policy, index, fleet, original=original)
    assert patched["metadata"]["annotations"][POOL_KEY] == str(result.placement.pool)
    again = evaluate(patched, namespace, policy, index)
    assert again.allowed, again.message
    assert again.patch == ()
    assert again.placement is not None and again.placement.pool == result.placement.pool
    return result, patched


def target_limits(patched: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    limits = patched["spec"]["containers"][index]["resources"]["limits"]
    assert isinstance(limits, Mapping)
    return limits


# --- the sample Pods of examples/pods/ on the demo inventory ---------------------------------------------
#
# The demo cluster, as far as these tests need it (examples/cluster.yaml):
#   T4 (medium label, 15360 MiB, driver 535): gpu-t4-01 2 free, gpu-t4-02 2 free (a Succeeded Pod holds
#     nothing), and a Pending Pod pinned to the T4 pool takes one of those; gpu-t4-03 is NotReady.
#   L4 (medium, 23034 MiB): tainted dedicated=inference, which no sample Pod tolerates.
#   A100-40GB (high label, taint nvidia.com/gpu=present): gpu-a100-01 2 free, gpu-a100-02 7 free,
#     gpu-a100-03 cordoned.  H100-80GB (GFD labels only, so high by the product table): 0 free, driver 550.
#   RTX 3060 (no class label, so low; 12288 MiB, legacy driver labels 525): 1 free.
#   RTX 4090 (low label, 24564 MiB, driver 545): 1 free.  AMD MI250X: 6 free.  Ascend 910: 8 free.
#   team-a: ResourceQuota gpu-quota requests.nvidia.com/gpu hard 4, used 3; default class medium.
#   students: default class low.  ml-train: no rule, every class.


def sample_verdict(name: str) -> tuple[dict[str, Any], Verdict]:
    obj = load_sample(name)
    namespace = obj["metadata"].get("namespace", "default")
    return obj, evaluate(obj, namespace, demo_policy(), shared_demo_index())


def placed_sample(name: str) -> tuple[dict[str, Any], Verdict, dict[str, Any]]:
    obj = load_sample(name)
    result, patched = check_placed(obj, obj["metadata"]["namespace"], demo_policy(), shared_demo_index())
    return obj, result, patched
