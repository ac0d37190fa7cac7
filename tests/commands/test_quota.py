"""`gpupool quota`: every quota gpupool checks, per namespace, on the demo inventory and policy. Namespaces
as `kubectl get resourcequotas`: -n, else the kubeconfig context's, else default; -A for all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.commands.kubeconfigs import kubeconfig
from webhook.commands.cli import main

REPO = Path(__file__).resolve().parents[2]
INVENTORY = str(REPO / "examples" / "cluster.yaml")
POLICY = str(REPO / "examples" / "policy.yaml")
# The demo policy places `now`: the quotas only gpupool enforces are not exact with the two admitting
# processes `--replicas` counts by default (the shipped install's).
INEXACT = ["no:", "placement", "now"]
DEMO_ROWS = [
    ["team-a", "classQuota", "high", "1", "0", "4", "gpupool", "only", *INEXACT],
    ["team-a", "classQuota", "medium", "2", "0", "16", "gpupool", "only", *INEXACT],
    ["team-a", "gpu-quota", "requests.nvidia.com/gpu", "3", "0", "4", "Kubernetes", "and", "gpupool", "yes"],
    ["team-a", "memoryQuota", "gpu-memory", "70Gi", "0", "100Gi", "gpupool", "only", *INEXACT],
    ["team-b", "compute-resources", "nvidia.com/gpu", "1", "0", "4", "gpupool", "only", *INEXACT],
]
TUTORIAL_WARNING = (
    "Warning: quota team-b/compute-resources: 'nvidia.com/gpu: 4' is not enforced by Kubernetes for extended "
    "resources; enforced by gpupool only, for the Pods it admits; write 'requests.nvidia.com/gpu: 4'\n"
)


def quota(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["quota", "--inventory", INVENTORY, "--policy", POLICY, *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_table_lists_every_quota_with_its_source_and_who_enforces_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo cluster, -A: team-a's ResourceQuota (enforced by Kubernetes and gpupool), its class and
    memory quotas from the policy, and team-b's tutorial-form quota, which only gpupool enforces: the one
    warning on stderr says how to write it so that Kubernetes enforces it too."""
    status, out, err = quota(capsys, "-A")
    assert status == 0 and err.endswith(TUTORIAL_WARNING)
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["NAMESPACE", "QUOTA", "RESOURCE", "USED", "PENDING", "HARD", "ENFORCED", "BY", "EXACT"]
    assert lines[1:] == DEMO_ROWS
    assert len(err.splitlines()) == 5  # one warning per inexact quota, and the tutorial form's


def test_a_quota_only_gpupool_enforces_under_now_is_marked_not_exact(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Under `placement: now` with two admitting processes (the default count), the tutorial-form quota is
    marked and warned of, naming the quota and the fix; with one process, or when the namespace queues,
    every quota is exact and only the tutorial form's own warning is left."""
    status, out, err = quota(capsys, "-n", "team-b")
    assert status == 0
    assert out.splitlines()[1].split()[-3:] == INEXACT
    assert err.startswith("Warning: quota team-b/compute-resources nvidia.com/gpu: not exact: team-b places now")
    assert "each of 2 admitting processes" in err and "set placement: queue for team-b" in err
    status, out, err = quota(capsys, "-n", "team-b", "--replicas", "1")
    assert (status, err, out.splitlines()[1].split()[-1]) == (0, TUTORIAL_WARNING, "yes")
    queued = tmp_path / "policy.yaml"
    queued.write_text("namespaces: {team-b: {placement: queue}}\n", "utf-8")
    status = main(["quota", "--inventory", INVENTORY, "--policy", str(queued), "-n", "team-b", "-o", "json"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, TUTORIAL_WARNING)
    assert [q["exact"] for q in json.loads(out)["quotas"]] == [True]


def test_a_replica_count_that_is_not_a_whole_number_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        quota(capsys, "--replicas", "0")
    assert exit_.value.code == 2
    assert "--replicas: must be a whole number from 1 to 10000, not '0'" in capsys.readouterr().err


def test_the_namespace_is_n_else_the_contexts_else_default(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """As kubectl get: without -n or -A only one namespace is listed, the context's (here context b's, team-b), and
    `default` without a kubeconfig; -A lists them all and wins over -n."""
    assert quota(capsys)[1:] == ("", "No GPU quotas in namespace default.\n")
    kc = str(kubeconfig(tmp_path / "kubeconfig"))
    out = quota(capsys, "--kubeconfig", kc, "--context", "b")[1]
    assert [line.split() for line in out.splitlines()[1:]] == DEMO_ROWS[4:]
    out = quota(capsys, "--kubeconfig", kc, "-n", "team-a")[1]
    assert {line.split()[0] for line in out.splitlines()[1:]} == {"team-a"}
    assert quota(capsys, "-n", "team-a", "--all-namespaces")[1] == quota(capsys, "-A")[1]


def test_one_namespace_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`-n team-b -o json`: one object, the namespace's quotas with numbers (memory in MiB, says `unit`)."""
    status, out, _ = quota(capsys, "-n", "team-b", "-o", "json")
    assert status == 0
    assert json.loads(out) == {
        "quotas": [
            {"namespace": "team-b", "quota": "compute-resources", "resource": "nvidia.com/gpu", "used": 1,
             "pending": 0, "hard": 4, "unit": "gpus", "enforcedBy": "gpupool only", "exact": False}
        ]
    }  # fmt: skip
    _, out, _ = quota(capsys, "--namespace", "team-a", "-o", "json")
    memory = next(q for q in json.loads(out)["quotas"] if q["quota"] == "memoryQuota")
    assert (memory["used"], memory["hard"], memory["unit"]) == (70 * 1024, 100 * 1024, "MiB")
    _, out_yaml, _ = quota(capsys, "--namespace", "team-a", "-o", "yaml")
    assert yaml.safe_load(out_yaml) == json.loads(out)


def test_no_headers(capsys: pytest.CaptureFixture[str]) -> None:
    out = quota(capsys, "-A", "--no-headers")[1]
    assert [line.split() for line in out.splitlines()] == DEMO_ROWS


def test_a_namespace_without_quotas_says_so_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """kubectl's "No resources found" goes to stderr, so that stdout is empty for a script; JSON is still
    a document."""
    assert quota(capsys, "-n", "ml-train") == (0, "", "No GPU quotas in namespace ml-train.\n")
    assert json.loads(quota(capsys, "-n", "ml-train", "-o", "json")[1]) == {"quotas": []}
