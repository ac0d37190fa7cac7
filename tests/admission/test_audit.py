"""Audit mode (policy `enforcement: audit`, webhook.admission.audit): every Pod of an audited namespace is
allowed unchanged, holds nothing, and is told what gpupool would have answered, which is the answer the
same Pod gets in an enforcing namespace with the same rules. Played through the Admitter and the
Validator, as the server calls them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, event, given, settings

from tests.admission.admitting import admitter
from tests.admission.demo import demo_index, demo_policy
from tests.admission.podgen import NAMESPACES, pod_st
from tests.builders import GPU_TAINT, gpu_node, pod
from tests.builders import policy as make_policy
from webhook.admission.core import Admitter
from webhook.admission.validation import Caller, Trusted, Validator
from webhook.admission.verdict import Verdict
from webhook.domain.policy import PolicyError
from webhook.sources.snapshot import SnapshotInventory

T4 = "nvidia/medium/Tesla-T4"
# Two namespaces with the same rules, one audited and one enforced; `placement: now` said outright, so the
# answers do not hang on the built-in default.
POLICY = """
defaults: {placement: now}
namespaces:
  trial: {enforcement: audit, classQuota: {high: 1}}
  prod: {classQuota: {high: 1}}
  trial-queue: {enforcement: audit, placement: queue}
