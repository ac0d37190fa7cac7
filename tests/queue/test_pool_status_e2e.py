"""The pools' status anyone can read, end to end: a running leader (its live inventory watching the API
simulator, its loop, its releases) writes one GPUPool per pool with the pool's figures, follows them as
Pods are released and bound, and deletes the object once the pool's nodes are gone; and each namespace
with Pods waiting gets its ConfigMap gpupool-queue, deleted once none waits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import gpu_node, index_of, pod, policy
from tests.conftest import wait_until
from tests.queue.fakes import Events, Leading
from tests.queue.helpers import GPU_TOLERATION, queued_pod
from webhook.queue.runner import Runner
from webhook.queue.waiting import Waiting
from webhook.sources.live import LiveInventory
from webhook.sources.poolstatus import PoolStatusWriter
from webhook.sources.reflector import ReflectorConfig
from webhook.sources.writes import PodReleaser
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow

WAIT = 30.0
POLICY = policy("namespaces:\n  q: {placement: queue}\n")
FAST = ReflectorConfig(connect_timeout=1, list_timeout=3, watch_seconds=5, watch_read_timeout=3, backoff_max=0.3)
T4 = "nvidia-medium-tesla-t4"
L4 = "nvidia-medium-nvidia-l4"
NODES = [gpu_node("t4-a", "Tesla-T4", 2), gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034)]


def figures(sim: KubeSim, name: str) -> dict[str, Any] | None:
    """What `kubectl get gpupools` shows of one pool's object: its counts (None while it has no status)."""
    obj = sim.get("GPUPool", None, name)
    if obj is None or "status" not in obj:
        return None
    keys = ("nodes", "capacity", "allocated", "free", "largestFree", "queued")
    return {k: obj["status"][k] for k in keys}


def counts(*, capacity: int, allocated: int, free: int, largest: int, queued: int) -> dict[str, int]:
    """A one-node pool's figures, by keyword."""
    figures = {"capacity": capacity, "allocated": allocated, "free": free, "largestFree": largest, "queued": queued}
    return {"nodes": 1, **figures}


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with KubeSim(bookmark_interval=0.2) as running:
        running.load(NODES)
        # The T4 pool is full; an L4 Pod of another namespace holds 1 of its 4.
        running.add(pod("busy", "other", gpus=2, node="t4-a", phase="Running", tolerations=[GPU_TOLERATION]))
        running.add(pod("small", "other", gpus=1, node="l4-a", phase="Running", tolerations=[GPU_TOLERATION]))
        # Queued for a T4 (its product asked for): waits for the busy Pod's GPUs.
        index = index_of(running.objects("Node"), POLICY)
        wants_t4 = {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-product": "Tesla-T4"}
        running.add(queued_pod("job", "q", POLICY, index, annotations=wants_t4, gpus=2))
        yield running
        assert running.handler_errors == []


@pytest.fixture
def leader(sim: KubeSim, tmp_path: Path) -> Iterator[Runner]:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    live = LiveInventory.connect(POLICY, str(kubeconfig), FAST)
    waiting = Waiting(POLICY)
    live.observe(waiting)
    live.start()
    assert live.wait_ready(20)
    writer = PoolStatusWriter(live.api_client).start()
    runner = Runner(live, waiting, Leading(), PodReleaser(live.api_client), events=Events(), status=writer)  # type: ignore[arg-type]
    runner.start()
    yield runner
    runner.stop()
    writer.stop()
    live.close()


def test_each_pool_is_an_object_with_its_figures_as_pods_come_and_go(sim: KubeSim, leader: Runner) -> None:
    """Full T4 pool with a Pod queued for it, L4 pool with 3 of 4 free; the busy T4 Pod ends: the queued
    one is released (held, not on a node yet: the GPUs count as not free, not as allocated), then bound
    (allocated); the T4 node goes: its object goes."""
    wait_until(
        lambda: figures(sim, T4) == counts(capacity=2, allocated=2, free=0, largest=0, queued=1),
        WAIT,
        "the full T4 pool with 1 queued",
    )
    wait_until(
        lambda: figures(sim, L4) == counts(capacity=4, allocated=1, free=3, largest=3, queued=0), WAIT, "the L4 pool"
    )
    l4 = sim.get("GPUPool", None, L4)
    assert l4 is not None
    status = l4["status"]
    assert (status["vendor"], status["class"], status["product"], status["deviceKind"]) == (
        "nvidia",
        "medium",
        "NVIDIA-L4",
        "gpu",
    )
    assert (status["resource"], status["pool"], l4["spec"]["pool"]) == (
        "nvidia.com/gpu",
        "nvidia/medium/NVIDIA-L4",
        "nvidia/medium/NVIDIA-L4",
    )

    # Namespace q's own view, readable with `view` in q: its waiting Pod, its position, what it waits for.
    wait_until(lambda: sim.get("ConfigMap", "q", "gpupool-queue") is not None, WAIT, "q's summary")
    summary = sim.get("ConfigMap", "q", "gpupool-queue")
    assert summary is not None
    (waiting,) = yaml.safe_load(summary["data"]["pods.yaml"])
    assert (waiting["pod"], waiting["position"], waiting["waitsFor"]) == ("job", 1, "capacity")
    assert sim.get("ConfigMap", "other", "gpupool-queue") is None

    sim.delete("Pod", "other", "busy")
    wait_until(lambda: not sim.get("Pod", "q", "job")["spec"].get("schedulingGates"), WAIT, "the release")  # type: ignore[index]
    wait_until(
        lambda: figures(sim, T4) == counts(capacity=2, allocated=0, free=0, largest=0, queued=0),
        WAIT,
        "the T4 pool holding the released Pod",
    )
    wait_until(lambda: sim.get("ConfigMap", "q", "gpupool-queue") is None, WAIT, "q's summary gone: nothing waits")

    bound = sim.get("Pod", "q", "job")
    assert bound is not None
    bound["spec"]["nodeName"] = "t4-a"
    bound["status"] = {"phase": "Running"}
    sim.modify(bound)
    wait_until(
        lambda: figures(sim, T4) == counts(capacity=2, allocated=2, free=0, largest=0, queued=0),
        WAIT,
        "the T4 pool with the Pod bound",
    )

    sim.delete("Pod", "q", "job")
    sim.delete("Node", None, "t4-a")
    wait_until(lambda: sim.get("GPUPool", None, T4) is None, WAIT, "the T4 pool's object deleted")
    assert figures(sim, L4) == counts(capacity=4, allocated=1, free=3, largest=3, queued=0)
