"""`kubectl gpupool release`: a queued Pod released by hand, as the leader would release it, by a user
the validating webhook checks is the one the release names.

Two `gpupool serve` replicas against the API simulator, which calls gpupool's validating webhook on every
Pod update as kube-apiserver would (tests/queue/replicas.py); the command runs as the namespace user
`alice`, whom gpupool does not trust to change its Pods otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import gpu_node
from tests.conftest import wait_until
from tests.queue.helpers import GPU_TOLERATION
from tests.queue.replicas import WAIT, Pair, replicas
from webhook.admission.fence import manual_token
from webhook.commands.kubectl import main as kubectl
from webhook.sources.live import api_client
from webhook.sources.writes import PodReleaser, Refused
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow

POLICY = """
namespaces:
  q: {placement: queue, classQuota: {medium: 1}}
  r: {placement: queue}
"""


def pod(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": {"gpupool.io/gpu-class": "medium"}},
        "spec": {"containers": [{"name": "main", "image": "cuda"}], "tolerations": [GPU_TOLERATION]},
    }


class Alice:
    """The namespace user `alice`: her kubeconfig, and `kubectl gpupool` run as her."""

    def __init__(self, sim: KubeSim, work: Path, policy: Path) -> None:
        sim.add_client("token-alice", "alice", ("team-q", "system:authenticated"))
        self.kubeconfig = sim.write_kubeconfig(work / "alice.kubeconfig", token="token-alice")
        self.policy = policy

    def release(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
        code = kubectl(["release", *args, "--kubeconfig", str(self.kubeconfig), "--policy", str(self.policy)])
        out, err = capsys.readouterr()
        return code, out + err


@pytest.fixture
def pair(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    node = gpu_node("t4-a", "Tesla-T4", 2)
    node["status"]["allocatable"]["pods"] = "110"
    with replicas(tmp_path, cert_dir, POLICY, [node]) as pair:
        yield pair


@pytest.fixture
def alice(pair: Pair, tmp_path: Path) -> Alice:
    return Alice(pair.sim, tmp_path, tmp_path / "policy.yaml")


def quota_bound(pair: Pair) -> None:
    """q/first released by the leader (classQuota medium: 1 used up); q/second waits for the quota."""
    pair.create(pod("q", "first"))
    wait_until(lambda: pair.released("q", "first"), WAIT, "the leader's release of q/first")
    pair.create(pod("q", "second"))
    wait_until(lambda: bool(pair.sim.events("q", about="second")), WAIT, "the leader telling q/second it waits")
    assert not pair.released("q", "second")


def test_a_quota_bound_pod_is_released_by_hand_only_past_the_quota_and_binds(
    pair: Pair, alice: Alice, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --ignore-quota the release says the quota stops it; with it, the Pod is released to the
    pool as the leader would (its constraints, the gate gone), binds, and its annotation and Event name
    alice and the quota set aside. The leader then counts its GPU like any released Pod's: r/third, for
    which the node has no GPU left, waits."""
    quota_bound(pair)
    code, said = alice.release(capsys, "-n", "q", "second")
    assert code == 1
    assert "not released (quota): class quota medium in namespace q exceeded" in said and "--ignore-quota" in said
    assert not pair.released("q", "second")

    code, said = alice.release(capsys, "-n", "q", "second", "--ignore-quota")
    assert code == 0, said
    stored = pair.pod("q", "second")
    assert not stored["spec"].get("schedulingGates")
    assert stored["metadata"]["annotations"]["gpupool.io/released-by"] == "manual-ignore-quota/alice"
    assert stored["metadata"]["annotations"]["gpupool.io/pool"] == "nvidia/medium/Tesla-T4"
    events = [e for e in pair.sim.events("q", about="second") if e["reason"] == "Released"]
    assert len(events) == 1
    assert "by alice" in events[0]["message"] and "--ignore-quota" in events[0]["message"]

    pair.sim.scheduler()
    wait_until(lambda: pair.pod("q", "second")["spec"].get("nodeName") == "t4-a", WAIT, "q/second bound")
    pair.create(pod("r", "third"))
    told = lambda: any("no node" in e["message"] for e in pair.sim.events("r", about="third"))  # noqa: E731
    wait_until(told, WAIT, "the leader telling r/third that no node has room")
    assert not pair.released("r", "third")


def test_a_release_naming_another_user_is_refused(pair: Pair, alice: Alice) -> None:
    """alice removes the gate of q/second in one patch with a resourceVersion precondition, as the command
    does, but naming bob: the validating webhook refuses it as forged, and the Pod stays queued. The same
    patch under her own name commits."""
    quota_bound(pair)
    releaser = PodReleaser(api_client(str(alice.kubeconfig)))

    def release_naming(user: str) -> object:
        stored = pair.pod("q", "second")
        gate = [g["name"] for g in stored["spec"]["schedulingGates"]].index("gpupool.io/queue")
        patch = [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": stored["metadata"]["resourceVersion"]},
            {"op": "remove", "path": f"/spec/schedulingGates/{gate}"},
            {
                "op": "add",
                "path": "/metadata/annotations/gpupool.io~1released-by",
                "value": manual_token(user, ignore_quota=False),
            },
        ]
        return releaser.release("q", "second", patch)

    forged = release_naming("bob")
    assert isinstance(forged, Refused)
    assert "names bob and is made by alice" in forged.message
    assert not pair.released("q", "second")
    own = release_naming("alice")
    assert not isinstance(own, Refused), own
    assert pair.released("q", "second")


def test_a_pod_the_leader_released_or_that_does_not_exist_is_not_released_again(
    pair: Pair, alice: Alice, capsys: pytest.CaptureFixture[str]
) -> None:
    """q/first, released by the leader, carries no gate: alice's release says it is not queued and changes
    nothing (no second `gpupool.io/released-by`, no Event of hers); a Pod that does not exist is not found."""
    quota_bound(pair)
    before = pair.pod("q", "first")
    code, said = alice.release(capsys, "-n", "q", "first", "--ignore-quota")
    assert code == 1
    assert "pod/first in namespace q is not queued: it carries no gpupool.io/queue scheduling gate" in said
    after = pair.pod("q", "first")
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert not [e for e in pair.sim.events("q", about="first") if "by alice" in e["message"]]

    code, said = alice.release(capsys, "-n", "q", "ghost")
    assert code == 1
    assert said == "kubectl gpupool release: error: pod/ghost in namespace q not found\n"
