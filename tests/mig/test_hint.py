"""The admission hint: whether a layout gpupool may choose, on an opted-in node, could serve the Pod."""

from __future__ import annotations

from tests.mig.configs import A100_40, A100_80
from tests.mig.planning import GI, LAYOUTS, node
from webhook.mig.hint import Recut, recut_could_serve
from webhook.mig.planner import Waiting


def test_a_35gi_pod_could_get_a_3g40gb_of_a_re_cut_node() -> None:
    fleet = [node("busy", busy=True), node("off", opted_in=False)]
    assert recut_could_serve(Waiting("t/p", 35 * GI), fleet, LAYOUTS) == Recut("busy", "all-3g.40gb", "3g.40gb", 40192)


def test_never_on_a_node_not_opted_in_or_failed_nor_past_what_any_layout_holds() -> None:
    assert recut_could_serve(Waiting("t/p", 35 * GI), [node("off", opted_in=False)], LAYOUTS) is None
    assert recut_could_serve(Waiting("t/p", 35 * GI), [node("f", state="failed")], LAYOUTS) is None
    assert recut_could_serve(Waiting("t/p", 90 * GI), [node("a")], LAYOUTS) is None  # 7g.80gb: 79 GiB
    assert recut_could_serve(Waiting("t/p", 8 * GI, count=5), [node("a", A100_40, 1)], LAYOUTS) is None


def test_the_pods_models_and_nodes_are_honoured() -> None:
    fleet = [node("a100-80", A100_80), node("a100-40", A100_40, 1)]
    only_40 = Waiting("t/p", 30 * GI, models=frozenset({"A100-40GB"}))
    assert recut_could_serve(only_40, fleet, LAYOUTS) == Recut(
        "a100-40", "all-7g.40gb", "7g.40gb", 37001
    )  # an estimate
    assert recut_could_serve(Waiting("t/p", 30 * GI, nodes=frozenset({"elsewhere"})), fleet, LAYOUTS) is None


def test_a_40gi_pod_could_get_the_3g40gb_it_names_not_a_whole_7g80gb() -> None:
    """`min-memory: 40Gi` is met by the instance sold as 40 GB (40192 MiB reported; issue 30)."""
    assert recut_could_serve(Waiting("t/p", 40 * GI), [node("a")], LAYOUTS) == Recut(
        "a", "all-3g.40gb", "3g.40gb", 40192
    )
