"""Issue 26 item 12: one list of GPU resources feeds every matchCondition. Both webhook configurations
(mutating and validating) select GPU Pods by the policy's own GPU resources, so a queued Pod of a
resource the mutating webhook saw (`nvidia.com/gpu.shared`) is checked as stored by the validating one.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from tests.manifests.rendered import KUBECTL, MANIFESTS, REPO, Obj, kustomize, parse_objects
from tests.manifests.sending import DEFAULT_POLICY
from tests.manifests.sending import pod as manifest_pod
from webhook.domain.model import QUEUE_GATE

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH (`kubectl kustomize`)")

KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@pytest.fixture(scope="module")
def configurations() -> dict[str, list[Any]]:
    """Each configuration's matchConditions, compiled with cel-python, by kind."""
    base = parse_objects(kustomize(MANIFESTS / "base"), "base")
    env = celpy.Environment()
    return {
        kind: [env.program(env.compile(c["expression"])) for c in base.one(kind)["webhooks"][0]["matchConditions"]]
        for kind in KINDS
    }


def sent_on_create(programs: list[Any], obj: Obj) -> bool:
    request = {"operation": "CREATE", "namespace": "team-a", "dryRun": False, "userInfo": {"username": "alice"}}
    activation = {"object": json_to_cel(obj), "oldObject": json_to_cel(None), "request": json_to_cel(request)}
    return all(bool(p.evaluate(activation)) for p in programs)


def every_gpu_resource() -> list[str]:
    """Every resource the webhook counts as a GPU's with the shipped policy: its names, and a profile
    under each partition prefix."""
    return sorted(DEFAULT_POLICY.gpu_resources) + [f"{p}1g.5gb" for p in DEFAULT_POLICY.partition_prefixes]


def test_the_shipped_policy_names_the_renamed_shared_resource() -> None:
    assert "nvidia.com/gpu.shared" in DEFAULT_POLICY.gpu_resources


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("resource", every_gpu_resource())
@pytest.mark.parametrize("where", ["limits", "requests", "init_limits"])
def test_both_configurations_send_every_gpu_resource(
    configurations: dict[str, list[Any]], kind: str, resource: str, where: str
) -> None:
    """A Pod whose only sign of a GPU is one of the policy's GPU resources is sent on CREATE by both."""
    obj = manifest_pod(**{where: {resource: "1"}})
    assert sent_on_create(configurations[kind], obj), f"{kind} does not send a Pod of {resource} ({where})"


def test_a_queued_shared_replica_pod_create_is_validated(configurations: dict[str, list[Any]]) -> None:
    """The Pod a queued CREATE stores: gated, on `nvidia.com/gpu.shared`, with no annotation of its own."""
    obj = manifest_pod(limits={"nvidia.com/gpu.shared": "1"})
    obj["spec"]["schedulingGates"] = [{"name": QUEUE_GATE}]
    assert sent_on_create(configurations["MutatingWebhookConfiguration"], obj)
    assert sent_on_create(configurations["ValidatingWebhookConfiguration"], obj)


def test_the_files_are_in_step_with_the_policy() -> None:
    """tools/match_conditions.py wrote both files' GPU resources from the policy (`make match-conditions`)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "match_conditions.py"), "--check"],
        capture_output=True, text=True, check=False, cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
