"""`gpupool queue` and `kubectl gpupool queue`: the Pods waiting in gpupool's queue, their place in the
whole queue's release order, how long they have waited and what for, as the leader's own pass would
decide now; on a snapshot (its Pods that carry the gate) and on a live cluster (the API simulator)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from tests.builders import gpu_node
from tests.commands.install import installed
from tests.commands.kubeconfigs import kubeconfig
from tests.commands.queued import A100, AGES, POLICY, cluster, write_snapshot
from webhook.commands import kubectl
from webhook.commands.cli import main
from webhook.testing.kubesim import KubeSim

BIG = "no node of NVIDIA-L4, Tesla-T4 has 4 free now"
OVER = "class quota high in namespace q3 exceeded: used 1 + requested 1 > hard 1"
ROOM = "no node of NVIDIA-L4, Tesla-T4 has 1 free now"
FITS_NOW = "the leader: it fits now"
# NAMESPACE NAME POSITION WAITING FOR, in the whole queue's order: priority first, then age.
ROWS = [
    ["q", "big", "1", AGES["big"][1], BIG],
    ["q3", "over", "2", AGES["over"][1], OVER],
    ["q2", "hi", "3", AGES["hi"][1], FITS_NOW],
    ["q", "fits", "4", AGES["fits"][1], FITS_NOW],
    ["q", "behind", "5", AGES["behind"][1], ROOM],
]
SNAPSHOT_NOTE = "gpupool queue: note: 2 of these Pods fit now: the queue's leader would release them at its next pass\n"


def columns(out: str) -> list[list[str]]:
    """A table's rows, split at kubectl's column gaps (cells may hold single spaces)."""
    return [[c.strip() for c in line.split("   ") if c.strip()] for line in out.splitlines()]


@pytest.fixture
def snapshot(tmp_path: Path) -> list[str]:
    inventory, policy_file = write_snapshot(tmp_path)
    return ["--inventory", inventory, "--policy", policy_file]


def queue(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["queue", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_every_queued_pod_with_its_place_its_wait_and_what_it_waits_for(
    capsys: pytest.CaptureFixture[str], snapshot: list[str]
) -> None:
    """-A: the snapshot's gated Pods in release order; each waits for what the leader's pass says: no
    node with room in its pools (`big`, whose room `fits` may use meanwhile, and `behind`, once `fits` took
    the last L4), its namespace's class quota, or nothing but the leader (it fits now). The ones that fit
    are said on stderr."""
    status, out, err = queue(capsys, *snapshot, "-A")
    assert (status, err) == (0, SNAPSHOT_NOTE)
    table = columns(out)
    assert table[0] == ["NAMESPACE", "NAME", "POSITION", "WAITING", "FOR"]
    assert table[1:] == ROWS


def test_one_namespace_keeps_the_positions_of_the_whole_queue(
    capsys: pytest.CaptureFixture[str], snapshot: list[str], tmp_path: Path
) -> None:
    """-n q lists q's Pods only, at their places in the whole queue; without -n, the kubeconfig
    context's namespace (here one with no queued Pods)."""
    status, out, err = queue(capsys, *snapshot, "-n", "q", "--no-headers")
    assert (status, err) == (
        0,
        SNAPSHOT_NOTE.replace("2 of these Pods fit", "1 of these Pods fits").replace("them", "it"),
    )
    assert columns(out) == [ROWS[0], ROWS[3], ROWS[4]]
    kc = str(kubeconfig(tmp_path / "kc"))
    assert queue(capsys, *snapshot, "--kubeconfig", kc, "--context", "b")[1:] == (
        "",
        "No queued Pods in namespace team-b.\n"
        "gpupool queue: note: namespace team-b places its Pods at admission (placement: now): none of them queue\n",
    )


