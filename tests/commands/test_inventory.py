"""`gpupool inventory`: one row per pool of devices, with its kind and exact product, and the nodes that
are not pooled with the reason, as warnings on stderr. Run through `webhook.commands.cli.main`, as the
console script does."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import gpu_node, issue_fleet, mig_mixed_node, quota
from tests.conftest import REPO
from webhook.commands.cli import main
from webhook.testing.kubesim import KubeSim


def snapshot(tmp_path: Path) -> str:
    """The issue's fleet as `kubectl get nodes -o yaml` prints it, with a node GFD calls invalid and one
    whose MIG configuration is being applied."""
    nodes = [
        *[n for n in issue_fleet() if n["metadata"]["name"] != "mixed-a"],
        mig_mixed_node("mixed-a", whole=2, instances={"3g.20gb": (4, 20096)}),
        gpu_node("bad-a", "NVIDIA-A100-SXM4-40GB-MIG-INVALID", 0, labels={"nvidia.com/gpu.count": "0"}),
        mig_mixed_node("busy-a", labels={"nvidia.com/mig.config.state": "pending"}),
    ]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}), "utf-8")
    return str(path)


NOTE = "gpupool inventory: note: with gpupool's built-in default policy (a snapshot holds none); pass --policy FILE"


def run_inventory(capsys: pytest.CaptureFixture[str], path: str, *args: str) -> tuple[str, list[str]]:
    """(stdout, the lines of stderr after the note that says which policy is used)."""
    assert main(["inventory", "--inventory", path, *args]) == 0
    out, err = capsys.readouterr()
    note, *said = err.splitlines()
    assert note == NOTE
    return out, said


def inventory(capsys: pytest.CaptureFixture[str], path: str, *args: str) -> str:
    return run_inventory(capsys, path, *args)[0]


def warnings(capsys: pytest.CaptureFixture[str], path: str, *args: str) -> list[str]:
    said = run_inventory(capsys, path, *args)[1]
    assert all(line.startswith("Warning: ") for line in said), said
    return said


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_the_table_has_one_row_per_device_pool(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The issue's first complaint: 56 5 GB slices and 12 whole 40 GB GPUs are two pools, not one "A100"
    pool of 68 with 4864Mi; the time-sliced T4 is a pool of replicas beside the dedicated T4."""
    table = rows(inventory(capsys, snapshot(tmp_path)))
    assert table[0] == [
        "VENDOR",
        "CLASS",
        "DEVICE",
        "PRODUCT",
        "MEMORY",
        "NODES",
        "GPUS",
        "ALLOCATED",
        "FREE",
        "PENDING",
    ]
    by_product = {row[3]: row for row in table[1:]}
    assert by_product["NVIDIA-A100-SXM4-40GB"][2:8] == ["gpu", "NVIDIA-A100-SXM4-40GB", "40Gi", "3", "14", "0"]
    assert by_product["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"][2:7] == [
        "mig",
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "4864Mi",
        "1",
        "56",
    ]
    # a mixed-strategy profile, on a resource of its own, is named as gpupool.io/pool names it
    mixed = "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb"
    assert by_product[mixed][2:7] == ["mig", mixed, "20096Mi", "1", "4"]
    assert by_product["Tesla-T4-SHARED"][2:7] == ["shared", "Tesla-T4-SHARED", "3840Mi", "1", "4"]
    assert by_product["Tesla-T4"][2:7] == ["gpu", "Tesla-T4", "15Gi", "1", "1"]


def test_wide_output_says_how_each_gpu_is_divided(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`-o wide`: the resource, and the MIG profile or the replicas per GPU."""
    table = rows(inventory(capsys, snapshot(tmp_path), "-o", "wide"))
    assert table[0][-2:] == ["RESOURCE", "PARTITION"]
    by_product = {row[3]: row for row in table[1:]}
    assert by_product["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"][-2:] == ["nvidia.com/gpu", "1g.5gb"]
    assert by_product["NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb"][-2:] == [
        "nvidia.com/mig-3g.20gb",
        "3g.20gb",
    ]
    assert by_product["Tesla-T4-SHARED"][-3:] == ["nvidia.com/gpu", "4", "replicas"]
    assert by_product["Tesla-T4"][-2:] == ["nvidia.com/gpu", "-"]


def test_json_names_the_device_of_each_pool(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report: dict[str, Any] = json.loads(inventory(capsys, snapshot(tmp_path), "-o", "json"))
    by_product = {p["product"]: p for p in report["pools"]}
    shared, mig = by_product["Tesla-T4-SHARED"], by_product["NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"]
    assert (shared["device"], shared["replicas"], shared["memoryMiB"]) == ("shared", [4], 3840)
    assert (mig["device"], mig["profile"], mig["resource"]) == ("mig", "3g.20gb", "nvidia.com/mig-3g.20gb")


def test_nodes_that_must_not_be_used_are_listed_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An invalid MIG layout and a MIG configuration being applied: not pooled, and the admin is told why."""
    said = warnings(capsys, snapshot(tmp_path))
    invalid = "Warning: node bad-a: nvidia GPUs not pooled: GPU Feature Discovery reports an invalid MIG layout"
    assert any(w.startswith(invalid) for w in said)
    assert (
        "Warning: node busy-a: nvidia GPUs not pooled: its MIG configuration is not in place "
        "(nvidia.com/mig.config.state=pending)"
    ) in said


def test_a_half_labelled_product_is_pooled_without_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """T4 nodes classed by the product table beside one labelled high: both pools are listed and placed
    (node affinity tells their nodes apart), so there is nothing to warn the admin about."""
    nodes = [gpu_node("t4-a", gpu_class=None), gpu_node("t4-reserved", gpu_class="high")]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}), "utf-8")
    assert not warnings(capsys, str(path))
    out = inventory(capsys, str(path))
    assert "medium" in out and "high" in out


