"""`kubectl gpupool release` decides against the queue's release record and records its release there
before it sends it (webhook.pools.charges, webhook.queue.records), on the queued cluster of
tests/commands/queued.py in the API simulator: a release by hand takes no room or quota the leader gave
away that the command's list does not show yet, and the leader counts it until its watch shows it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.builders import gpu_node
from tests.commands.kubeconfigs import kubeconfig
from tests.commands.queued import L4, POLICY, T4, cluster
from webhook.commands import kubectl
from webhook.pools.charges import Charge
from webhook.sources.charge_store import LeaseCharges
from webhook.sources.live import api_client
from webhook.testing.kubesim import KubeSim


class Live(NamedTuple):
    sim: KubeSim
    args: list[str]  # --kubeconfig and --policy
    record: LeaseCharges  # the release record, as the queue's leader and the admissions read it


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    """The queued cluster with a second T4 node, all free: `fits` (q, 1 medium GPU) has room on the L4
    (one GPU free) and on the T4s."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([*cluster(), gpu_node("t4-b", "Tesla-T4", 4)])
        token = json.loads(sim.write_kubeconfig(tmp_path / "sim").read_text())["users"][0]["user"]["token"]
        config = kubeconfig(tmp_path / "kc", sim.url, token)
        record = LeaseCharges(api_client(str(config)), "gpupool-system")
        yield Live(sim, ["--kubeconfig", str(config), "--policy", str(tmp_path / "policy.yaml")], record)
        assert sim.handler_errors == []


def release(capsys: pytest.CaptureFixture[str], live: Live, *args: str) -> tuple[int, str, str]:
    status = kubectl.main(["release", *args, *live.args])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_release_the_leader_recorded_and_has_not_sent_takes_its_room_from_a_release_by_hand(
    capsys: pytest.CaptureFixture[str], live: Live
) -> None:
    """The leader has recorded its release of q/behind to the L4's one free GPU, and not sent it yet: the
    command's list shows `behind` queued, but `release fits --pool L4` counts the recorded release, says
    the L4 has no room, and leaves `fits` queued (before: released, two Pods for one GPU)."""
    labels = (("gpu.accelerator/class", "medium"), ("nvidia.com/gpu.product", "NVIDIA-L4"))
    leaders = Charge("q", "behind", "", (("nvidia.com/gpu", 1),), time.time() + 60, L4, labels)
    assert live.record.write([leaders], "")
    status, _, err = release(capsys, live, "-n", "q", "fits", "--pool", L4)
    assert status == 1
    assert "not released (capacity)" in err
    pod = next(p for p in live.sim.objects("Pod", "q") if p["metadata"]["name"] == "fits")
    assert pod["spec"].get("schedulingGates")


def test_a_release_by_hand_is_recorded_for_the_leader_before_it_is_sent(
    capsys: pytest.CaptureFixture[str], live: Live
) -> None:
    """Released by hand to the T4s, `fits` is in the release record beside what was there, under the
    user who released it: the leader's passes and the admissions of every replica count it until their
    watch shows it released."""
    leaders = Charge("q", "behind", "", (("nvidia.com/gpu", 1),), time.time() + 60, L4)
    assert live.record.write([leaders], "")
    status, out, err = release(capsys, live, "-n", "q", "fits", "--pool", T4)
    assert status == 0, err
    charges, _ = live.record.read()
    assert charges[0] == leaders
    (mine,) = charges[1:]
    assert (mine.key, mine.pool, mine.devices) == (("q", "fits"), T4, (("nvidia.com/gpu", 1),))
    assert mine.by and f"released by hand by {mine.by} to pool {T4}" in out
