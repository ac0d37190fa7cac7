"""A patch piece by piece (webhook.admission.pieces): the Pod the queue's index counts once a release is
applied is the Pod kube-apiserver stores once the release's JSON Patch is applied, whatever the Pod had
already (nodeSelector, node-affinity terms, tolerations, annotations, other gates)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import pod
from webhook.admission.patch import PatchSpec, build_patch, release_patch
from webhook.admission.pieces import PodPatch, ResourcesAdded, patched_info
from webhook.admission.pod import read_pod
from webhook.domain.affinity import PoolConstraint, Requirement
from webhook.domain.model import QUEUE_GATE, Taint
from webhook.pools.kubeobj import pod_from_obj

RESOURCES = ["nvidia.com/gpu"]
KEYS = ["gpu.accelerator/class", "nvidia.com/gpu.product", "zone"]
VALUES = ["high", "low", "Tesla-T4", "NVIDIA-L4", "a"]
TAINTS = [Taint("nvidia.com/gpu", "present", "NoSchedule"), Taint("gpu", "", ""), Taint("zone", "a", "NoExecute")]

selectors = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
requirements = st.builds(
    Requirement,
    st.sampled_from(KEYS),
    st.sampled_from(["In", "NotIn"]),
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True).map(tuple),
)
tolerations = st.lists(
    st.fixed_dictionaries({"key": st.sampled_from(["nvidia.com/gpu", "gpu", "other"]), "operator": st.just("Exists")}),
    max_size=2,
)
terms = st.lists(
    st.one_of(
        st.just({}),  # a term with no requirement (matches no node: left as it is)
        st.lists(requirements, min_size=1, max_size=2).map(lambda rs: {"matchExpressions": [r.as_json() for r in rs]}),
        st.just({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}),
    ),
    min_size=1,
    max_size=3,
)


@st.composite
def queued_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod behind gpupool's gate (maybe another gate before it), with or without each thing a release adds to."""
    annotations = draw(st.sampled_from([None, {}, {"gpupool.io/pool": "nvidia/low/Tesla-T4"}, {"team": "a"}]))
    obj = pod(
        annotations=annotations,
        gpus=draw(st.integers(1, 4)),
        node_selector=draw(st.none() | selectors),
        tolerations=draw(st.none() | tolerations),
    )
    obj["metadata"]["resourceVersion"] = "7"  # as the API stores it
    obj["spec"]["schedulingGates"] = [{"name": g} for g in draw(st.sampled_from([[QUEUE_GATE], ["x", QUEUE_GATE]]))]
    affinity = draw(st.sampled_from(["none", "empty", "node", "terms"]))
    if affinity == "empty":
        obj["spec"]["affinity"] = {}
    elif affinity == "node":
        obj["spec"]["affinity"] = {"nodeAffinity": {}}
    elif affinity == "terms":
        required = {"nodeSelectorTerms": draw(terms)}
        obj["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    return obj


specs = st.builds(
    PatchSpec,
    constraint=st.builds(
        PoolConstraint,
        selectors.map(lambda s: tuple(sorted(s.items()))),
        st.lists(requirements, max_size=2).map(tuple),
    ),
    gpu_taints=st.lists(st.sampled_from(TAINTS), max_size=2, unique=True).map(tuple),
    container_index=st.just(0),
    resource=st.just("nvidia.com/gpu"),
    gpus=st.just(0),
    pool=st.just("nvidia/medium/Tesla-T4"),
)


@given(obj=queued_pods(), spec=specs)
def test_a_released_pod_is_counted_as_the_api_stores_it(obj: dict[str, Any], spec: PatchSpec) -> None:
    """The index's view of a released Pod is the release patch applied to the Pod as the index counted it,
    and it is the very Pod the API stores once the patch's ops are applied: no second account of what
    the release adds."""
    info = pod_from_obj(obj, RESOURCES)
    assert info is not None and info.queued
    patch = release_patch(read_pod(obj).shape, spec, "7")
    stored = jsonpatch.apply_patch(copy.deepcopy(obj), list(patch.ops))
    assert patched_info(info, patch) == pod_from_obj(stored, RESOURCES)


def test_a_patch_that_sets_resources_is_not_applied_to_an_existing_pod() -> None:
    """Kubernetes allows no change to an existing Pod's resources, so neither does the index's view of one."""
    obj = pod(annotations={}, gpus=None)
    spec = PatchSpec(PoolConstraint(), (), 0, "nvidia.com/gpu", 2, "nvidia/medium/Tesla-T4")
    patch = build_patch(read_pod(obj).shape, spec)
    assert any(isinstance(p, ResourcesAdded) for p in patch.pieces)
    info = pod_from_obj(pod(annotations={}, gpus=1), RESOURCES)
    assert info is not None
    with pytest.raises(ValueError, match="cannot set the limits of container main"):
        patched_info(info, patch)
    assert patched_info(info, PodPatch()) == info