# --- kubectl's output conventions ------------------------------------------------------------------------


def test_warnings_go_to_stderr_and_stdout_is_the_table_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What an admin should fix is said on stderr, as kubectl says the API server's warnings, so stdout
    is only the table (and `-o json` only JSON), and the warnings are in the JSON document too."""
    out, said = run_inventory(capsys, snapshot(tmp_path))
    assert said and all(line.startswith("Warning: ") for line in said)
    assert all("not pooled" not in line for line in out.splitlines())
    report = json.loads(inventory(capsys, snapshot(tmp_path), "-o", "json"))
    assert [f"Warning: {w}" for w in report["warnings"]] == said


def test_name_output_is_one_pool_per_line_as_gpupool_io_pool_names_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    names = inventory(capsys, snapshot(tmp_path), "-o", "name").splitlines()
    report = json.loads(inventory(capsys, snapshot(tmp_path), "-o", "json"))
    assert names == [p["pool"] for p in report["pools"]]
    assert "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb" in names
    assert "nvidia/medium/Tesla-T4-SHARED" in names


def test_no_headers_leaves_out_the_header_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for output in ("table", "wide"):
        with_headers = inventory(capsys, snapshot(tmp_path), "-o", output).splitlines()
        without = inventory(capsys, snapshot(tmp_path), "-o", output, "--no-headers").splitlines()
        assert with_headers[0].startswith("VENDOR") and rows("\n".join(without)) == rows("\n".join(with_headers[1:]))


def test_yaml_is_the_json_document(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    as_json = json.loads(inventory(capsys, snapshot(tmp_path), "-o", "json"))
    assert yaml.safe_load(inventory(capsys, snapshot(tmp_path), "-o", "yaml")) == as_json


def test_a_cluster_without_gpus_prints_nothing_and_says_so_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """As kubectl's "No resources found": nothing on stdout for a table or names, the JSON document still."""
    path = tmp_path / "cpu.yaml"
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-a"}, "status": {"allocatable": {"cpu": "8"}}}
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [node]}), "utf-8")
    for output in ("table", "name"):
        out, said = run_inventory(capsys, str(path), "-o", output)
        assert (out, said) == ("", ["No GPU pools."])
    assert json.loads(inventory(capsys, str(path), "-o", "json")) == {"pools": [], "warnings": []}


# --- the live cluster: answered at once, each warning once -----------------------------------------------


LIVE_FLEET = [gpu_node(f"l4-{i}", "NVIDIA-L4", 4, memory_mib=23034) for i in range(30)]
TUTORIAL = quota("tutorial", "team-a", {"nvidia.com/gpu": "4"})  # the form Kubernetes stores and never enforces
UNENFORCED = (
    "Warning: quota team-a/tutorial: 'nvidia.com/gpu: 4' is not enforced by Kubernetes for extended resources; "
    "enforced by gpupool only, for the Pods it admits; write 'requests.nvidia.com/gpu: 4'"
)


@pytest.fixture
def quiet_sim(tmp_path: Path) -> Iterator[tuple[KubeSim, str]]:
    """30 GPU nodes and a tutorial quota on a simulator that, like kube-apiserver, sends a watch a bookmark
    only once a minute: a watch sits blocked on its connection for the whole of a command."""
    with KubeSim(bookmark_interval=60) as sim:
        sim.load([*LIVE_FLEET, TUTORIAL])
        yield sim, str(sim.write_kubeconfig(tmp_path / "kc"))
        assert sim.handler_errors == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["inventory", "quota"])
def test_a_live_command_has_closed_its_watches_when_it_returns(quiet_sim: tuple[KubeSim, str], command: str) -> None:
    """The answer printed, the command returns with every watch it opened shut and its thread ended, rather
    than waiting each one out (5 s apiece, about 15 s a call, before)."""
    _, kc = quiet_sim
    before = set(threading.enumerate())
    assert main([command, "--kubeconfig", kc, "-n", "team-a"]) == 0
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("reflector-") and t.is_alive()]
    assert left == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["inventory", "quota"])
def test_the_unenforced_quota_is_warned_of_once(quiet_sim: tuple[KubeSim, str], command: str) -> None:
    """As a user runs it (its own process, where nothing catches the log): the quota Kubernetes does not
    enforce is one `Warning:` line, not that line and the inventory's log of it too; nothing else but the
    note of the policy used is said, not even of the watches shut at the exit."""
    _, kc = quiet_sim
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", command, "--kubeconfig", kc, "-n", "team-a"],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    note, *said = proc.stderr.splitlines()
    assert note.startswith(f"gpupool {command}: note: ")
    assert said == [UNENFORCED]
