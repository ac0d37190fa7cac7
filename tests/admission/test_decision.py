"""The decision: candidates, ranking, fallback, no-capacity handling, quotas, and why pools were passed."""

from __future__ import annotations

from typing import Any

from tests.builders import GPU_TAINT, fleet, gpu_node, index_of, issue_fleet, mig_mixed_node, pod, policy
from webhook.admission.choice import ADMIT, choose
from webhook.admission.decision import Decision
from webhook.admission.misses import product_distance
from webhook.admission.pod import read_pod
from webhook.admission.request import parse_request
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex

POLICY = policy()
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
L4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
A100 = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")
H100 = PoolKey("nvidia", "high", "NVIDIA-H100-80GB-HBM3")
RTX = PoolKey("nvidia", "low", "NVIDIA-GeForce-RTX-4090")


def run(
    annotations: dict[str, str] | None,
    objects: list[dict[str, Any]] | None = None,
    pol: Policy = POLICY,
    namespace: str = "ml",
    index: PoolIndex | None = None,
    **kw: Any,
) -> Decision:
    index = index or index_of(objects if objects is not None else fleet(), pol)
    view = read_pod(pod(annotations=annotations, namespace=namespace, **kw), namespace)
    return choose(parse_request(view.shape, pol), view, index, pol, ADMIT).decision


def chosen(decision: Decision) -> PoolKey | None:
    return decision.chosen.pool if decision.chosen else None


def test_least_capable_fitting_pool_wins_without_a_class() -> None:
    """Any class: the lowest class first, so a plain GPU Pod does not take an H100."""
    assert chosen(run({"gpupool.io/gpu-count": "1"})) == RTX


def test_min_memory_goes_to_the_smallest_card_that_fits() -> None:
    """20Gi lands on a 24 GB card, not an 80 GB one."""
    d = run({"gpupool.io/min-memory": "20Gi", "gpupool.io/gpu-class": "medium,high"})
    assert chosen(d) == L4
    assert chosen(run({"gpupool.io/min-memory": "20Gi"})) == RTX  # 4090 has 24 GB too, and is low


def test_requested_class_order_is_the_preference_order() -> None:
    """`high,medium` prefers high although medium is less capable."""
    assert chosen(run({"gpupool.io/gpu-class": "high,medium"})) == A100
    assert chosen(run({"gpupool.io/gpu-class": "medium,high"})) == T4


def test_within_a_class_memory_then_free_gpus_then_name() -> None:
    """Same class: less memory first; equal memory: more free GPUs first; then the product name."""
    pol = policy("products: [{match: T4G, class: medium}, {match: T4, class: medium}]")
    t4g = PoolKey("nvidia", "medium", "NVIDIA-T4G")
    objects = [gpu_node("t4-a", "Tesla-T4", 2), gpu_node("t4-b", "Tesla-T4", 2), gpu_node("x", "NVIDIA-T4G", 4)]
    assert chosen(run({"gpupool.io/gpu-class": "medium"}, objects, pol)) == t4g  # 4 free each: by name
    objects.append(gpu_node("t4-c", "Tesla-T4", 2))
    assert chosen(run({"gpupool.io/gpu-class": "medium"}, objects, pol)) == T4  # 6 free beat 4
    objects[2] = gpu_node("x", "NVIDIA-T4G", 1, memory_mib=8192)
    assert chosen(run({"gpupool.io/gpu-class": "medium"}, objects, pol)) == t4g  # less memory first


def test_gpus_must_be_free_on_one_node() -> None:
    """Two nodes with 2 free GPUs each do not fit a 4-GPU Pod."""
    objects = [
        gpu_node("t4-a"),
        gpu_node("t4-b"),
        pod("x", gpus=2, node="t4-a", phase="Running"),
        pod("y", gpus=2, node="t4-b", phase="Running"),
    ]
    d = run({"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": "4"}, objects)
    assert d.chosen is not None and not d.chosen.fits
    assert d.warnings == ("gpupool: no Tesla-T4 node has 4 free GPUs now; the Pod will wait",)


