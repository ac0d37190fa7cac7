"""`kubectl gpupool release`: what it says and leaves alone when it cannot release, and `--pool`, on the
queued cluster of tests/commands/queued.py in the API simulator (no webhook: what the command writes is
what is stored). The release past the validating webhook is tests/queue/test_release_by_hand_e2e.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.builders import gpu_node
from tests.commands.kubeconfigs import kubeconfig
from tests.commands.queued import L4, POLICY, T4, cluster
from webhook.commands import kubectl
from webhook.testing.kubesim import KubeSim


class Live(NamedTuple):
    sim: KubeSim
    args: list[str]  # --kubeconfig and --policy


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    """The queued cluster with a second T4 node, all free: `fits` (q, 1 medium GPU) has room on the L4
    and on the T4s."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([*cluster(), gpu_node("t4-b", "Tesla-T4", 4)])
        token = json.loads(sim.write_kubeconfig(tmp_path / "sim").read_text())["users"][0]["user"]["token"]
        config = kubeconfig(tmp_path / "kc", sim.url, token)
        yield Live(sim, ["--kubeconfig", str(config), "--policy", str(tmp_path / "policy.yaml")])
        assert sim.handler_errors == []


def release(capsys: pytest.CaptureFixture[str], live: Live, *args: str) -> tuple[int, str, str]:
    status = kubectl.main(["release", *args, *live.args])
    out, err = capsys.readouterr()
    return status, out, err


def stored(live: Live, namespace: str, name: str) -> dict[str, Any]:
    return next(p for p in live.sim.objects("Pod", namespace) if p["metadata"]["name"] == name)


@pytest.mark.parametrize("pool", [T4, L4], ids=["t4", "l4"])
def test_pool_releases_the_pod_to_the_pool_named(capsys: pytest.CaptureFixture[str], live: Live, pool: str) -> None:
    """`--pool` keeps the release to that pool, whichever the leader would rank first: the stored Pod is
    ungated, pinned to the pool's product and records the pool, and the command says where it went."""
    status, out, err = release(capsys, live, "-n", "q", "fits", "--pool", pool)
    assert status == 0, err
    pod = stored(live, "q", "fits")
    assert not pod["spec"].get("schedulingGates")
    assert pod["metadata"]["annotations"]["gpupool.io/pool"] == pool
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == pool.rpartition("/")[2]
    assert f"to pool {pool}" in out


def test_pool_without_room_leaves_the_pod_queued_and_says_why(capsys: pytest.CaptureFixture[str], live: Live) -> None:
    """`big` asks 4 medium GPUs: the free T4 node has them, the L4 (1 free) does not; `--pool` of the L4
    releases nothing and says the pool has no room."""
    before = stored(live, "q", "big")
    status, _, err = release(capsys, live, "-n", "q", "big", "--pool", L4)
    assert status == 1
    assert err == (
        "kubectl gpupool release: error: pod/big in namespace q not released (capacity): "
        "no node of NVIDIA-L4 has 4 free now\n"
    )
    assert stored(live, "q", "big") == before


def test_pool_that_is_not_one_of_the_cluster_is_refused_with_the_pools_it_has(
    capsys: pytest.CaptureFixture[str], live: Live
) -> None:
    """A `--pool` the inventory does not have is a bad argument (exit 2), answered with the pools there are."""
    before = stored(live, "q", "fits")
    status, _, err = release(capsys, live, "-n", "q", "fits", "--pool", "nvidia/medium/Tesla")
    assert status == 2
    assert "--pool 'nvidia/medium/Tesla' is not a pool of this cluster; its pools: " in err
    assert T4 in err and L4 in err
    assert stored(live, "q", "fits") == before


def test_a_pod_that_is_not_queued_is_left_alone(capsys: pytest.CaptureFixture[str], live: Live) -> None:
    """A running Pod carries no queue gate: the command says so, and writes nothing."""
    before = stored(live, "other", "busy-t4")
    status, out, err = release(capsys, live, "-n", "other", "busy-t4")
    assert status == 1
    assert out == ""
    assert err == (
        "kubectl gpupool release: error: pod/busy-t4 in namespace other is not queued: it carries no "
        "gpupool.io/queue scheduling gate (released already, or never queued)\n"
    )
    assert stored(live, "other", "busy-t4") == before


def test_a_pod_that_does_not_exist_is_named_as_not_found(capsys: pytest.CaptureFixture[str], live: Live) -> None:
    """A Pod name that is not in the namespace: `not found`, naming the Pod and the namespace, and no Event."""
    status, out, err = release(capsys, live, "-n", "q", "ghost")
    assert status == 1
    assert out == ""
    assert err == "kubectl gpupool release: error: pod/ghost in namespace q not found\n"
    assert live.sim.events("q", about="ghost") == []
