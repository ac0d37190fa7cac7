"""`gpupool queue` and `gpupool explain` on a live cluster count the charges of Pods that name their node
(webhook.pools.charges) as the queue's leader counts them: a queued Pod the leader would hold back for a
charged Pod's class quota is shown waiting for it, not released."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from tests.commands.kubeconfigs import kubeconfig
from tests.commands.queued import A100, cluster
from webhook.commands.cli import main
from webhook.pools.charges import Charge
from webhook.sources.charge_store import LeaseCharges
from webhook.sources.live import api_client
from webhook.testing.kubesim import KubeSim

# q2's one high GPU: `hi` (queued, 1 high GPU) fits on the free A100s unless a charge holds the quota.
POLICY = """\
defaults: {placement: now}
namespaces:
  q: {placement: queue}
  q2: {placement: queue, classQuota: {high: 1}}
  q3: {placement: queue, classQuota: {high: 1}}
  q4: {placement: queue, classQuota: {high: 1}}
"""
QUOTA = "class quota high in namespace q2 exceeded: used 1 + requested 1 > hard 1"


class Live(NamedTuple):
    sim: KubeSim
    args: list[str]  # --kubeconfig and --policy for the commands
    kubeconfig: str


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load(cluster())
        token = json.loads(sim.write_kubeconfig(tmp_path / "sim").read_text())["users"][0]["user"]["token"]
        kc = str(kubeconfig(tmp_path / "kc", sim.url, token))
        (tmp_path / "policy.yaml").write_text(POLICY)
        yield Live(sim, ["--kubeconfig", kc, "--policy", str(tmp_path / "policy.yaml")], kc)
        assert sim.handler_errors == []


def charge(live: Live, seconds: float = 300.0, namespace: str = "q2") -> None:
    """A 1-GPU Pod of `namespace` naming node a100-a, charged as its validating call charges it, whose Pod no watch
    has shown (its creation has not reached the API yet)."""
    store = LeaseCharges(api_client(live.kubeconfig), "gpupool-system")
    assert store.write([Charge(namespace, "charged", "a100-a", (("nvidia.com/gpu", 1),), time.time() + seconds)], "")


def hi_of(capsys: pytest.CaptureFixture[str], live: Live) -> tuple[dict[str, object], str]:
    assert main(["queue", "-n", "q2", "-o", "json", *live.args]) == 0
    out, err = capsys.readouterr()
    (hi,) = json.loads(out)["pods"]
    return hi, err


def test_a_charged_pod_the_watch_has_not_shown_holds_the_class_quota(
    capsys: pytest.CaptureFixture[str], live: Live
) -> None:
    """With q2's one high GPU charged to a Pod naming its node, `hi` waits for the class quota, as the
    leader's pass decides; the charge counted nowhere else (no warning)."""
    charge(live)
    hi, err = hi_of(capsys, live)
    assert (hi["outcome"], hi["code"], hi["reason"], hi["waitsFor"]) == ("wait", "quota", QUOTA, QUOTA)
    assert "warning" not in err


def test_an_expired_charge_counts_no_more(capsys: pytest.CaptureFixture[str], live: Live) -> None:
    charge(live, seconds=-1.0)
    hi, _ = hi_of(capsys, live)
    assert (hi["outcome"], hi["pool"]) == ("release", A100)


def test_explain_counts_the_charge_too(capsys: pytest.CaptureFixture[str], live: Live, tmp_path: Path) -> None:
    """`explain` of a high Pod for q4 (none of whose Pods is queued or running): it would wait for the
    quota the charge holds, where it would be released now without it."""
    charge(live, namespace="q4")
    manifest = tmp_path / "train.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                                        "metadata": {"name": "train", "annotations": {"gpupool.io/gpu-class": "high"}},
                                        "spec": {"containers": [{"name": "main", "image": "pytorch"}]}}))  # fmt: skip
    assert main(["explain", str(manifest), "-n", "q4", "-o", "json", *live.args]) == 0
    queued = json.loads(capsys.readouterr().out)["queue"]
    assert (queued["outcome"], queued["code"]) == ("wait", "quota"), queued
    assert queued["reason"] == QUOTA.replace("q2", "q4")


def test_a_lease_the_user_cannot_read_is_one_warning_and_the_queue_without_it(
    capsys: pytest.CaptureFixture[str], live: Live
) -> None:
    """The commands run as the user: a Lease read refused (403) is said once on stderr, naming the Lease,
    and the queue is shown without the charges."""
    charge(live)
    live.sim.fail_next(1, 403, verb="get")
    hi, err = hi_of(capsys, live)
    assert (hi["outcome"], hi["pool"]) == ("release", A100)
    warnings = [line for line in err.splitlines() if ": warning: " in line]
    assert len(warnings) == 1 and "gpupool-system/gpupool-charges: 403" in warnings[0], err


def test_explains_own_verdict_for_a_pod_naming_its_node_counts_the_charge(
    capsys: pytest.CaptureFixture[str], live: Live, tmp_path: Path
) -> None:
    """`explain` of a 1-GPU Pod naming node a100-a in q4, whose one high GPU is charged to another Pod the
    watch has not shown: denied naming the quota (exit 1), as its admission would refuse it (before:
    allowed, the charge not counted in the verdict, only in the queue preview)."""
    charge(live, namespace="q4")
    manifest = tmp_path / "bound.yaml"
    container = {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    bound = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bound"}}
    manifest.write_text(yaml.safe_dump({**bound, "spec": {"nodeName": "a100-a", "containers": [container]}}))
    assert main(["explain", str(manifest), "-n", "q4", "-o", "json", *live.args]) == 1
    out = capsys.readouterr().out
    assert QUOTA.replace("q2", "q4") in out, out