def test_no_capacity_deny_policy_denies() -> None:
    """onNoCapacity: deny refuses instead of pinning the Pod to wait."""
    objects = [gpu_node("t4-a"), pod("x", gpus=4, node="t4-a", phase="Running")]
    d = run({"gpupool.io/gpu-class": "medium"}, objects, policy("defaults: {onNoCapacity: deny}"))
    assert d.chosen is None and d.denial_reason == "no-capacity"
    assert "no capacity" in d.denial and "onNoCapacity is deny" in d.denial


def test_fallback_goes_up_in_class_order_only_when_allowed() -> None:
    """A full medium class falls back to high only with fallback true, with a warning."""
    objects = [
        *fleet(),
        pod("a", gpus=4, node="t4-a", phase="Running"),
        pod("b", gpus=4, node="t4-b", phase="Running"),
        pod("c", gpus=4, node="l4-a", phase="Running"),
    ]
    stuck = run({"gpupool.io/gpu-class": "medium"}, objects)
    assert chosen(stuck) in (T4, L4) and stuck.chosen is not None and not stuck.chosen.fits
    moved = run({"gpupool.io/gpu-class": "medium", "gpupool.io/fallback": "true"}, objects)
    assert chosen(moved) == A100
    assert moved.warnings and "fell back to class high" in moved.warnings[0]
    assert all(len(w) <= 120 for w in moved.warnings)


def test_fallback_never_goes_down_or_outside_the_namespace() -> None:
    """Fallback only climbs to classes the namespace allows."""
    pol = policy("namespaces: {ml: {allowedClasses: [low, medium]}}")
    objects = [
        *fleet(),
        pod("a", gpus=4, node="t4-a", phase="Running"),
        pod("b", gpus=4, node="t4-b", phase="Running"),
        pod("c", gpus=4, node="l4-a", phase="Running"),
    ]
    d = run({"gpupool.io/gpu-class": "medium", "gpupool.io/fallback": "true"}, objects, pol)
    assert chosen(d) in (T4, L4) and d.chosen is not None and not d.chosen.fits


def test_no_matching_pool_denies_with_nearest_reasons() -> None:
    """Nothing matches: the message says why for the nearest pools."""
    d = run({"gpupool.io/gpu-product": "A100", "gpupool.io/min-memory": "80Gi"})
    assert d.chosen is None and d.denial_reason == "no-match"
    assert "NVIDIA-A100-SXM4-40GB" in d.denial and "40Gi < min-memory 80Gi" in d.denial


# --- the nearest pools: what a "no GPU pool matches" denial shows ----------------------------------------


def test_the_nearest_pools_fail_the_fewest_requirements_each_with_all_it_lacks() -> None:
    """Class medium with 40Gi: the A100 and H100 lack only their class and the L4 only memory, so they are
    the nearest; the RTX 4090 lacks both its class and memory, so it is not among them, and explain says
    both (not only the first found)."""
    d = run({"gpupool.io/gpu-class": "medium", "gpupool.io/min-memory": "40Gi"})
    assert d.denial == (
        "no GPU pool matches the Pod: NVIDIA-A100-SXM4-40GB: class high not in medium (annotation); "
        "NVIDIA-H100-80GB-HBM3: class high not in medium (annotation); NVIDIA-L4: 24Gi as sold "
        "(23034Mi reported) < min-memory 40Gi"
    )
    assert (
        f"{RTX}: rejected: class low not in medium (annotation); 24Gi as sold (24564Mi reported) < min-memory 40Gi"
        in d.explain(d.chosen)
    )


