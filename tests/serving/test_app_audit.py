"""Audit mode through the app (`POST /mutate` and `POST /validate` on the demo inventory): what
kube-apiserver and the user get for a Pod of a namespace under `enforcement: audit`, what is logged and
what is counted, next to a namespace that enforces the same rules.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from tests.conftest import DEMO_INVENTORY, admission_review, gpu_pod
from webhook.admission.core import Admitter
from webhook.admission.validation import Trusted, Validator
from webhook.domain.policy import load_policy_text
from webhook.serving.app import AppConfig, create_app
from webhook.serving.logs import ADMISSION_LOGGER
from webhook.serving.metrics import Metrics
from webhook.serving.review import MAX_WARNING_CHARS
from webhook.sources.snapshot import SnapshotInventory

# `trial` is audited and `prod` enforced, with the same rules.
POLICY = """
defaults: {placement: now}
namespaces:
  trial: {enforcement: audit}
  prod: {}
"""
DENIED = {"gpupool.io/min-memory": "200Gi"}  # more than any GPU of the demo inventory has


@dataclass
class Harness:
    client: FlaskClient
    registry: CollectorRegistry
    lines: list[bytes]

    def answer(self, path: str, review: dict[str, Any]) -> dict[str, Any]:
        resp = self.client.post(path, data=orjson.dumps(review), content_type="application/json")
        assert resp.status_code == 200, resp.data
        answer: dict[str, Any] = orjson.loads(resp.data)["response"]
        return answer

    def mutate(self, namespace: str, **kw: Any) -> dict[str, Any]:
        obj = gpu_pod(namespace=namespace, **kw)
        return self.answer("/mutate", admission_review(obj, namespace=namespace))

    def counter(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def logged(self, message: str = "admission") -> list[dict[str, Any]]:
        return [line for line in map(orjson.loads, self.lines) if line["message"] == message]


@pytest.fixture
def h() -> Iterator[Harness]:
    logger = logging.getLogger(ADMISSION_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    policy = load_policy_text(POLICY)
    admitter = Admitter(policy, SnapshotInventory.from_file(str(DEMO_INVENTORY), policy))
    validator = Validator(admitter, Trusted.of("gpupool-system", "gpupool-webhook"))
    registry = CollectorRegistry()
    lines: list[bytes] = []
    config = AppConfig(admitter=admitter, metrics=Metrics(registry), validator=validator, write_line=lines.append)
    yield Harness(create_app(config).test_client(), registry, lines)
    logger.setLevel(level)


def test_a_pod_that_would_be_denied_is_allowed_with_the_whole_denial_as_a_warning(h: Harness) -> None:
    """kube-apiserver is told to admit the Pod as it is; the user sees the denial it would have got, whole,
    although it is longer than gpupool's other warnings may be."""
    enforced = h.mutate("prod", annotations=DENIED)
    audited = h.mutate("trial", annotations=DENIED)
    message = enforced["status"]["message"]
    assert (enforced["allowed"], enforced["status"]["code"]) == (False, 403)
    assert audited["allowed"] is True
    assert "patch" not in audited and "status" not in audited and "auditAnnotations" not in audited
    # The message names the namespace; it is the same one, but for the namespace's name.
    assert audited["warnings"] == [f"gpupool (audit): would deny: {message.replace('prod', 'trial')}"]
    assert len(audited["warnings"][0]) > MAX_WARNING_CHARS


def test_a_pod_that_would_be_placed_gets_no_patch_and_the_pool_it_would_get(h: Harness) -> None:
    """The audited Pod first (it reserves nothing), then the same Pod enforced: the pool it is pinned to
    is the one the audited Pod was told of."""
    audited = h.mutate("trial")
    enforced = h.mutate("prod")
    pool = enforced["auditAnnotations"]["pool"]
    assert enforced["patch"]
    assert audited == {"uid": audited["uid"], "allowed": True, "warnings": [f"gpupool (audit): would place on {pool}"]}


def test_would_be_denials_are_counted_by_reason_and_audited_admissions_by_outcome(h: Harness) -> None:
    """The counter a rollout watches: Pods gpupool would have refused, per namespace and code; denials
    in an enforcing namespace are not in it."""
    h.mutate("trial", annotations=DENIED)
    h.mutate("trial", annotations=DENIED)
    h.mutate("trial", annotations={"gpupool.io/gpu-count": "lots"})
    h.mutate("trial")
    h.mutate("prod", annotations=DENIED)
    count = h.counter
    assert count("gpupool_audit_would_deny_total", namespace="trial", reason="no-match") == 2
    assert count("gpupool_audit_would_deny_total", namespace="trial", reason="invalid") == 1
    assert count("gpupool_audit_would_deny_total", namespace="prod", reason="no-match") == 0
    assert count("gpupool_admissions_total", outcome="audited", pool="") == 4
    assert count("gpupool_admissions_total", outcome="denied", pool="") == 1


def test_a_dry_run_is_answered_alike_and_not_counted(h: Harness) -> None:
    obj = gpu_pod(namespace="trial", annotations=DENIED)
    answer = h.answer("/mutate", admission_review(obj, namespace="trial", dry_run=True))
    assert answer["allowed"] and answer["warnings"][0].startswith("gpupool (audit): would deny: ")
    assert h.counter("gpupool_audit_would_deny_total", namespace="trial", reason="no-match") == 0


def test_the_log_line_says_what_gpupool_would_have_done(h: Harness) -> None:
    h.mutate("trial", annotations=DENIED)
    h.mutate("trial")
    placed = h.mutate("prod")
    denied_line, placed_line, _ = h.logged()
    assert denied_line["outcome"] == "audited" and denied_line["audit_reason"] == "no-match"
    assert denied_line["audit"].startswith("would deny: ") and "code" not in denied_line
    assert placed_line["audit"] == f"would place on {placed['auditAnnotations']['pool']}"
    assert "audit_reason" not in placed_line


def test_the_validating_webhook_allows_an_audited_pod_as_it_will_be_stored(h: Harness) -> None:
    """The audited Pod reaches the validating call unpatched: allowed (enforced, it would be refused as
    changed after gpupool placed it)."""
    for namespace in ("trial", "prod"):
        obj = gpu_pod(namespace=namespace)
        assert h.answer("/mutate", admission_review(obj, namespace=namespace))["allowed"]
        answer = h.answer("/validate", admission_review(obj, namespace=namespace))
        assert answer["allowed"] is (namespace == "trial")
    assert h.counter("gpupool_validations_total", operation="CREATE", outcome="allowed") == 1
