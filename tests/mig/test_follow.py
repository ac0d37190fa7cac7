"""Following a change gpupool asked for: done only when GFD shows the new layout, stuck after the bound."""

from __future__ import annotations

from tests.mig.configs import A100_80
from tests.mig.planning import LAYOUTS
from webhook.mig.follow import (
    DONE,
    FAILED,
    IN_FLIGHT,
    STUCK,
    SUPERSEDED,
    Asked,
    done_late,
    shows,
    status,
    stuck_hold,
)

THREE_G = LAYOUTS.usable(A100_80, 2)["all-3g.40gb"]
MIXED = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.product": A100_80}


def at(now: float, **kw: object) -> str:
    fields: dict[str, object] = {"label": "all-3g.40gb", "state": "success", "shown": False}
    fields.update(kw)
    return status(Asked("all-3g.40gb", 1000.0), now=now, timeout_seconds=900.0, **fields)  # type: ignore[arg-type]


def test_success_is_done_only_once_the_labels_show_the_layout() -> None:
    # mig-manager has not noticed yet: the state is the last change's success.
    assert at(1010.0) == IN_FLIGHT
    assert at(1020.0, state="pending") == IN_FLIGHT
    assert at(1200.0, shown=True) == DONE


def test_failed_stuck_and_superseded() -> None:
    assert at(1100.0, state="failed") == FAILED
    assert at(1901.0, state="pending") == STUCK  # older mig-managers stay pending forever
    assert at(1901.0) == STUCK  # success, but GFD never showed the layout
    assert at(1100.0, label="all-1g.10gb") == SUPERSEDED  # an admin changed it again


def test_the_mixed_strategy_shows_instances_as_allocatable_per_profile() -> None:
    assert shows(THREE_G, MIXED, {"nvidia.com/mig-3g.40gb": 4, "nvidia.com/gpu": 0})
    assert not shows(THREE_G, MIXED, {"nvidia.com/mig-1g.10gb": 14})  # the old layout
    assert not shows(THREE_G, MIXED, {"nvidia.com/mig-3g.40gb": 4, "nvidia.com/mig-1g.10gb": 7})
    assert not shows(THREE_G, MIXED, {"nvidia.com/mig-3g.40gb": 2})  # one GPU still being re-cut


def test_the_single_strategy_shows_one_profile_in_the_product() -> None:
    single = {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": f"{A100_80}-MIG-3g.40gb"}
    assert shows(THREE_G, single, {"nvidia.com/gpu": 4})
    assert not shows(THREE_G, {**single, "nvidia.com/gpu.product": f"{A100_80}-MIG-1g.10gb"}, {"nvidia.com/gpu": 4})
    balanced = LAYOUTS.usable(A100_80, 1)["all-balanced"]
    assert not shows(balanced, single, {"nvidia.com/gpu": 4})  # several profiles cannot be single


STUCK_NODE = {
    **MIXED,
    "nvidia.com/gpu.count": "2",
    "nvidia.com/mig.config": "all-3g.40gb",
    "nvidia.com/mig.config.state": "success",
}
WRITTEN_STUCK = {
    "gpupool.io/mig-reshape-asked": "all-3g.40gb@2026-12-01T10:00:00Z",
    "gpupool.io/mig-reshape-outcome": "stuck@2026-12-01T10:05:01Z",
}
OLD_LAYOUT = {"nvidia.com/mig-1g.10gb": 14}
NEW_LAYOUT = {"nvidia.com/mig-3g.40gb": 4, "nvidia.com/gpu": 0}


def test_a_change_written_stuck_holds_the_node_while_its_label_names_a_layout_it_does_not_show() -> None:
    """mig-manager acts only on a change of the label's value: asking again would be stuck again."""
    held = stuck_hold(WRITTEN_STUCK, STUCK_NODE, OLD_LAYOUT, LAYOUTS)
    assert "all-3g.40gb was stuck" in held and "labels another nvidia.com/mig.config" in held
    assert not done_late(WRITTEN_STUCK, STUCK_NODE, OLD_LAYOUT, LAYOUTS)
    pending = {**STUCK_NODE, "nvidia.com/mig.config.state": "pending"}
    assert stuck_hold(WRITTEN_STUCK, pending, NEW_LAYOUT, LAYOUTS)  # shown, but mig-manager not done


def test_the_hold_ends_when_the_node_shows_the_layout_or_an_admin_labels_another() -> None:
    assert done_late(WRITTEN_STUCK, STUCK_NODE, NEW_LAYOUT, LAYOUTS)  # GFD relabelled late: done after all
    assert stuck_hold(WRITTEN_STUCK, STUCK_NODE, NEW_LAYOUT, LAYOUTS) == ""
    relabelled = {**STUCK_NODE, "nvidia.com/mig.config": "all-1g.10gb"}
    assert stuck_hold(WRITTEN_STUCK, relabelled, OLD_LAYOUT, LAYOUTS) == ""
    assert not done_late(WRITTEN_STUCK, relabelled, OLD_LAYOUT, LAYOUTS)


def test_only_a_stuck_outcome_holds() -> None:
    for outcome in ("done@2026-12-01T10:05:01Z", "superseded@2026-12-01T10:05:01Z", None):
        annotations = {k: v for k, v in {**WRITTEN_STUCK, "gpupool.io/mig-reshape-outcome": outcome}.items() if v}
        assert stuck_hold(annotations, STUCK_NODE, OLD_LAYOUT, LAYOUTS) == ""
        assert not done_late(annotations, STUCK_NODE, NEW_LAYOUT, LAYOUTS)