def test_the_nearest_pools_for_a_product_the_cluster_lacks_are_of_its_family() -> None:
    """`H20` on a fleet without one: every pool lacks the one product token, but the H100 and H200 have
    a token of its family (H), so only they are the nearest, each saying what it lacks; the A100, T4 and
    RTX 4090 are not named."""
    h200 = gpu_node("h200-a", "NVIDIA-H200", 8, memory_mib=143771, gpu_class="high")
    d = run({"gpupool.io/gpu-product": "H20"}, [*fleet(), h200])
    assert d.denial == (
        "no GPU pool matches the Pod: NVIDIA-H100-80GB-HBM3: product NVIDIA-H100-80GB-HBM3 does not match "
        "gpupool.io/gpu-product H20; NVIDIA-H200: product NVIDIA-H200 does not match gpupool.io/gpu-product H20"
    )


def test_a_product_token_lacking_counts_more_than_one_of_the_same_family() -> None:
    """`A100-80GB` lacks one token on the A100-40GB and on the H100-80GB, so both are as near (ties in
    pool order); `A10` is nearer an A100 (same family) than an L4; of a list, the nearest counts."""
    assert product_distance((("a100", "80gb"),), ("a100", "sxm4", "40gb")) == 2
    assert product_distance((("a100", "80gb"),), ("h100", "80gb", "hbm3")) == 2
    assert product_distance((("a10",),), ("a100", "sxm4", "40gb")) < product_distance((("a10",),), ("l4",))
    assert product_distance((("80gb", "a100"),), ("a100", "80gb")) == 1  # every token, out of order
    assert product_distance((("b200",), ("h20",)), ("h100", "80gb", "hbm3")) == 1  # the nearest of a list


def test_pools_of_devices_the_pod_does_not_take_come_last() -> None:
    """A whole-GPU Pod asking for a MIG profile's name: the MIG pool lacks only its device kind, fewer
    than the whole A100 and T4 lack, yet those are the nearest shown (the MIG pool is explained)."""
    d = run({"gpupool.io/gpu-product": "MIG-1g.5gb"}, issue_fleet())
    assert d.denial == (
        "no GPU pool matches the Pod: NVIDIA-A100-SXM4-40GB: product NVIDIA-A100-SXM4-40GB does not match "
        "gpupool.io/gpu-product MIG-1g.5gb; Tesla-T4: product Tesla-T4 does not match gpupool.io/gpu-product "
        "MIG-1g.5gb"
    )
    assert f"{MIG_1G}: rejected: device mig not in gpu (policy default)" in d.explain(d.chosen)


def test_product_tokens_are_exact() -> None:
    """`H100` picks the H100 pool; `A10` matches no A100."""
    assert chosen(run({"gpupool.io/gpu-product": "H100"})) == H100
    d = run({"gpupool.io/gpu-product": "A10"})
    assert d.chosen is None and "does not match gpupool.io/gpu-product A10" in d.denial


def test_min_driver_must_hold_on_every_node_of_the_pool() -> None:
    """The scheduler may pick any node the selector reaches, so the oldest driver decides."""
    objects = [gpu_node("t4-a", driver="535.104.05"), gpu_node("t4-b", driver="525.60.13")]
    d = run({"gpupool.io/min-driver": "530"}, objects)
    assert d.chosen is None and "driver 525.60.13 < min-driver 530" in d.denial
    assert chosen(run({"gpupool.io/min-driver": "525.60"}, objects)) == T4
    unknown = run({"gpupool.io/min-driver": "500"}, [gpu_node("t4-a", driver=None)])
    assert unknown.chosen is None and "driver version unknown" in unknown.denial


def test_existing_nodeselector_is_honoured_and_contradiction_denied() -> None:
    """A Pod pinned to T4 by hand stays on T4; asking for high on top of that is a contradiction."""
    pinned = {"nvidia.com/gpu.product": "Tesla-T4"}
    assert chosen(run({"gpupool.io/gpu-count": "1"}, node_selector=pinned)) == T4
    d = run({"gpupool.io/gpu-class": "high"}, node_selector=pinned)
    assert d.chosen is None and "nodeSelector nvidia.com/gpu.product=Tesla-T4 excludes it" in d.denial