"""


def fleet() -> list[dict[str, Any]]:
    """Two T4 nodes (medium) with 4 GPUs each, 3 and 2 free, and an A100 node (high) with 8."""
    return [
        gpu_node("t4-a", "Tesla-T4", 4),
        gpu_node("t4-b", "Tesla-T4", 4),
        gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, memory_mib=40960, gpu_class="high", taints=[GPU_TAINT]),
        pod("busy-a", "other", gpus=1, node="t4-a", phase="Running"),
        pod("busy-b", "other", gpus=2, node="t4-b", phase="Running"),
    ]


def gpu_pod(name: str, namespace: str, **annotations: str) -> dict[str, Any]:
    return pod(name, namespace, annotations={f"gpupool.io/{k}": v for k, v in annotations.items()})


# The same rules enforced: what a Pod of `trial` would have been answered.
ENFORCED = POLICY.replace("enforcement: audit", "enforcement: enforce")


def both(obj: dict[str, Any], namespace: str = "trial") -> tuple[Verdict, Verdict, int]:
    """The Pod admitted in `namespace` audited and, by another replica, enforced; and the reservations the
    audited admission left."""
    audit_adm, _, audit_index = admitter(fleet(), POLICY)
    enforce_adm, _, _ = admitter(fleet(), ENFORCED)
    audited = audit_adm.admit(obj, namespace=namespace)
    enforced = enforce_adm.admit(obj, namespace=namespace)
    return audited, enforced, audit_index.usage.reservations


class TestWouldDeny:
    def test_a_pod_that_would_be_denied_is_allowed_unchanged_with_the_denial_it_would_get(self) -> None:
        """More GPUs of a class than the namespace's quota: enforced, a 403; audited, allowed with no patch,
        and the warning carries the very message the denial would carry, with its code for the metrics."""
        audited, enforced, reservations = both(gpu_pod("big", "trial", **{"gpu-class": "high", "gpu-count": "2"}))
        assert (enforced.allowed, enforced.code, enforced.reason) == (False, 403, "class-quota")
        assert (audited.allowed, audited.outcome, audited.patch, audited.code) == (True, "audited", (), 200)
        assert audited.warnings[0] == f"gpupool (audit): would deny: {enforced.message}"
        assert (audited.audit, audited.reason) == (f"would deny: {enforced.message}", "class-quota")
        assert reservations == 0

    def test_a_malformed_annotation_is_allowed_and_named(self) -> None:
        """The 400 a bad annotation gets is reported, not answered: what is wrong and what is accepted."""
        audited, enforced, _ = both(gpu_pod("bad", "trial", **{"gpu-count": "lots"}))
        assert (enforced.allowed, enforced.code) == (False, 400)
        assert audited.allowed and audited.patch == ()
        assert audited.warnings == (f"gpupool (audit): would deny: {enforced.message}",)
        assert audited.reason == "invalid"

    def test_an_ephemeral_container_that_would_be_refused_is_allowed(self) -> None:
        """`kubectl debug` with NVIDIA_VISIBLE_DEVICES=all in an audited namespace: allowed, and told."""
        adm, _, _ = admitter(fleet(), POLICY)
        enforcing, _, _ = admitter(fleet(), ENFORCED)
        old = pod("web-0", "trial", node="t4-a")
        new = pod("web-0", "trial", node="t4-a")
        env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        new["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox", "env": env}]
        audited = adm.admit_ephemeral(new, namespace="trial", old=old)
        enforced = enforcing.admit_ephemeral(new, namespace="trial", old=old)
        assert (enforced.allowed, enforced.reason) == (False, "visible-devices")
        assert (audited.allowed, audited.reason) == (True, "visible-devices")
        assert audited.warnings == (f"gpupool (audit): would deny: {enforced.message}",)


class TestWouldPlace:
    def test_a_pod_that_would_be_placed_gets_no_patch_and_the_pool(self) -> None:
        """Enforced, the Pod is pinned to the T4 pool by a patch; audited, it is left as it is and told
        the pool it would have been pinned to."""
        audited, enforced, reservations = both(gpu_pod("train", "trial", **{"gpu-class": "medium"}))
        assert enforced.patch and enforced.placement is not None and str(enforced.placement.pool) == T4
        assert (audited.allowed, audited.outcome, audited.patch, audited.placement) == (True, "audited", (), None)
        assert audited.warnings == (f"gpupool (audit): would place on {T4}",)
        assert reservations == 0

    def test_audited_pods_hold_nothing_against_pools_or_quotas(self) -> None:
        """Eight audited Pods on 5 free GPUs each would be placed with room (none counts against the next),
        and an enforced Pod afterwards still finds all 5 free."""
        adm, _, index = admitter(fleet(), POLICY)
        results = [adm.admit(gpu_pod(f"p{i}", "trial", **{"gpu-class": "medium"}), namespace="trial") for i in range(8)]
        assert [r.warnings for r in results] == [(f"gpupool (audit): would place on {T4}",)] * 8
        assert index.usage.reservations == 0
        enforced = [adm.admit(gpu_pod(f"q{i}", "prod", **{"gpu-class": "medium"}), namespace="prod") for i in range(6)]
        assert [r.placement.has_capacity for r in enforced if r.placement] == [True] * 5 + [False]
        assert index.usage.reservations == 6

    def test_the_warnings_the_enforcing_answer_carries_follow(self) -> None:
        """A Pod that would be placed to wait (no node has 4 free) is told so, as what gpupool would warn."""
        audited, enforced, _ = both(gpu_pod("wide", "trial", **{"gpu-class": "medium", "gpu-count": "4"}))
        assert len(enforced.warnings) == 1 and enforced.warnings[0].startswith("gpupool: ")
        assert audited.warnings == (
            f"gpupool (audit): would place on {T4}",
            f"gpupool (audit): would warn: {enforced.warnings[0].removeprefix('gpupool: ')}",
        )

    def test_a_pod_that_would_be_queued_gets_no_gate(self) -> None:
        """In an audited namespace that queues, the Pod is not gated: it is told what it would wait for."""
        adm, _, index = admitter(fleet(), POLICY)
        audited = adm.admit(gpu_pod("later", "trial-queue", **{"gpu-class": "medium"}), namespace="trial-queue")
        assert (audited.allowed, audited.patch, audited.queued) == (True, (), "")
        assert audited.warnings[0] == "gpupool (audit): would queue for 1 x nvidia.com/gpu"
        assert index.usage.reservations == 0

    def test_a_pod_that_is_not_gpupools_business_gets_the_same_answer(self) -> None:
        """A CPU Pod in an audited namespace is allowed unchanged with nothing to report."""
        adm, _, _ = admitter(fleet(), POLICY)
        result = adm.admit(pod("web", "trial", annotations={}), namespace="trial")
        assert (result.allowed, result.outcome, result.warnings) == (True, "unchanged", ())


class TestPolicy:
    def test_the_default_and_the_namespace_decide_which_is_audited(self) -> None:
        """`defaults.enforcement: audit` audits every namespace that does not say `enforce` itself."""
        text = "defaults: {placement: now, enforcement: audit}\nnamespaces:\n  prod: {enforcement: enforce}\n"
        adm, _, index = admitter(fleet(), text)
        elsewhere = adm.admit(gpu_pod("a", "any", **{"gpu-class": "medium"}), namespace="any")
        prod = adm.admit(gpu_pod("b", "prod", **{"gpu-class": "medium"}), namespace="prod")
        assert (elsewhere.patch, elsewhere.warnings) == ((), (f"gpupool (audit): would place on {T4}",))
        assert prod.patch and prod.outcome == "mutated"
        assert index.usage.reservations == 1

    def test_enforce_is_the_default(self) -> None:
        assert not make_policy(None).audits("any")

    @pytest.mark.parametrize(
        ("text", "field"),
        [
            pytest.param("defaults: {enforcement: warn}\n", "defaults.enforcement", id="defaults"),
            pytest.param("namespaces:\n  ml: {enforcement: Audit}\n", "namespaces.ml.enforcement", id="namespace"),
            pytest.param("namespaces:\n  ml: {enforcement: true}\n", "namespaces.ml.enforcement", id="not-a-string"),
        ],
    )
    def test_a_bad_value_names_the_field_and_what_is_accepted(self, text: str, field: str) -> None:
        with pytest.raises(PolicyError, match=rf"{field}: .* is not one of enforce, audit"):
            make_policy(text)


class TestValidation:
    """The validating call in an audited namespace sees the Pod unpatched: it allows it."""

    @staticmethod
    def replica() -> tuple[Admitter, Validator]:
        adm, _, _ = admitter(fleet(), POLICY)
        return adm, Validator(adm, Trusted.of("gpupool-system", "gpupool-webhook"))

    def test_a_create_the_mutating_call_left_unchanged_is_allowed_and_holds_nothing(self) -> None:
        """Enforced, a GPU Pod without gpupool's placement is refused as changed after gpupool; audited, it
        is allowed, and no reservation is left for it."""
        adm, validator = self.replica()
        answers = {}
        for ns in ("trial", "prod"):
            obj = gpu_pod("train", ns, **{"gpu-class": "medium"})
            assert adm.admit(obj, namespace=ns).allowed
            answers[ns] = validator.validate_create(obj, namespace=ns).verdict  # the Pod as it was sent
        assert (answers["prod"].allowed, answers["prod"].reason) == (False, "changed")
        assert (answers["trial"].allowed, answers["trial"].warnings) == (True, ())
        with adm.inventory.read() as index:
            assert index.usage.reservations == 0

    def test_an_update_gpupool_would_refuse_is_allowed_and_told(self) -> None:
        """A user who empties a placed GPU Pod's nodeSelector: refused where enforced, allowed with the
        would-be denial where audited."""
        adm, validator = self.replica()
        obj = gpu_pod("train", "prod", **{"gpu-class": "medium"})
        old = jsonpatch.apply_patch(obj, list(adm.admit(obj, namespace="prod").patch))
        new = jsonpatch.apply_patch(old, [{"op": "replace", "path": "/spec/nodeSelector", "value": {}}])
        refusal = validator.validate_update(new, old, namespace="prod", caller=Caller("alice")).verdict
        audited = validator.validate_update(new, old, namespace="trial", caller=Caller("alice")).verdict
        assert (refusal.allowed, refusal.reason) == (False, "guarded")
        assert (audited.allowed, audited.reason) == (True, "guarded")
        assert audited.warnings == (f"gpupool (audit): would deny: {refusal.message}",)


@functools.cache
def enforcer() -> Admitter:
    """The demo policy's Admitter, enforcing, on the demo cluster: asked only for dry runs, which reserve
    nothing, so one index gives every example its enforcing answer (a fresh one per example was two fifths
    of the property test below). The auditing Admitter, whose reserving nothing is under test, stays fresh."""
    return Admitter(demo_policy(), SnapshotInventory(demo_index(), "demo"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=pod_st(), namespace=NAMESPACES)
def test_any_pod_audited_is_allowed_unchanged_and_told_its_enforcing_answer(
    obj: dict[str, Any], namespace: str
) -> None:
    """For any Pod on the demo cluster, under the demo policy with `defaults.enforcement: audit`: allowed,
    no patch, nothing reserved, the validating call allows it as it was sent, and the first warning is
    the enforcing answer for the same Pod (its denial's message, or the pool it would be pinned to); a
    Pod the enforcing answer leaves alone gets that very answer."""
    enforcing = demo_policy()
    auditing = dataclasses.replace(enforcing, defaults=dataclasses.replace(enforcing.defaults, enforcement="audit"))
    enforced = enforcer().admit(copy.deepcopy(obj), namespace=namespace, dry_run=True)
    adm = Admitter(auditing, SnapshotInventory(demo_index(), "demo"))
    result = adm.admit(copy.deepcopy(obj), namespace=namespace)
    event(enforced.outcome)
    assert (result.allowed, result.patch, result.placement) == (True, (), None)
    with adm.inventory.read() as index:
        assert index.usage.reservations == 0
    checked = Validator(adm, Trusted.of("gpupool-system", "gpupool-webhook")).validate_create(obj, namespace=namespace)
    assert checked.verdict.allowed
    if not enforced.allowed:
        assert result.warnings[0] == f"gpupool (audit): would deny: {enforced.message}"
        assert result.reason == enforced.reason
    elif enforced.queued:
        assert result.warnings[0].startswith("gpupool (audit): would queue for ")
    elif enforced.placement is not None and not enforced.placement.node:
        assert result.warnings[0] == f"gpupool (audit): would place on {enforced.placement.pool}"
    elif enforced.placement is None:
        assert result == enforced
