"""End to end, through two `gpupool serve` replicas on the API simulator with its mig-manager stand-in and
a scheduler stand-in: three A100-80GB nodes cut all-1g.10gb (one busy, one idle, one not opted in), and
four Pods that need 35 GiB of MIG memory, created through the webhook as kube-apiserver creates them. Each
replica reads mig-parted's ConfigMap by its own watch and queues the four for a re-cut; the leader
re-cuts the idle opted-in node, and the four run there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.mig.configs import OPERATOR_DEFAULT
from tests.queue.e2e import WAIT, admit, two_replicas
from tests.queue.migfleet import big, config_map, three_a100s, trainer

pytestmark = pytest.mark.slow

POLICY = """
namespaces:
  q: {placement: queue}
  now: {placement: now}
migReshaping: {idleSeconds: 1, timeoutSeconds: 300}
"""


def test_four_pods_created_through_the_webhook_run_on_the_node_gpupool_re_cut(tmp_path: Path, cert_dir: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, "utf-8")
    objects = [*three_a100s(), config_map()]
    with two_replicas(tmp_path, cert_dir, policy, objects) as cluster:
        cluster.sim.add(trainer())  # after the start: in the initial objects it times out
        mig = cluster.sim.mig_manager(OPERATOR_DEFAULT, delay=0.5)
        refused = admit(cluster.sim, cluster.clients[0], big("now-0", "now"))
        assert refused is None
        for k in range(4):
            stored = admit(cluster.sim, cluster.clients[k % 2], big(f"big-{k}"))
            assert stored is not None, f"big-{k} was refused"
            limits = stored["spec"]["containers"][0]["resources"]["limits"]
            assert limits == {"nvidia.com/mig-3g.40gb": "1"}

        def running_on_the_re_cut_node() -> bool:
            pods = [cluster.pod("q", f"big-{k}") for k in range(4)]
            return all(p["spec"].get("nodeName") == "gpu-idle" for p in pods)

        wait_until(running_on_the_re_cut_node, WAIT * 2, "the four Pods bound to the re-cut node")
        assert mig.violations == [] and mig.history == [("gpu-idle", "all-3g.40gb", "success")]
        for untouched in ("gpu-busy", "gpu-out"):
            obj = cluster.sim.get("Node", None, untouched)
            assert obj is not None and obj["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