def test_wide_adds_the_priority_the_device_and_what_the_pass_would_do_now(
    capsys: pytest.CaptureFixture[str], snapshot: list[str]
) -> None:
    table = columns(queue(capsys, *snapshot, "-A", "-o", "wide")[1])
    assert table[0][5:] == ["PRIORITY", "RESOURCE", "DEVICES", "NOW"]
    assert [row[5:] for row in table[1:]] == [
        ["10", "nvidia.com/gpu", "4", "would wait (capacity)"],
        ["0", "nvidia.com/gpu", "1", "would wait (quota)"],
        ["0", "nvidia.com/gpu", "1", f"would be released to {A100}"],
        ["0", "nvidia.com/gpu", "1", "would be released to nvidia/medium/NVIDIA-L4"],
        ["0", "nvidia.com/gpu", "1", "would wait (capacity)"],
    ]


def test_json_and_yaml_carry_the_same_as_data(capsys: pytest.CaptureFixture[str], snapshot: list[str]) -> None:
    """One document: the whole queue's length and each listed Pod with its numbers, the pass's outcome
    (release, with the pool and the constraints; or wait, with the Wait's code and reason)."""
    status, out, _ = queue(capsys, *snapshot, "-n", "q2", "-o", "json")
    assert status == 0
    answer = json.loads(out)
    (hi,) = answer["pods"]
    assert answer["waiting"] == 5
    hi_created = hi.pop("created")
    assert abs(hi.pop("waitingSeconds") - AGES["hi"][0].total_seconds()) < 60 and hi_created.endswith("Z")
    assert hi == {
        "namespace": "q2", "name": "hi", "position": 3, "priority": 0, "resource": "nvidia.com/gpu",
        "devices": 1, "group": None, "outcome": "release", "pool": A100,
        "constraints": "gpu.accelerator/class=high, nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB",
        "code": None, "reason": None, "recut": None, "waitsFor": FITS_NOW,
    }  # fmt: skip
    answer = yaml.safe_load(queue(capsys, *snapshot, "-A", "-o", "yaml")[1])
    assert [(p["name"], p["outcome"], p["code"], p["reason"]) for p in answer["pods"]] == [
        ("big", "wait", "capacity", BIG),
        ("over", "wait", "quota", OVER),
        ("hi", "release", None, None),
        ("fits", "release", None, None),
        ("behind", "wait", "capacity", ROOM),
    ]


def test_names_as_kubectl_prints_them(capsys: pytest.CaptureFixture[str], snapshot: list[str]) -> None:
    assert queue(capsys, *snapshot, "-n", "q", "-o", "name")[1] == "pod/big\npod/fits\npod/behind\n"


def test_an_empty_queue_prints_nothing_and_says_so_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """No gated Pod: nothing on stdout, kubectl's "No resources found" on stderr; JSON is a document."""
    no_queue = [o for o in cluster() if "schedulingGates" not in o.get("spec", {})]
    inventory, policy_file = write_snapshot(tmp_path, no_queue)
    args = ["--inventory", inventory, "--policy", policy_file]
    assert queue(capsys, *args, "-A") == (0, "", "No queued Pods.\n")
    assert queue(capsys, *args, "-n", "q", "-o", "name") == (0, "", "No queued Pods in namespace q.\n")
    assert json.loads(queue(capsys, *args, "-A", "-o", "json")[1]) == {"waiting": 0, "pods": []}


def test_with_a_policy_that_queues_nothing_the_note_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    no_queue = [o for o in cluster() if "schedulingGates" not in o.get("spec", {})]
    inventory, _ = write_snapshot(tmp_path, no_queue)
    now = tmp_path / "now.yaml"
    now.write_text("defaults: {placement: now}\n", "utf-8")
    status, out, err = queue(capsys, "--inventory", inventory, "--policy", str(now), "-A")
    assert (status, out) == (0, "")
    assert err.splitlines() == [
        "No queued Pods.",
        "gpupool queue: note: no namespace queues its Pods (placement: now in the policy, for every namespace)",
    ]


# --- the live cluster -------------------------------------------------------------------------------------