def test_class_label_pin_does_not_reach_unlabelled_nodes() -> None:
    """A nodeSelector on the class label cannot land on nodes classed only by the product table."""
    d = run(
        None,
        [gpu_node("h", "NVIDIA-H100-80GB-HBM3", gpu_class=None)],
        gpus=1,
        node_selector={"gpu.accelerator/class": "high"},
    )
    assert d.chosen is None and "nodeSelector gpu.accelerator/class=high excludes it" in d.denial


def test_untolerated_taints_exclude_nodes_gpu_taints_do_not() -> None:
    """GPU taints from the policy are gpupool's to tolerate; other taints are the Pod's."""
    tainted = [
        gpu_node("l4-a", "NVIDIA-L4", taints=[{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}])
    ]
    d = run({"gpupool.io/gpu-class": "medium"}, tainted)
    assert d.chosen is None and "taints the Pod does not tolerate: dedicated=inference:NoSchedule" in d.denial
    ok = run(
        {"gpupool.io/gpu-class": "medium"},
        tainted,
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}],
    )
    assert chosen(ok) == L4
    gpu = run(
        {"gpupool.io/gpu-class": "high"}, [gpu_node("a", "NVIDIA-A100-SXM4-40GB", gpu_class="high", taints=[GPU_TAINT])]
    )
    assert chosen(gpu) == A100 and gpu.chosen is not None and gpu.chosen.gpu_taints


def test_not_ready_and_cordoned_nodes_offer_nothing() -> None:
    """A pool of only unusable nodes is a match without capacity."""
    d = run({"gpupool.io/gpu-class": "medium"}, [gpu_node("a", ready=False), gpu_node("b", unschedulable=True)])
    assert d.chosen is not None and not d.chosen.fits and d.chosen.max_free == 0


def test_vendor_default_and_explicit() -> None:
    """A Pod that names no vendor never lands on an NPU; `vendor: ascend` does."""
    objects = [
        gpu_node("npu", gpu_class=None, resource="huawei.com/Ascend910", labels={"accelerator": "huawei-Ascend910"})
    ]
    d = run({"gpupool.io/gpu-count": "1"}, objects)
    assert d.chosen is None and "no nvidia GPU pools" in d.denial
    assert chosen(run({"gpupool.io/vendor": "ascend"}, objects)) == PoolKey("ascend", "high", "huawei-Ascend910")


def test_pool_annotation_pins_the_pool() -> None:
    """A Pod already placed by gpupool keeps its pool on re-invocation."""
    d = run({"gpupool.io/pool": str(A100)})
    assert chosen(d) == A100


def test_class_quota_excludes_classes_over_their_limit() -> None:
    """team-a may hold 4 high GPUs: a fifth is denied naming the limit; with medium allowed it goes there."""
    pol = policy("namespaces: {team-a: {classQuota: {high: 4}}}")
    objects = [
        *fleet(),
        pod(
            "r", namespace="team-a", gpus=4, node="a100-a", phase="Running", annotations={"gpupool.io/pool": str(A100)}
        ),
    ]
    d = run({"gpupool.io/gpu-class": "high"}, objects, pol, namespace="team-a")
    assert d.chosen is None and d.denial_reason == "class-quota"
    assert d.denial == "class quota high in namespace team-a exceeded: used 4 + requested 1 > hard 4"
    assert chosen(run({"gpupool.io/gpu-class": "high,medium"}, objects, pol, namespace="team-a")) == T4


