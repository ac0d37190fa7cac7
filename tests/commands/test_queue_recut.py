"""`gpupool queue` and `gpupool explain` say when a Pod waits for a MIG re-cut, of which node, to which
layout, and whether gpupool asked for it already: on a snapshot (and a live cluster) of three A100-80GB
nodes cut all-1g.10gb (one busy, one idle, one not opted in) with mig-parted's ConfigMap, and Pods queued
for 35 GiB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.queue.migfleet import POLICY, a100, config_map, running, waiting_pod
from webhook.commands.cli import main
from webhook.testing.kubesim import KubeSim

PLANNED = "a MIG re-cut of node gpu-idle to all-3g.40gb, which the leader would ask mig-manager for"
UNDER_WAY = "a MIG re-cut of node gpu-idle to all-3g.40gb, under way"


def objects_of(*, asked: bool = False, waiting: int = 4) -> list[dict[str, Any]]:
    idle = a100("gpu-idle")
    if asked:  # gpupool's change, written and not ended: mig-manager at work
        idle["metadata"]["labels"].update(
            {"nvidia.com/mig.config": "all-3g.40gb", "nvidia.com/mig.config.state": "pending"}
        )
        idle["metadata"]["annotations"] = {"gpupool.io/mig-reshape-asked": "all-3g.40gb@2026-12-01T10:00:00Z"}
    objects: list[dict[str, Any]] = [
        a100("gpu-busy"),
        idle,
        a100("gpu-out", opted_in=False),
        running("trainer", "gpu-busy"),
        config_map(),
        *(waiting_pod(f"big-{k}") for k in range(waiting)),
    ]
    return objects


def write(tmp_path: Path, *, asked: bool = False, waiting: int = 4) -> list[str]:
    inventory, policy = tmp_path / "cluster.yaml", tmp_path / "policy.yaml"
    items = objects_of(asked=asked, waiting=waiting)
    inventory.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}), "utf-8")
    policy.write_text(POLICY, "utf-8")
    return ["--inventory", str(inventory), "--policy", str(policy)]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("asked", "words"), [(False, PLANNED), (True, UNDER_WAY)], ids=["planned", "under-way"])
def test_the_queue_says_which_re_cut_each_pod_waits_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, asked: bool, words: str
) -> None:
    source = write(tmp_path, asked=asked)
    table = run(capsys, "queue", *source, "-n", "q")
    assert [line.split("   ")[-1].strip() for line in table.splitlines()[1:]] == [words] * 4
    first, *_ = json.loads(run(capsys, "queue", *source, "-n", "q", "-o", "json"))["pods"]
    assert first["recut"] == {"node": "gpu-idle", "layout": "all-3g.40gb", "underWay": asked}
    assert first["waitsFor"] == words and first["code"] == "capacity"


def test_explain_says_a_new_pod_would_wait_for_the_re_cut(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = write(tmp_path, waiting=2)  # with the new one, three: more than all-balanced's two 3g.40gb serve
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "new", "annotations": {"gpupool.io/device": "mig", "gpupool.io/min-memory": "35Gi"}},
        "spec": {"containers": [{"name": "c", "image": "cuda"}]},
    }
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(pod), "utf-8")
    out = run(capsys, "explain", str(pod_file), *source, "-n", "q")
    assert "Decision: queued: 1 x nvidia.com/mig-3g.40gb" in out
    assert f"Queue: position 3 of 3, priority 0: would wait for {PLANNED}" in out


@pytest.mark.slow
def test_on_a_live_cluster_the_queue_reads_mig_parteds_config_map_and_says_the_same(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, "utf-8")
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load(objects_of())
        kubeconfig = str(sim.write_kubeconfig(tmp_path / "kubeconfig"))
        table = run(capsys, "queue", "--kubeconfig", kubeconfig, "--policy", str(policy), "-n", "q")
    assert [line.split("   ")[-1].strip() for line in table.splitlines()[1:]] == [PLANNED] * 4