class Live(NamedTuple):
    sim: KubeSim
    kubeconfig: str  # its current context's namespace is team-a


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    """The API simulator holding the queued cluster, and a kubeconfig for it."""
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load(cluster())
        token = json.loads(sim.write_kubeconfig(tmp_path / "sim").read_text())["users"][0]["user"]["token"]
        yield Live(sim, str(kubeconfig(tmp_path / "kc", sim.url, token)))
        assert sim.handler_errors == []


def test_the_plugin_lists_the_live_queue_with_the_installed_policy(
    capsys: pytest.CaptureFixture[str], live: Live
) -> None:
    """`kubectl gpupool queue -A` on the live cluster, the webhook's installed policy read from its
    Deployment: the same queue, the same reasons (q3's class quota is the installed policy's), and on
    stderr which policy was used and where to look if the Pod that fits stays."""
    deployment, configmap = installed()
    configmap["data"]["policy.yaml"] = POLICY
    for obj in (deployment, configmap):
        live.sim.serve_object(obj)
    status = kubectl.main(["queue", "-A", "--kubeconfig", live.kubeconfig])
    out, err = capsys.readouterr()
    assert status == 0
    assert columns(out)[1:] == ROWS
    assert err.splitlines() == [
        "kubectl gpupool queue: note: with the installed policy: ConfigMap gpupool-system/gpupool-policy "
        "(key policy.yaml), which Deployment gpupool-system/gpupool-webhook follows: its Pods take up a change "
        "of it within about 2 minutes, without a restart",
        "kubectl gpupool queue: note: 2 of these Pods fit now: the queue's leader releases them at its next pass; "
        "if they are still listed a few seconds from now, no gpupool replica may be leading "
        "(kubectl -n gpupool-system get lease gpupool)",
    ]


def test_the_live_queue_follows_the_cluster(capsys: pytest.CaptureFixture[str], live: Live, tmp_path: Path) -> None:
    """The context's namespace by default (none of its Pods queue). A node that joins with room for `big`:
    it would go, then `fits` to the last free L4; `behind` would still wait, for room, since the pass
    counts the Pods it releases before it."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    args = ["queue", "--kubeconfig", live.kubeconfig, "--policy", str(tmp_path / "policy.yaml")]
    assert kubectl.main(args) == 0
    assert capsys.readouterr().err.splitlines()[0] == "No queued Pods in namespace team-a."
    live.sim.load([gpu_node("l4-b", "NVIDIA-L4", 4, memory_mib=23034)])
    assert kubectl.main([*args, "-n", "q"]) == 0
    out = capsys.readouterr().out
    assert [row[1:] for row in columns(out)[1:]] == [
        ["big", "1", AGES["big"][1], FITS_NOW],
        ["fits", "4", AGES["fits"][1], FITS_NOW],
        ["behind", "5", AGES["behind"][1], "no node of NVIDIA-L4, Tesla-T4 has 1 free now"],
    ]


def test_explain_on_the_live_cluster_puts_the_pod_in_the_live_queue(
    capsys: pytest.CaptureFixture[str], live: Live, tmp_path: Path
) -> None:
    """`kubectl gpupool explain` of a high Pod in q2: sixth in the live queue, and released now to the
    A100s; its namespace's queue Pods are not changed by being asked."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    manifest = tmp_path / "train.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                                        "metadata": {"name": "train", "annotations": {"gpupool.io/gpu-class": "high"}},
                                        "spec": {"containers": [{"name": "main", "image": "pytorch"}]}}))  # fmt: skip
    before = live.sim.objects("Pod", "q2")
    args = [
        "explain",
        str(manifest),
        "-n",
        "q2",
        "--kubeconfig",
        live.kubeconfig,
        "--policy",
        str(tmp_path / "policy.yaml"),
    ]
    assert kubectl.main(args) == 0
    out = capsys.readouterr().out
    assert f"Queue: position 6 of 6, priority 0: would be released now to {A100} (constraints: " in out
    assert live.sim.objects("Pod", "q2") == before