def test_every_pool_is_judged_with_a_reason() -> None:
    """explain lists every pool of the vendor, chosen or rejected, with why."""
    d = run({"gpupool.io/gpu-class": "medium", "gpupool.io/min-memory": "20Gi"})
    lines = d.explain(d.chosen)
    assert any(line.startswith(f"{L4}: chosen") for line in lines)
    assert any(
        line.startswith(f"{T4}: rejected") and "16Gi as sold (15Gi reported) < min-memory 20Gi" in line
        for line in lines
    )
    assert any(line.startswith(f"{A100}: rejected") and "class high not in medium" in line for line in lines)
    assert len(lines) == 5


def test_pool_whose_nodes_are_all_too_small_is_not_a_place_to_wait() -> None:
    """An 8-GPU Pod never waits on 4-GPU nodes: that pool is rejected saying how large its nodes are."""
    objects = [
        gpu_node("t4-a"),
        gpu_node("a", "NVIDIA-A100-SXM4-40GB", 8, gpu_class="high"),
        pod("x", gpus=8, node="a", phase="Running"),
    ]
    d = run({"gpupool.io/gpu-count": "8"}, objects)
    assert chosen(d) == A100 and d.chosen is not None and not d.chosen.fits
    assert any("no node has 8 GPUs (the largest has 4)" in line for line in d.explain(d.chosen))
    too_big = run({"gpupool.io/gpu-count": "16"}, objects)
    assert too_big.chosen is None and "no node has 16 GPUs" in too_big.denial


# --- devices: whole GPUs, MIG instances, shared replicas ---------------------------------------------------

MIG_1G = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
MIG_3G = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/mig-3g.20gb")
T4_SHARED = PoolKey("nvidia", "medium", "Tesla-T4-SHARED")


def test_a_pod_that_names_no_device_gets_a_whole_gpu_not_a_slice() -> None:
    """The issue's first case: class high goes to a whole 40 GB A100, not to a 5 GB MIG slice (the least
    capable "node group" of the old folded pool)."""
    d = run({"gpupool.io/gpu-class": "high"}, issue_fleet())
    assert chosen(d) == A100
    assert any(
        line.startswith(f"{MIG_1G}: rejected") and "device mig not in gpu" in line for line in d.explain(d.chosen)
    )


def test_a_pod_that_names_no_device_is_not_given_a_shared_replica() -> None:
    """The issue's second case: class medium goes to the dedicated T4, though the replicas have more free."""
    assert chosen(run({"gpupool.io/gpu-class": "medium"}, issue_fleet())) == T4


def test_device_kinds_are_tried_in_the_order_given() -> None:
    """`shared,gpu`: the replicas first; when they are taken, the whole T4."""
    assert (
        chosen(run({"gpupool.io/gpu-class": "medium", "gpupool.io/device": "shared,gpu"}, issue_fleet())) == T4_SHARED
    )
    full = [*issue_fleet(), pod("x", gpus=4, node="ts-a", phase="Running")]
    assert chosen(run({"gpupool.io/gpu-class": "medium", "gpupool.io/device": "shared,gpu"}, full)) == T4


def test_min_memory_with_mig_first_takes_the_smallest_instance_that_is_big_enough() -> None:
    """The issue's example: 16Gi with `mig,gpu` lands on a 3g.20gb (the 1g.5gb is too small), and on a
    whole GPU only when no instance that size is free: the T4, sold as 16 GB (issue 30)."""
    annotations = {"gpupool.io/min-memory": "16Gi", "gpupool.io/device": "mig,gpu"}
    d = run(annotations, issue_fleet())
    assert chosen(d) == MIG_3G and d.chosen is not None and d.chosen.resource == "nvidia.com/mig-3g.20gb"
    full = [*issue_fleet(), pod("x", gpus=2, node="mixed-a", phase="Running", resource="nvidia.com/mig-3g.20gb")]
    assert chosen(run(annotations, full)) == T4


