"""Admission of a Pod no current MIG layout can serve but a re-cut could (policy `migReshaping`): queued
for the re-cut in a namespace that queues, with the resource the re-cut offers; elsewhere refused with a
denial that names the layout and what it takes."""

from __future__ import annotations

from typing import Any

import jsonpatch

from tests.admission.clocked import Clock, CurrentInventory
from tests.builders import policy
from tests.queue.migfleet import a100, config_map, three_a100s, trainer
from webhook.admission.core import Admitter, evaluate
from webhook.admission.validation import Trusted, Validator
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj

RESHAPING = """
namespaces:
  q: {placement: queue}
migReshaping: {idleSeconds: 60}
"""


def fleet(pol: Policy, *nodes: dict[str, Any], config: bool = True) -> PoolIndex:
    index = PoolIndex(pol)
    index.upsert_nodes(node_from_obj(n, pol.gpu_resources, pol.partition_prefixes) for n in nodes)
    index.upsert_pod(pod_from_obj(trainer(), pol.gpu_resources, pol.partition_prefixes))
    if config:
        index.see_mig_config(config_map())
    return index


def the_fleet(pol: Policy, **kw: Any) -> PoolIndex:
    return fleet(pol, *three_a100s(), **kw)


def big(namespace: str = "q", memory: str = "35Gi", **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "big",
            "namespace": namespace,
            "annotations": {"gpupool.io/device": "mig", "gpupool.io/min-memory": memory, **annotations},
        },
        "spec": {"containers": [{"name": "c", "image": "cuda"}]},
    }


def limits(obj: dict[str, Any], result: Any) -> dict[str, str]:
    patched = jsonpatch.apply_patch(obj, list(result.patch))
    return dict(patched["spec"]["containers"][0]["resources"]["limits"])


def test_a_pod_only_a_re_cut_could_serve_is_queued_for_it_with_the_resource_it_will_offer() -> None:
    pol = policy(RESHAPING)
    obj = big()
    result = evaluate(obj, "q", pol, the_fleet(pol))
    assert result.allowed and result.queued == "nvidia.com/mig-3g.40gb"
    assert limits(obj, result) == {"nvidia.com/mig-3g.40gb": "1"}
    (warning,) = result.warnings
    assert "waits for a MIG re-cut to all-3g.40gb (nvidia.com/mig-3g.40gb), such as of node gpu-idle" in warning


def test_a_pod_whose_namespace_places_now_is_told_the_layout_and_that_only_queued_namespaces_get_it() -> None:
    pol = policy(RESHAPING)
    result = evaluate(big("now"), "now", pol, the_fleet(pol))
    assert not result.allowed and result.reason == "no-match"
    assert "A MIG re-cut would serve it: node gpu-idle re-cut to all-3g.40gb (a 3g.40gb)" in result.message
    assert "namespace now queueing its Pods (placement: queue)" in result.message


def test_with_no_node_opted_in_the_denial_says_which_node_to_label() -> None:
    pol = policy(RESHAPING)
    index = fleet(pol, a100("gpu-out", opted_in=False))
    result = evaluate(big(), "q", pol, index)
    assert not result.allowed
    assert "node gpu-out re-cut to all-3g.40gb (a 3g.40gb)" in result.message
    assert "the node labelled gpupool.io/mig-reshape=true" in result.message
    assert "placement: queue" not in result.message


def test_a_pod_no_layout_could_serve_is_refused_as_before() -> None:
    pol = policy(RESHAPING)
    result = evaluate(big(memory="90Gi"), "q", pol, the_fleet(pol))
    assert not result.allowed and "re-cut" not in result.message


def test_without_mig_reshaping_or_before_its_config_is_seen_nothing_is_queued_for_a_re_cut() -> None:
    without = policy("namespaces:\n  q: {placement: queue}\n")
    assert not evaluate(big(), "q", without, the_fleet(without)).allowed
    pol = policy(RESHAPING)
    unseen = evaluate(big(), "q", pol, the_fleet(pol, config=False))
    assert not unseen.allowed and "re-cut" not in unseen.message


def test_a_failed_node_is_never_waited_for() -> None:
    pol = policy(RESHAPING)
    failed = a100("gpu-idle")
    failed["metadata"]["labels"]["nvidia.com/mig.config.state"] = "failed"
    result = evaluate(big(), "q", pol, fleet(pol, failed))
    assert not result.allowed and "gpu-idle" not in result.message


def test_a_pod_that_fixes_its_profile_waits_only_for_that_profile() -> None:
    """A Pod that limits nvidia.com/mig-7g.80gb itself is queued for a layout that offers a 7g.80gb."""
    pol = policy(RESHAPING)
    obj = big()
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-7g.80gb": "1"}}
    result = evaluate(obj, "q", pol, the_fleet(pol))
    assert result.allowed and result.queued == "nvidia.com/mig-7g.80gb"
    assert "to all-7g.80gb" in result.warnings[0]


def test_the_validating_call_accepts_the_pod_as_its_mutating_call_queued_it_for_a_re_cut() -> None:
    """The stored Pod (gated, limiting nvidia.com/mig-3g.40gb) is judged again the same way: allowed,
    nothing left to add."""
    pol = policy(RESHAPING)
    admitter = Admitter(pol, CurrentInventory(the_fleet(pol), "test"), clock=Clock())
    obj = big()
    result = admitter.admit(obj, namespace="q")
    assert result.allowed and result.queued == "nvidia.com/mig-3g.40gb"
    stored = jsonpatch.apply_patch(obj, list(result.patch))
    checked = Validator(admitter, Trusted.of("gpupool-system", "gpupool-webhook")).validate_create(
        stored, namespace="q"
    )
    assert checked.verdict.allowed, checked.verdict.message
    assert checked.verdict.patch == ()


def test_a_namespace_that_may_not_use_the_re_cut_pools_class_is_not_queued_for_it() -> None:
    """The A100-80GB's instances are class high; a namespace allowed only medium never gets them."""
    pol = policy(RESHAPING.replace("q: {placement: queue}", "q: {placement: queue, allowedClasses: [medium]}"))
    result = evaluate(big(), "q", pol, the_fleet(pol))
    assert not result.allowed and "re-cut" not in result.message


def test_a_gang_is_not_queued_for_a_re_cut() -> None:
    pol = policy(RESHAPING)
    result = evaluate(big(**{"gpupool.io/group-size": "2"}), "q", pol, the_fleet(pol))
    assert not result.allowed and result.reason == "no-match" and "re-cut" not in result.message
