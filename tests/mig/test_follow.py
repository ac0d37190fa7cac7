"""Following a change gpupool asked for: done only when GFD shows the new layout, stuck after the bound."""

from __future__ import annotations

from tests.mig.configs import A100_80
from tests.mig.planning import LAYOUTS
from webhook.mig.follow import DONE, FAILED, IN_FLIGHT, STUCK, SUPERSEDED, Asked, shows, status

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
