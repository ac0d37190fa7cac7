"""Tests for POST /validate in webhook.serving.app, through Flask's test client: routing, bad input,
metrics and the log line, with the real Validator on the demo inventory (the TLS server:
tests/serving/test_validate.py)."""

from __future__ import annotations

import base64
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonpatch
import orjson
import pytest
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from tests.conftest import DEMO_INVENTORY, admission_review, gpu_pod
from webhook.admission.core import Admitter
from webhook.admission.validation import Caller, Checked, Trusted, Validator
from webhook.domain.policy import load_policy_text
from webhook.serving.app import AppConfig, create_app
from webhook.serving.logs import ADMISSION_LOGGER
from webhook.serving.metrics import Metrics
from webhook.sources.snapshot import SnapshotInventory

VALIDATE = "/validate?timeout=5s"
GPUPOOL = "system:serviceaccount:gpupool-system:gpupool-webhook"


@dataclass
class Harness:
    client: FlaskClient
    admitter: Admitter
    registry: CollectorRegistry
    lines: list[bytes]

    def post(self, path: str, review: Any, content_type: str = "application/json") -> Any:
        body = review if isinstance(review, bytes) else orjson.dumps(review)
        return self.client.post(path, data=body, content_type=content_type)

    def validate(self, review: dict[str, Any]) -> dict[str, Any]:
        resp = self.post(VALIDATE, review)
        assert resp.status_code == 200 and resp.mimetype == "application/json", resp.data
        answer: dict[str, Any] = orjson.loads(resp.data)["response"]
        assert answer["uid"] == review["request"]["uid"]
        assert "patch" not in answer and "patchType" not in answer  # a validating answer never patches
        return answer

    def counter(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def validation_lines(self) -> list[dict[str, Any]]:
        return [line for line in map(orjson.loads, self.lines) if line["message"] == "validation"]


@pytest.fixture
def h() -> Iterator[Harness]:
    logger = logging.getLogger(ADMISSION_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)  # the validation line is written at info
    policy = load_policy_text("defaults: {placement: now}\n")  # admission-time placement (the default queues)
    admitter = Admitter(policy, SnapshotInventory.from_file(str(DEMO_INVENTORY), policy))
    registry = CollectorRegistry()
    lines: list[bytes] = []
    validator = Validator(admitter, Trusted.of("gpupool-system", "gpupool-webhook"))
    config = AppConfig(admitter=admitter, metrics=Metrics(registry), validator=validator, write_line=lines.append)
    yield Harness(create_app(config).test_client(), admitter, registry, lines)
    logger.setLevel(level)


def placed(h: Harness, **kw: Any) -> dict[str, Any]:
    """A GPU Pod as the mutating call leaves it, named as kube-apiserver names it."""
    obj = gpu_pod(None, generate_name="trainer-", **kw)
    answer = h.post("/mutate", admission_review(obj)).json["response"]
    patched: dict[str, Any] = jsonpatch.apply_patch(obj, orjson.loads(base64.b64decode(answer["patch"])))
    patched["metadata"]["name"] = "trainer-x7k2p"
    return patched


def update_review(old: dict[str, Any], new: dict[str, Any], user: str = "alice", **kw: Any) -> dict[str, Any]:
    review = admission_review(new, operation="UPDATE", **kw)
    review["request"]["oldObject"] = old
    review["request"]["userInfo"] = {"username": user, "groups": ["system:authenticated"]}
    return review


class TestRouting:
    def test_validate_is_routed_beside_mutate(self, h: Harness) -> None:
        """With a validator the port serves POST /mutate and POST /validate, nothing else."""
        rules = {r.rule for r in h.client.application.url_map.iter_rules() if r.endpoint != "static"}
        assert rules == {"/mutate", "/validate"}

    @pytest.mark.parametrize(("method", "code"), [("GET", 405), ("PUT", 405)])
    def test_other_methods_are_json_errors(self, h: Harness, method: str, code: int) -> None:
        resp = h.client.open("/validate", method=method)
        assert (resp.status_code, resp.mimetype) == (code, "application/json")
        assert resp.json["kind"] == "Status" and "use POST" in resp.json["message"]

    def test_bad_input_is_a_4xx_status_never_a_500(self, h: Harness) -> None:
        """Not JSON, no uid, the wrong content type: a Kubernetes Status with the reason."""
        assert h.post(VALIDATE, b"{nope").status_code == 400
        assert h.post(VALIDATE, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).status_code == 400
        wrong = h.post(VALIDATE, admission_review(gpu_pod()), content_type="text/plain")
        assert (wrong.status_code, wrong.json["reason"]) == (415, "UnsupportedMediaType")

    @pytest.mark.parametrize(
        "review",
        [
            admission_review(gpu_pod(), operation="UPDATE", sub_resource="status"),
            admission_review(gpu_pod(), operation="DELETE"),
            admission_review({"kind": "ConfigMap"}, resource="configmaps"),
        ],
        ids=["status-subresource", "delete", "not-a-pod"],
    )
    def test_what_is_not_a_pod_create_or_update_is_allowed_unchecked(self, h: Harness, review: dict[str, Any]) -> None:
        assert h.validate(review)["allowed"] is True


class TestAnswers:
    def test_the_pod_as_gpupool_left_it_is_allowed_and_counted(self, h: Harness) -> None:
        """CREATE of the mutated Pod: allowed, its pool in the audit annotation, one validation counted
        and one line logged naming the reservation it confirmed."""
        answer = h.validate(admission_review(placed(h)))
        assert answer["allowed"] is True
        pool = answer["auditAnnotations"]["pool"]
        assert h.counter("gpupool_validations_total", operation="CREATE", outcome="allowed") == 1
        (line,) = h.validation_lines()
        assert (line["operation"], line["outcome"], line["pool"], line["reservation"]) == (
            "CREATE",
            "allowed",
            pool,
            "confirmed",
        )
        assert line["pod"] == "trainer-x7k2p" and "reason" not in line

    def test_a_later_webhooks_change_is_a_403_with_what_the_pod_lacks(self, h: Harness) -> None:
        stored = placed(h)
        del stored["spec"]["nodeSelector"]
        answer = h.validate(admission_review(stored))
        assert (answer["allowed"], answer["status"]["code"]) == (False, 403)
        assert "it lacks what keeps it in pool" in answer["status"]["message"]
        (line,) = h.validation_lines()
        assert (line["outcome"], line["reservation"]) == ("denied", "dropped")
        assert line["reason"] == answer["status"]["message"]

    def test_an_update_is_checked_against_the_caller_in_user_info(self, h: Harness) -> None:
        """UPDATE: request.userInfo decides; the log line names the user."""
        old = placed(h)
        new = copy.deepcopy(old)
        new["metadata"]["annotations"]["gpupool.io/pool"] = "nvidia/high/NVIDIA-H100-80GB-HBM3"
        refused = h.validate(update_review(old, new))
        assert (refused["allowed"], refused["status"]["code"]) == (False, 403)
        assert "alice changed annotation gpupool.io/pool (changed)" in refused["status"]["message"]
        assert h.validate(update_review(old, new, user=GPUPOOL))["allowed"] is True
        lines = h.validation_lines()
        assert [(line["operation"], line["user"], line["outcome"]) for line in lines] == [
            ("UPDATE", "alice", "denied"),
            ("UPDATE", GPUPOOL, "allowed"),
        ]
        assert h.counter("gpupool_validations_total", operation="UPDATE", outcome="denied") == 1

    def test_dry_runs_are_answered_and_not_counted(self, h: Harness) -> None:
        answer = h.validate(admission_review(placed(h), dry_run=True))
        assert answer["allowed"] is True
        assert h.counter("gpupool_validations_total", operation="CREATE", outcome="allowed") == 0
        assert h.counter("gpupool_validation_duration_seconds_count") == 1
        assert h.validation_lines()[0]["dry_run"] is True

    def test_an_unexpected_failure_is_a_refusal_with_an_error_id_never_an_http_500(self, h: Harness) -> None:
        class Broken:
            def validate_create(self, pod: Any, *, namespace: str, dry_run: bool = False) -> Checked:
                raise RuntimeError("boom")

            def validate_update(self, pod: Any, old: Any, *, namespace: str, caller: Caller) -> Checked:
                raise RuntimeError("boom")

        config = AppConfig(admitter=h.admitter, metrics=Metrics(CollectorRegistry()), validator=Broken())
        resp = create_app(config).test_client().post(VALIDATE, data=orjson.dumps(admission_review(gpu_pod())),
                                                     content_type="application/json")  # fmt: skip
        assert resp.status_code == 200
        answer = resp.json["response"]
        assert (answer["allowed"], answer["status"]["code"]) == (False, 500)
        assert "error id" in answer["status"]["message"]

    def test_malformed_pods_are_refused_in_the_review(self, h: Harness) -> None:
        """A Pod the core cannot read is a 400 in the review (uid answered), on CREATE and UPDATE alike."""
        bad = gpu_pod()
        bad["spec"]["containers"] = "main"
        assert h.validate(admission_review(bad))["status"]["code"] == 400
        assert h.validate(update_review(gpu_pod(), bad))["status"]["code"] == 400
        assert h.validate(update_review(None, gpu_pod()))["status"]["code"] == 400  # type: ignore[arg-type]
