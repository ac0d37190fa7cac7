"""Issue 10: whole GPUs, MIG instances and time-sliced replicas in one fleet. A Pod that names no device
gets whole GPUs, and whichever device a Pod with min-memory gets has at least that much memory.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests import scheduling
from tests.admission.demo import (
    apply,
    assert_feasible,
    demo_policy,
)
from tests.admission.podgen import (
    NAMESPACES,
    NODE_EDITS,
    NodeEdit,
    edited_fleet,
    pod_st,
)
from tests.builders import pod
from webhook.admission.core import evaluate
from webhook.admission.verdict import Verdict
from webhook.domain.quantity import MIB, parse_bytes
from webhook.pools.index import PoolIndex
from webhook.pools.nodes import NodeFacts
from webhook.sources.snapshot import build_index

# Each distinct fleet's index, built once for the module: evaluate only reads an index (and the memos it
# warms never change an answer, test_core_memo.py), and two fifths of the examples' edits give a fleet an
# earlier example had.
FLEETS: dict[bytes, PoolIndex] = {}


def fleet_index(objects: list[dict[str, Any]]) -> PoolIndex:
    key = orjson.dumps(objects)
    if key not in FLEETS:
        FLEETS[key] = build_index(objects, demo_policy(), "generated")
    return FLEETS[key]


def placed_in_edited_fleet(
    obj: dict[str, Any], namespace: str, edits: list[NodeEdit]
) -> tuple[Verdict, PoolIndex, list[dict[str, Any]]] | None:
    """The verdict for a Pod on the demo cluster changed by `edits`, with the index and the objects, when
    the Pod is placed with a patch; None otherwise (the outcome is recorded as a hypothesis event)."""
    objects = edited_fleet(edits)
    index = fleet_index(objects)
    result = evaluate(obj, namespace, demo_policy(), index)
    event(result.outcome)
    if result.placement is None or not result.patch:
        return None
    return result, index, objects


NO_DEVICE_DEFAULT = st.sampled_from(["ml-train", "team-a", "default"])  # students default to shared replicas


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=pod_st(), namespace=NO_DEVICE_DEFAULT, edits=st.lists(NODE_EDITS, max_size=12))
# Found in CI: T4s left to the product table (medium) beside a T4 labelled low; the product label alone
# reached the low node too.
@example(
    obj=pod(
        "job", annotations={"gpupool.io/device": "gpu", "gpupool.io/fallback": "true", "gpupool.io/gpu-class": "medium"}
    ),
    namespace="ml-train",
    edits=[(False, None, "remove", None), (False, None, "low", None)],
)
def test_a_pod_that_names_no_device_is_never_placed_on_a_mig_instance_or_a_shared_replica(
    obj: dict[str, Any], namespace: str, edits: list[NodeEdit]
) -> None:
    """Issue 10: whatever else a Pod asks for, in whatever fleet of whole GPUs, MIG instances and
    time-sliced replicas, a Pod that names no gpupool.io/device (in a namespace without a device default)
    and requests no MIG resource itself gets whole GPUs, through a nodeSelector that reaches no MIG
    instance and no replica."""
    annotations = obj["metadata"].get("annotations") or {}
    annotations.pop("gpupool.io/device", None)
    for container in [*obj["spec"]["containers"], *obj["spec"].get("initContainers", [])]:
        for part in ("limits", "requests"):
            for name in list((container.get("resources") or {}).get(part) or {}):
                if name.startswith("nvidia.com/mig-"):
                    del container["resources"][part][name]
    placed = placed_in_edited_fleet(obj, namespace, edits)
    if placed is None:
        return
    result, index, objects = placed
    assert result.placement is not None and result.placement.device == "gpu", str(result.placement)
    assert result.placement.resource in demo_policy().gpu_resources
    assert_feasible(result, apply(obj, result.patch), demo_policy(), index, objects, original=obj)


NO_EDIT: NodeEdit = (False, None, None, None)
FOUND: dict[str, Any] = {"namespace": "ml-train", "need": "4Gi", "devices": "shared,gpu", "gpu_class": None,
                         "count": None, "resource": None}  # fmt: skip
# Fleets where many nodes are partitioned: a time-sliced T4 in 2 replicas joins the demo's 4-replica one
# in one pool of two memory sizes, and whole GPUs become MIG instances.
DEVICE_FLEET_EDITS = st.tuples(
    st.just(False),
    st.none(),
    st.sampled_from([None, None, "remove", "medium"]),
    st.sampled_from([None, "time-sliced", "time-sliced", "mig-single", "mig-pending", "mig-invalid"]),
)
MEMORY_NEEDS = st.sampled_from(["1Gi", "3840Mi", "4Gi", "4864Mi", "5Gi", "12Gi", "16Gi", "20096Mi", "24Gi", "40Gi"])
DEVICE_LISTS = st.sampled_from(["mig,gpu", "shared,gpu", "gpu,mig,shared", "mig", "shared", "mig,shared"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    namespace=NAMESPACES,
    need=MEMORY_NEEDS,
    devices=st.none() | DEVICE_LISTS,
    gpu_class=st.sampled_from([None, "low", "medium", "high", "medium,high"]),
    count=st.sampled_from([None, "1", "2"]),
    resource=st.sampled_from([None, "nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb"]),
    edits=st.lists(DEVICE_FLEET_EDITS, min_size=1, max_size=19),
)
# gpu-t4-01 time-sliced 2 ways (7680Mi) beside the 4-way gpu-t4-shared-01 (3840Mi): one group of two sizes.
@example(**FOUND, edits=[*[NO_EDIT] * 12, (False, None, None, "time-sliced")])
# gpu-t4-02 time-sliced and unlabelled: its selector (the product label alone) reaches gpu-t4-shared-01 too.
@example(**FOUND, edits=[*[NO_EDIT] * 6, (False, None, "remove", "time-sliced")])
def test_the_chosen_devices_memory_is_never_below_min_memory(  # noqa: PLR0913 (hypothesis draws each value as a keyword)
    *,
    namespace: str,
    need: str,
    devices: str | None,
    gpu_class: str | None,
    count: str | None,
    resource: str | None,
    edits: list[NodeEdit],
) -> None:
    """Issue 10: a MIG instance has its own memory and a replica a share of its GPU's; whichever device a
    Pod with min-memory gets, in fleets where many GPUs are partitioned (time-sliced two and four ways in
    one pool, whole GPUs turned into MIG instances), every node its nodeSelector reaches offers at least
    that much per device (as sold: issue 30)."""
    annotations = {"gpupool.io/min-memory": need}
    for key, value in (("device", devices), ("gpu-class", gpu_class), ("gpu-count", count)):
        if value is not None:
            annotations[f"gpupool.io/{key}"] = value
    obj = pod(annotations=annotations, gpus=1 if resource else None, resource=resource or "nvidia.com/gpu")
    placed = placed_in_edited_fleet(obj, namespace, edits)
    if placed is None:
        return
    result, index, objects = placed
    assert result.placement is not None
    event(result.placement.device)
    patched = apply(obj, result.patch)
    wanted = -(-parse_bytes(need) // MIB)
    offering = [o for o in objects if o["kind"] == "Node" and scheduling.offers(o, result.placement.resource, 0)]
    for name in scheduling.reachable(patched, offering):
        facts = index.capacity.node_facts(name, result.placement.resource)
        assert isinstance(facts, NodeFacts), f"{name} is reached but offers no {result.placement.resource} pool"
        # Reported memory at least the value, or (issue 30) the size as sold, reported within 90% of it.
        as_sold = facts.sold_mib >= wanted and facts.memory_mib * 10 >= facts.sold_mib * 9
        assert facts.memory_mib >= wanted or as_sold, f"{facts.node}: {facts.memory_mib} MiB < {need}"