def test_the_chosen_devices_memory_is_a_share_of_a_shared_gpu() -> None:
    """A replica of a 16 GB T4 (15 GiB reported) time-sliced 4 ways is a quarter of it, 4 GB as sold:
    min-memory 4Gi takes it, 5Gi passes it over."""
    assert chosen(run({"gpupool.io/device": "shared", "gpupool.io/min-memory": "4Gi"}, issue_fleet())) == T4_SHARED
    d = run({"gpupool.io/device": "shared", "gpupool.io/min-memory": "5Gi"}, issue_fleet())
    assert d.chosen is None and "Tesla-T4-SHARED: 4Gi as sold (3840Mi reported) < min-memory 5Gi" in d.denial


def test_product_tokens_match_device_products() -> None:
    """`3g.20gb` names the profile; it never matches a whole GPU."""
    assert chosen(run({"gpupool.io/gpu-product": "3g.20gb", "gpupool.io/device": "mig,gpu"}, issue_fleet())) == MIG_3G


def test_a_multi_gpu_pod_skips_shared_pools_in_a_list() -> None:
    """`shared,gpu` with 2 GPUs: replicas are passed over saying why; the whole GPUs are tried."""
    d = run({"gpupool.io/gpu-count": "2", "gpupool.io/device": "shared,gpu"}, issue_fleet())
    assert chosen(d) == A100
    assert any(
        line.startswith(f"{T4_SHARED}: rejected") and "a shared replica is not a GPU" in line
        for line in d.explain(d.chosen)
    )


def test_explain_says_what_a_device_is() -> None:
    """Memory is per GPU, per MIG instance or per replica, as the pool's devices are."""
    d = run({"gpupool.io/device": "mig,shared,gpu"}, issue_fleet())
    lines = d.explain(d.chosen)
    assert any(
        line.startswith(f"{MIG_1G}: chosen") and "5Gi as sold (4864Mi reported) per MIG instance" in line
        for line in lines
    )
    assert any(
        line.startswith(str(T4_SHARED)) and "4Gi as sold (3840Mi reported) per replica" in line for line in lines
    )
    assert any(line.startswith(str(A100)) and "40Gi per GPU" in line for line in lines)


def test_a_nodeselector_on_a_mig_product_label_is_honoured() -> None:
    """Two pools of one MIG resource (A100-80GB and H100 1g.10gb): the Pod's own nodeSelector on the
    profile's product label keeps it on that product; the other is excluded, not overwritten."""
    objects = [
        mig_mixed_node("a-80", "NVIDIA-A100-SXM4-80GB", whole=0, instances={"1g.10gb": (7, 9856)}),
        mig_mixed_node("h-80", "NVIDIA-H100-80GB-HBM3", whole=0, instances={"1g.10gb": (7, 9856)}),
    ]
    pinned = {"nvidia.com/mig-1g.10gb.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"}
    d = run(None, objects, gpus=1, resource="nvidia.com/mig-1g.10gb", node_selector=pinned)
    assert d.chosen is not None and d.chosen.pool.product == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert any("nodeSelector nvidia.com/mig-1g.10gb.product=NVIDIA-H100-80GB-HBM3-MIG-1g.10gb excludes it" in r
               for r in d.explain(d.chosen))  # fmt: skip


def test_min_compute_capability_needs_it_on_every_node_and_unknown_never_matches() -> None:
    """8.0: the T4s (7.5, from the product table) are passed over; a product whose capability no label
    or table entry gives never matches, and explain says why."""
    d = run({"gpupool.io/min-compute-capability": "8.0", "gpupool.io/gpu-class": "medium,high"}, issue_fleet())
    assert chosen(d) == A100
    assert any(line.startswith(f"{T4}: rejected") and "compute capability 7.5 < min-compute-capability 8.0" in line
               for line in d.explain(d.chosen))  # fmt: skip
    unknown = run({"gpupool.io/min-compute-capability": "6.0"}, [gpu_node("q", "Quadro-P2000", gpu_class="low")])
    assert unknown.chosen is None
    assert "compute capability unknown on some nodes (min-compute-capability 6.0)" in unknown.denial


