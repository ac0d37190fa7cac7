"""A queued Pod a tenant grew after admission (a 250,000-character annotation of `<` and 3,000 labels):
the release's review carries it twice, Go-escaped (`<` as `\\u003c`), about 3.45 MB. gpupool's own
validating webhook judges it instead of answering 413 (its body limit admits every review kube-apiserver
can send for a Pod etcd stores), or the refusal is backed off and told; either way the leader makes no
tight loop of PATCHes and a later 1-GPU Pod of another namespace is released."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import gpu_node
from tests.conftest import wait_until
from tests.queue.replicas import NAMES, WAIT, Pair, replicas

pytestmark = pytest.mark.slow

POLICY = """
namespaces:
  q: {placement: queue}
  v: {placement: queue}
"""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pod(name: str, namespace: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(gpus)},
        },
        "spec": {"containers": [{"name": "main", "image": "cuda"}], "tolerations": [GPU_TOLERATION]},
    }


@pytest.fixture
def pair(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    node = gpu_node("t4-a", "Tesla-T4", 8)
    node["status"]["allocatable"]["pods"] = "110"
    with replicas(tmp_path, cert_dir, POLICY, [node]) as pair:
        yield pair


def grown(obj: dict[str, Any]) -> dict[str, Any]:
    """The tenant's merge patch, as stored: an annotation of 250,000 `<` and 3,000 labels."""
    meta = obj["metadata"]
    meta["annotations"] = {**meta.get("annotations", {}), "example.com/notes": "<" * 250_000}
    meta["labels"] = {**meta.get("labels", {}), **{f"label-{k:04d}": f"value-{k:04d}" for k in range(3_000)}}
    return obj


def test_a_pod_grown_after_admission_neither_stalls_the_queue_nor_is_retried_in_a_loop(pair: Pair) -> None:
    """Both replicas' writes held while the 4-GPU Pod is created and grown, then let go: the later 1-GPU
    Pod of v is released, the grown Pod is released or told why not (a Warning Event), and over all that
    the leader sent a handful of PATCHes, not dozens a second."""
    for replica in range(len(NAMES)):
        pair.sim.hold_writes(pair.token(replica))
    pair.create(pod("big", "q", 4))
    pair.sim.modify(grown(pair.pod("q", "big")))
    started = pair.sim.write_requests("patch", "pods")
    for replica in range(len(NAMES)):
        pair.sim.release_writes(pair.token(replica))
    pair.create(pod("victim", "v", 1))

    wait_until(lambda: pair.released("v", "victim"), WAIT, "the release of v/victim")

    def told() -> bool:
        events = [e for e in pair.sim.objects("Event", "q") if e["involvedObject"]["name"] == "big"]
        return any(e["reason"] == "ReleaseRefused" and e["type"] == "Warning" for e in events)

    wait_until(lambda: pair.released("q", "big") or told(), WAIT, "q/big released, or told why not")
    time.sleep(5.0)  # what a tight loop would fill with PATCHes
    assert pair.sim.write_requests("patch", "pods") - started <= 10
