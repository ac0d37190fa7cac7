"""Drain by not filling: a node the leader will re-cut once it is idle gets no new release meanwhile (each
release into its pool leaves it out by hostname), so its own Pods finish, it goes idle and is re-cut.
On the API simulator: gpu-busy runs a trainer on one 1g.10gb instance, gpu-idle is idle but not for
idleSeconds yet, gpu-out did not opt in; eight Pods wait for 35 GiB, more than one re-cut serves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mig.configs import OPERATOR_DEFAULT
from tests.queue.migfleet import POLICY, small, start, waiting_fleet
from tests.testing.kubeclient import kube_client
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow

CONFIG = "nvidia.com/mig.config"


DRAINING = POLICY + "  drain: true\n"  # drains are opt-in (migReshaping.drain)


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with waiting_fleet(8) as running_sim:
        yield running_sim


def test_a_node_drained_for_a_re_cut_gets_no_release_and_is_re_cut_once_its_pods_finish(
    sim: KubeSim, tmp_path: Path
) -> None:
    """Both opted-in nodes are drained for the eight Pods; a 1g Pod queued then is released with both left
    out, so the simulated scheduler can put it only on gpu-out; once the trainer finishes and idleSeconds
    pass, gpu-busy is re-cut too, though the 1g Pod was never bound."""
    sim.mig_manager(OPERATOR_DEFAULT, delay=60.0)
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client, DRAINING)
        leader.pass_()
        sim.add(small())
        leader.pass_()
        assert leader.released("small")
        fits = leader.fits("small")
        assert fits == {"gpu-busy": False, "gpu-idle": False, "gpu-out": True}
        sim.delete("Pod", "other", "trainer")
        leader.index.remove_pod(("other", "trainer"))  # the watch's DELETED (the pass's sync lists only)
        leader.clock.now += 61
        leader.pass_()
        assert leader.labels("gpu-busy")[CONFIG] == "all-3g.40gb"
        assert leader.labels("gpu-idle")[CONFIG] == "all-3g.40gb"
        assert leader.labels("gpu-out")[CONFIG] == "all-1g.10gb"


def test_a_release_while_a_node_is_re_cut_leaves_that_node_out(sim: KubeSim, tmp_path: Path) -> None:
    """gpu-idle is chosen and labelled for a re-cut (mig-manager has not acted yet, so it still offers its
    1g.10gb instances): a 1g Pod released into that pool for room on gpu-out can be bound only there, not
    on the node being re-cut."""
    sim.mig_manager(OPERATOR_DEFAULT, delay=1.0)
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.clock.now += 61
        leader.pass_()
        assert leader.labels("gpu-idle")[CONFIG] == "all-3g.40gb"
        sim.add(small())
        leader.pass_()
        assert leader.released("small")
        fits = leader.fits("small")
        assert fits["gpu-idle"] is False
        assert fits["gpu-out"] is True
