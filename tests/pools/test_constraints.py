"""The constraints for a pool, from the members' and the other nodes' labels alone."""

from __future__ import annotations

from webhook.domain.affinity import DOES_NOT_EXIST, IN, NOT_IN, PoolConstraint, Requirement
from webhook.pools.constraints import Inseparable, Keys, Member, pool_constraint

PRODUCT, CLASS, STATE, REPLICAS = (
    "nvidia.com/gpu.product",
    "gpu.accelerator/class",
    "nvidia.com/mig.config.state",
    "nvidia.com/gpu.replicas",
)
KEYS = Keys(
    class_label=CLASS,
    classes=("low", "medium", "high"),
    gpu_class="medium",
    order=(STATE, REPLICAS, "nvidia.com/gpu.sharing-strategy", "nvidia.com/gpu.count", PRODUCT),
    exclusive={STATE: ("pending", "rebooting", "failed")},
)


def member(name: str, **labels: str) -> Member:
    """A node of the pool, pinned as webhook.pools.nodes pins it: its product, and its class when labelled."""
    pins = tuple(sorted((k, v) for k, v in labels.items() if k in (PRODUCT, CLASS, REPLICAS)))
    return Member(name, labels, pins)


def other(name: str, **labels: str) -> tuple[str, dict[str, str]]:
    return name, labels


def t4(**more: str) -> dict[str, str]:
    return {PRODUCT: "Tesla-T4", **more}


def test_a_pool_alone_is_pinned_by_its_shared_labels() -> None:
    """No other node could be reached: the nodeSelector alone, as it always was."""
    members = [member("a", **t4(**{CLASS: "medium"})), member("b", **t4(**{CLASS: "medium"}))]
    assert pool_constraint(members, [other("l4", **{PRODUCT: "NVIDIA-L4"})], KEYS) == PoolConstraint(
        ((CLASS, "medium"), (PRODUCT, "Tesla-T4"))
    )


def test_other_classes_of_the_product_are_left_out_by_not_in() -> None:
    """Labelled and unlabelled T4s are one medium pool; a T4 labelled high (and one with a label no class
    has) is left out by NotIn every other class and the values seen."""
    members = [member("a", **t4()), member("b", **t4(**{CLASS: "medium"}))]
    others = [other("h", **t4(**{CLASS: "high"})), other("x", **t4(**{CLASS: "superfast"}))]
    assert pool_constraint(members, others, KEYS) == PoolConstraint(
        ((PRODUCT, "Tesla-T4"),), (Requirement(CLASS, NOT_IN, ("high", "low", "superfast")),)
    )


def test_a_mig_layout_being_changed_is_left_out() -> None:
    """An H100 whose MIG layout is pending offers the same resource and product: every changing state is
    left out."""
    h100 = {PRODUCT: "NVIDIA-H100-80GB-HBM3", CLASS: "high"}
    keys = KEYS._replace(gpu_class="high")
    constraint = pool_constraint(
        [member("a", **h100, **{STATE: "success"})], [other("m", **h100, **{STATE: "pending"})], keys
    )
    assert constraint == PoolConstraint(
        ((CLASS, "high"), (PRODUCT, "NVIDIA-H100-80GB-HBM3")),
        (Requirement(STATE, NOT_IN, ("failed", "pending", "rebooting")),),
    )


def test_a_label_no_member_has_is_left_out_by_does_not_exist() -> None:
    """Whole T4s beside T4 replicas labelled only by their count: the count must not exist."""
    constraint = pool_constraint([member("a", **t4())], [other("s", **t4(**{REPLICAS: "4"}))], KEYS)
    assert constraint == PoolConstraint(((PRODUCT, "Tesla-T4"),), (Requirement(REPLICAS, DOES_NOT_EXIST),))


def test_members_with_several_values_are_in() -> None:
    """Replicas of 4 and 8 per GPU are one shared pool: the count is In both."""
    members = [member("a", **t4(**{REPLICAS: "4"})), member("b", **t4(**{REPLICAS: "8"}))]
    assert pool_constraint(members, [other("w", **t4())], KEYS) == PoolConstraint(
        ((PRODUCT, "Tesla-T4"),), (Requirement(REPLICAS, IN, ("4", "8")),)
    )


def test_a_node_no_label_tells_apart_makes_the_pool_inseparable() -> None:
    """A node identical to a member in every label that could tell them apart is named, and nothing is
    returned that would reach it."""
    found = pool_constraint([member("a", **t4())], [other("twin", **t4(zone="z"))], KEYS)
    assert found == Inseparable(("twin",))
    assert "twin" in found.reason