def test_min_cuda_holds_on_every_node_the_selector_reaches() -> None:
    """12.4 needs a 550 driver: a T4 pool with one 535 node (CUDA 12.2 by NVIDIA's table) is passed over,
    as min-driver would be; a node's own CUDA label is believed."""
    objects = [gpu_node("t4-a", driver="550.54.15"), gpu_node("t4-b", driver="535.104.05")]
    d = run({"gpupool.io/min-cuda": "12.4"}, objects)
    assert d.chosen is None and "CUDA 12.2 < min-cuda 12.4" in d.denial
    labelled = [gpu_node("t4-a", driver="535.104.05", labels={"nvidia.com/cuda.runtime-version.full": "12.4"})]
    assert chosen(run({"gpupool.io/min-cuda": "12.4"}, labelled)) == T4


def test_requirements_hold_on_the_labelled_nodes_a_shorter_selector_reaches_too() -> None:
    """A T4 pool of unlabelled nodes (pinned by the product label alone) and class-labelled ones: the
    product label reaches the labelled nodes too, so min-driver must hold on them as well (found by the
    min-memory property test with time-sliced nodes of two replica counts)."""
    objects = [
        gpu_node("t4-new", driver="550.54.15", gpu_class=None),
        gpu_node("t4-old", driver="525.60.13", gpu_class="medium"),
    ]
    d = run({"gpupool.io/min-driver": "545"}, objects)
    assert d.chosen is None and "driver 525.60.13 < min-driver 545" in d.denial


def test_a_half_labelled_product_is_placed_with_the_other_classes_left_out() -> None:
    """T4 nodes the product table makes medium, beside a T4 node labelled high: the medium pool is
    placed (not refused), its constraint the product label plus the class label `NotIn` every other
    class, which the unlabelled nodes satisfy and the high node does not."""
    pol = policy("namespaces:\n  students:\n    allowedClasses: [low, medium]\n")
    mixed = [gpu_node("t4-a", gpu_class=None), gpu_node("t4-reserved", gpu_class="high")]
    d = run({"gpupool.io/gpu-class": "medium"}, mixed, pol, namespace="students")
    assert d.chosen is not None and d.chosen.pool == T4
    assert d.chosen.constraint.text() == ("nvidia.com/gpu.product=Tesla-T4, gpu.accelerator/class notin (high,low)")
    labelled = [gpu_node("t4-a", gpu_class="medium"), gpu_node("t4-reserved", gpu_class="high")]
    placed = run({"gpupool.io/gpu-class": "medium"}, labelled, pol, namespace="students")
    assert placed.chosen is not None and placed.chosen.pool == T4
    assert placed.chosen.constraint.text() == "gpu.accelerator/class=medium, nvidia.com/gpu.product=Tesla-T4"


def test_whole_gpus_beside_unsuffixed_replicas_leave_the_replicas_out() -> None:
    """Replicas labelled by hand (a replica count, no -SHARED product) beside whole T4s: the whole GPUs'
    pool is the product label without the replica count, and the replicas' pool the product with it."""
    shared = gpu_node("t4-shared", gpus=8, gpu_class=None, labels={"nvidia.com/gpu.replicas": "2"})
    d = run({"gpupool.io/gpu-class": "medium"}, [gpu_node("t4-a", gpu_class=None), shared])
    assert d.chosen is not None and d.chosen.pool == PoolKey("nvidia", "medium", "Tesla-T4")
    assert d.chosen.constraint.text() == "nvidia.com/gpu.product=Tesla-T4, !nvidia.com/gpu.replicas"
    replica = run({"gpupool.io/device": "shared"}, [gpu_node("t4-a", gpu_class=None), shared])
    assert replica.chosen is not None and replica.chosen.pool.product == "Tesla-T4-SHARED"
    assert replica.chosen.constraint.text() == "nvidia.com/gpu.product=Tesla-T4, nvidia.com/gpu.replicas=2"
