"""`gpupool quota`: every quota gpupool checks, per namespace, on the demo inventory and policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from webhook.commands.cli import main

REPO = Path(__file__).resolve().parents[2]
INVENTORY = str(REPO / "examples" / "cluster.yaml")
POLICY = str(REPO / "examples" / "policy.yaml")


def quota(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["quota", "--inventory", INVENTORY, "--policy", POLICY, *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_table_lists_every_quota_with_its_source_and_who_enforces_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo cluster: team-a's ResourceQuota (enforced by Kubernetes and gpupool), its class and
    memory quotas from the policy, and team-b's tutorial-form quota, which only gpupool enforces."""
    status, out, err = quota(capsys)
    assert (status, err) == (0, "")
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["NAMESPACE", "QUOTA", "RESOURCE", "USED", "PENDING", "HARD", "ENFORCED", "BY"]
    assert lines[1:] == [
        ["team-a", "classQuota", "high", "1", "0", "4", "gpupool", "only"],
        ["team-a", "classQuota", "medium", "2", "0", "16", "gpupool", "only"],
        ["team-a", "gpu-quota", "requests.nvidia.com/gpu", "3", "0", "4", "Kubernetes", "and", "gpupool"],
        ["team-a", "memoryQuota", "gpu-memory", "70Gi", "0", "100Gi", "gpupool", "only"],
        ["team-b", "compute-resources", "nvidia.com/gpu", "1", "0", "4", "gpupool", "only"],
    ]


def test_one_namespace_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`-n team-b -o json`: one object, the namespace's quotas with numbers (memory in MiB, says `unit`)."""
    status, out, _ = quota(capsys, "-n", "team-b", "-o", "json")
    assert status == 0
    assert json.loads(out) == {
        "quotas": [
            {"namespace": "team-b", "quota": "compute-resources", "resource": "nvidia.com/gpu", "used": 1,
             "pending": 0, "hard": 4, "unit": "gpus", "enforcedBy": "gpupool only"}
        ]
    }  # fmt: skip
    _, out, _ = quota(capsys, "--namespace", "team-a", "-o", "json")
    memory = next(q for q in json.loads(out)["quotas"] if q["quota"] == "memoryQuota")
    assert (memory["used"], memory["hard"], memory["unit"]) == (70 * 1024, 100 * 1024, "MiB")


def test_a_namespace_without_quotas_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = quota(capsys, "-n", "ml-train")
    assert (status, out) == (0, "No GPU quotas in namespace ml-train.\n")
