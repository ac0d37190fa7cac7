"""`gpupool.io/min-memory` is met by memory as cards are sold (issue 30 item 1): GPU Feature Discovery
reports a little under the size a card is sold as, and a Pod asking for that size must still get it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.admission.demo import REPO, check_placed, demo_index, demo_policy
from tests.builders import gpu_node, index_of, pod, policy
from webhook.admission.choice import ADMIT, choose
from webhook.admission.core import evaluate
from webhook.admission.decision import Decision
from webhook.admission.pod import read_pod
from webhook.admission.request import parse_request

POLICY = policy()


def decide(annotations: dict[str, str], objects: list[dict[str, Any]], **kw: Any) -> Decision:
    view = read_pod(pod(annotations=annotations, **kw), "ml")
    return choose(parse_request(view.shape, POLICY), view, index_of(objects, POLICY), POLICY, ADMIT).decision


def chosen_product(decision: Decision) -> str | None:
    return decision.chosen.pool.product if decision.chosen else None


# The cards, as GFD labels them: (product, class, memory reported, the min-memory meant).
CARDS = [
    pytest.param("NVIDIA-L4", "medium", 23034, "24Gi", id="L4-24Gi"),
    pytest.param("NVIDIA-A10", "medium", 23028, "24Gi", id="A10-24Gi"),
    pytest.param("NVIDIA-GeForce-RTX-4090", "low", 24564, "24Gi", id="RTX-4090-24Gi"),
    pytest.param("Tesla-T4", "medium", 15360, "16Gi", id="T4-16Gi"),
    pytest.param("NVIDIA-H100-80GB-HBM3", "high", 81559, "80Gi", id="H100-80Gi"),
]


@pytest.mark.parametrize(("product", "gpu_class", "reported", "need"), CARDS)
def test_the_size_a_card_is_sold_as_reaches_it(product: str, gpu_class: str, reported: int, need: str) -> None:
    """`min-memory: 24Gi` lands on a 24 GB card reporting 23034 MiB; `16Gi` on a T4; `80Gi` on an H100."""
    node = gpu_node("n", product, 4, memory_mib=reported, gpu_class=gpu_class)
    assert chosen_product(decide({"gpupool.io/min-memory": need}, [node])) == product


def test_the_h100_named_with_80gi_is_placed_not_refused() -> None:
    """The issue's `gpu-product: H100` with `min-memory: 80Gi`, refused before as `81559Mi < 80Gi`."""
    node = gpu_node("h", "NVIDIA-H100-80GB-HBM3", 8, memory_mib=81559, gpu_class="high")
    d = decide({"gpupool.io/gpu-product": "H100", "gpupool.io/min-memory": "80Gi"}, [node])
    assert chosen_product(d) == "NVIDIA-H100-80GB-HBM3", d.denial


def test_25gi_never_lands_on_a_24gb_card_and_the_denial_shows_both_figures() -> None:
    """A 24 GB card is 24 GB, however close its report: 25Gi is refused, naming sold and reported."""
    nodes = [
        gpu_node("l4", "NVIDIA-L4", 4, memory_mib=23034),
        gpu_node("a10", "NVIDIA-A10", 4, memory_mib=23028),
        gpu_node("rtx", "NVIDIA-GeForce-RTX-4090", 1, memory_mib=24564, gpu_class="low"),
    ]
    d = decide({"gpupool.io/min-memory": "25Gi"}, nodes)
    assert d.chosen is None
    assert "24Gi as sold (23034Mi reported) < min-memory 25Gi" in d.denial


def test_equal_sold_sizes_rank_the_older_architecture_first() -> None:
    """An 80 GB A100 (compute 8.0, reporting more) before an 80 GB H100 (9.0) of the same class."""
    nodes = [
        gpu_node("a100", "NVIDIA-A100-SXM4-80GB", 8, memory_mib=81920, gpu_class="high"),
        gpu_node("h100", "NVIDIA-H100-80GB-HBM3", 8, memory_mib=81559, gpu_class="high"),
    ]
    d = decide({"gpupool.io/gpu-class": "high", "gpupool.io/min-memory": "80Gi"}, nodes)
    assert [c.pool.product for c in d.candidates] == ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]


