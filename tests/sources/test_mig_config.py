"""mig-parted's ConfigMap reaches the pool index (`index.mig`), for admission's MIG re-cut answers: the
live inventory follows it by a watch of its own when the policy has `migReshaping`, outside readiness
(a missing ConfigMap never holds admission up); a snapshot file holds it if captured."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.builders import eventually, policy
from tests.queue.migfleet import a100, config_map
from webhook.sources.live import LiveInventory
from webhook.sources.reflector import ReflectorConfig
from webhook.sources.snapshot import build_index
from webhook.testing.kubesim import KubeSim

FAST = ReflectorConfig(connect_timeout=1, list_timeout=3, watch_seconds=5, watch_read_timeout=3, backoff_initial=0.05)
RESHAPING = policy("migReshaping: {configs: [all-3g.40gb, all-7g.80gb]}")


@pytest.mark.slow
def test_the_live_inventory_follows_the_config_map_the_policy_names(tmp_path: Path) -> None:
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.add(a100("gpu-a"))
        other = config_map()
        other["metadata"]["name"] = "someone-elses"
        sim.add(other)
        live = LiveInventory.connect(RESHAPING, str(sim.write_kubeconfig(tmp_path / "kc")), FAST).start()
        try:
            assert live.wait_ready(20)  # ready without the ConfigMap
            with live.read() as index:
                assert index.mig.layouts is None and "not seen" in index.mig.problem
            sim.add(config_map())

            def names() -> tuple[str, ...]:
                with live.read() as index:
                    return index.mig.layouts.names if index.mig.layouts is not None else ()

            eventually(lambda: names() == ("all-3g.40gb", "all-7g.80gb"), what="the layouts gpupool may choose")
            sim.delete("ConfigMap", "gpu-operator", "default-mig-parted-config")
            eventually(lambda: names() == (), what="the ConfigMap's deletion")
            with live.read() as index:
                assert index.mig.problem == "ConfigMap gpu-operator/default-mig-parted-config is gone"
        finally:
            live.close()


def test_without_mig_reshaping_no_config_map_is_watched() -> None:
    def unused(**kwargs: object) -> None:
        raise AssertionError("never listed: the reflectors are not started")

    api = SimpleNamespace(
        list_node=unused, list_pod_for_all_namespaces=unused, list_resource_quota_for_all_namespaces=unused
    )
    assert LiveInventory(policy(""), api).mig_reflector is None
    assert LiveInventory(RESHAPING, api).mig_reflector is not None


def test_a_snapshot_holds_the_config_map_and_an_invalid_one_says_why() -> None:
    index = build_index([a100("gpu-a"), config_map()], RESHAPING)
    assert index.mig.layouts is not None and index.mig.problem == ""
    broken = config_map(yaml.safe_dump({"version": "v2", "mig-configs": {}}))
    index = build_index([a100("gpu-a"), broken], RESHAPING)
    assert index.mig.layouts is None and "is not a valid mig-parted config" in index.mig.problem