def test_explain_shows_memory_as_sold_and_as_reported() -> None:
    node = gpu_node("h", "NVIDIA-H100-80GB-HBM3", 8, memory_mib=81559, gpu_class="high")
    obj = pod(annotations={"gpupool.io/min-memory": "80Gi"})
    result = evaluate(obj, "ml", POLICY, index_of([node], POLICY), explain=True)
    assert result.allowed
    assert any("80Gi as sold (81559Mi reported) per GPU" in r for r in result.reasons), result.reasons


def test_a_bare_number_under_a_gib_is_refused_with_the_unit_it_surely_meant() -> None:
    """`min-memory: "24"` was 24 bytes, and the Pod landed on a 12 GB card without a word."""
    nodes = [gpu_node("rtx", "NVIDIA-GeForce-RTX-3060", 1, memory_mib=12288, gpu_class="low")]
    result = evaluate(pod(annotations={"gpupool.io/min-memory": "24"}), "ml", POLICY, index_of(nodes, POLICY))
    assert not result.allowed and result.code == 400
    assert "annotation gpupool.io/min-memory: '24' is 24 bytes; did you mean 24Gi?" in result.message
    assert "accepted:" in result.message


@pytest.mark.parametrize("value", ["24Mi", "25769803776", "1Gi"])
def test_a_unit_or_a_number_of_a_gib_and_more_is_taken_as_written(value: str) -> None:
    nodes = [gpu_node("rtx", "NVIDIA-GeForce-RTX-3060", 1, memory_mib=12288, gpu_class="low")]
    result = evaluate(pod(annotations={"gpupool.io/min-memory": value}), "ml", POLICY, index_of(nodes, POLICY))
    assert result.code != 400, result.message


def test_a_pod_on_its_own_node_meets_min_memory_as_sold() -> None:
    """A Pod that names its node is checked there by the same rule: 24Gi on an L4 passes."""
    node = gpu_node("l4", "NVIDIA-L4", 4, memory_mib=23034)
    obj = pod(annotations={"gpupool.io/min-memory": "24Gi"}, gpus=1, node="l4")
    assert evaluate(obj, "ml", POLICY, index_of([node], POLICY)).allowed
    obj = pod(annotations={"gpupool.io/min-memory": "25Gi"}, gpus=1, node="l4")
    result = evaluate(obj, "ml", POLICY, index_of([node], POLICY))
    assert not result.allowed and "24Gi as sold (23034Mi reported) < min-memory 25Gi" in result.message


def readme_first_annotations() -> dict[str, str]:
    """The annotations of the README's first example, as the README shows them."""
    text = (REPO / "README.md").read_text("utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    annotations = yaml.safe_load(block)["metadata"]["annotations"]
    assert annotations["gpupool.io/min-memory"] == "24Gi"
    return {k: str(v) for k, v in annotations.items()}


def test_the_readmes_first_pod_lands_on_a_24gb_card_of_the_demo() -> None:
    """README's first example (medium, 24Gi, 2 GPUs) on the demo inventory of examples/: its one medium
    24 GB pool is the L4 node, dedicated to inference by a taint the Pod tolerates here."""
    toleration = {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
    obj = pod("first", "ml-train", annotations=readme_first_annotations(), tolerations=[toleration])
    result, _ = check_placed(obj, "ml-train", demo_policy(), demo_index())
    assert result.placement is not None and str(result.placement.pool) == "nvidia/medium/NVIDIA-L4"


def test_a_first_24gi_pod_of_any_class_lands_on_the_demos_24gb_rtx_4090() -> None:
    obj = pod("first", "ml-train", annotations={"gpupool.io/min-memory": "24Gi"})
    result, _ = check_placed(obj, "ml-train", demo_policy(), demo_index())
    assert result.placement is not None and str(result.placement.pool) == "nvidia/low/NVIDIA-GeForce-RTX-4090"
