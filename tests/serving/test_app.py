"""Tests for webhook.serving.app through Flask's test client: routing, bad input, metrics and the log line.

A fake Admitter pins what the app does with a Verdict; the real core on the demo inventory shows the
whole path end to end.
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import orjson
import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry
from werkzeug.test import EnvironBuilder, run_wsgi_app

from tests.conftest import DEMO_INVENTORY, admission_review, gpu_pod
from webhook.admission.core import Admitter
from webhook.admission.pieces import PodPatch, SelectorAdded
from webhook.admission.verdict import Placement, Verdict, allow, deny, place
from webhook.domain.model import PoolKey
from webhook.domain.policy import load_policy_text
from webhook.serving.app import ETCD_MAX_OBJECT_BYTES, MAX_BODY_BYTES, AppConfig, create_app
from webhook.serving.logs import ADMISSION_LOGGER
from webhook.serving.metrics import Metrics
from webhook.sources.snapshot import SnapshotInventory

POOL = PoolKey("nvidia", "medium", "NVIDIA-L4")
PLACED = place(
    Placement(POOL, "nvidia.com/gpu", 1, 1, (("nvidia.com/gpu.product", "NVIDIA-L4"),), True, False),
    PodPatch(
        (
            SelectorAdded(
                (("nvidia.com/gpu.product", "NVIDIA-L4"),),
                {"op": "add", "path": "/spec/nodeSelector", "value": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            ),
        )
    ),
    warnings=("fell back to class medium",),
)


@dataclass
class FakeAdmitter:
    """Answers every Pod with `verdict` (or raises `error`) and remembers how it was called."""

    verdict: Verdict = PLACED
    error: Exception | None = None
    calls: list[tuple[Mapping[str, Any], str, bool]] = field(default_factory=list)

    def admit(self, pod: Mapping[str, Any], *, namespace: str, dry_run: bool = False) -> Verdict:
        self.calls.append((pod, namespace, dry_run))
        if self.error is not None:
            raise self.error
        return self.verdict


@dataclass
class Harness:
    client: FlaskClient
    admitter: FakeAdmitter
    registry: CollectorRegistry
    lines: list[bytes]

    def post(self, review: Any, content_type: str = "application/json") -> Any:
        body = review if isinstance(review, bytes) else orjson.dumps(review)
        return self.client.post("/mutate?timeout=10s", data=body, content_type=content_type)

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        resp = self.post(review)
        assert resp.status_code == 200
        assert resp.mimetype == "application/json"
        result: dict[str, Any] = orjson.loads(resp.data)
        return result

    def counter(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def harness(admitter: FakeAdmitter | None = None) -> Harness:
    registry = CollectorRegistry()
    fake = admitter or FakeAdmitter()
    lines: list[bytes] = []
    config = AppConfig(admitter=fake, metrics=Metrics(registry), write_line=lines.append)
    return Harness(create_app(config).test_client(), fake, registry, lines)


@pytest.fixture
def h() -> Iterator[Harness]:
    logger = logging.getLogger(ADMISSION_LOGGER)
    level = logger.level
    yield harness()
    logger.setLevel(level)


def with_level(level: int) -> None:
    logging.getLogger(ADMISSION_LOGGER).setLevel(level)  # the fixture `h` restores it


def admission_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """Admission lines that went through logging (the error path, which carries a traceback)."""
    return [r.fields for r in caplog.records if r.name == ADMISSION_LOGGER and r.getMessage() == "admission"]  # type: ignore[attr-defined]


class TestFactory:
    def test_create_app_builds_independent_apps(self) -> None:
        """The factory makes a new app each call (nothing global at import time)."""
        a, b = harness(), harness()
        assert a.client.application is not b.client.application
        assert isinstance(a.client.application, Flask)

    def test_only_mutate_is_routed(self, h: Harness) -> None:
        """The admission port has one route; health and metrics live on the other port."""
        rules = {r.rule for r in h.client.application.url_map.iter_rules() if r.endpoint != "static"}
        assert rules == {"/mutate"}


class TestPodCreate:
    def test_pod_create_goes_to_the_admitter_and_its_verdict_is_answered(self, h: Harness) -> None:
        """A Pod CREATE is decided by the Admitter; patch, warnings and audit pool come from the Verdict."""
        review = admission_review(gpu_pod(), uid="u-1")
        response = h.review(review)["response"]
        assert len(h.admitter.calls) == 1
        assert response["uid"] == "u-1" and response["allowed"] is True
        assert orjson.loads(base64.b64decode(response["patch"])) == list(PLACED.patch)
        assert response["warnings"] == ["fell back to class medium"]
        assert response["auditAnnotations"] == {"pool": str(POOL)}

    def test_namespace_from_the_request_when_the_object_has_none(self, h: Harness) -> None:
        """The Admitter gets request.namespace for a Pod whose metadata has no namespace."""
        h.review(admission_review(gpu_pod(namespace=None), namespace="team-b"))
        assert h.admitter.calls[0][1] == "team-b"

    def test_dry_run_reaches_the_admitter_as_dry_run_and_counts_nothing(self, h: Harness) -> None:
        """dryRun gets the same answer, the Admitter is told (no reservation) and no Pod is counted."""
        real = h.review(admission_review(gpu_pod()))["response"]
        dry = h.review(admission_review(gpu_pod(), dry_run=True))["response"]
        assert [c[2] for c in h.admitter.calls] == [False, True]
        assert {k: v for k, v in dry.items() if k != "uid"} == {k: v for k, v in real.items() if k != "uid"}
        assert h.counter("gpupool_admissions_total", outcome="mutated", pool=str(POOL)) == 1
        assert h.counter("gpupool_admission_duration_seconds_count") == 2

    def test_v1beta1_is_answered_in_v1beta1(self, h: Harness) -> None:
        """The answer's apiVersion is the request's."""
        result = h.review(admission_review(gpu_pod(), api_version="admission.k8s.io/v1beta1"))
        assert (result["apiVersion"], result["kind"]) == ("admission.k8s.io/v1beta1", "AdmissionReview")


class TestSkippedRequests:
    @pytest.mark.parametrize(
        "review",
        [
            pytest.param(admission_review(gpu_pod(), operation="UPDATE"), id="update"),
            pytest.param(admission_review(gpu_pod(), sub_resource="status"), id="subresource"),
            pytest.param(admission_review({"kind": "ConfigMap"}, resource="configmaps"), id="other-resource"),
        ],
    )
    def test_allowed_unchanged_without_asking_the_admitter(self, h: Harness, review: dict[str, Any]) -> None:
        """Anything but a Pod CREATE is answered allowed with no patch; the core is not consulted. (Every
        Pod CREATE goes to the core, mirror and bound Pods included: test_admission.)"""
        response = h.review(review)["response"]
        assert response == {"uid": review["request"]["uid"], "allowed": True}
        assert h.admitter.calls == []


class TestBadInput:
    def test_not_json_is_400_json(self, h: Harness) -> None:
        """A body that is not JSON is refused with 400 and a JSON Status, not HTML."""
        resp = h.post(b"<html>")
        assert resp.status_code == 400 and resp.mimetype == "application/json"
        assert orjson.loads(resp.data)["kind"] == "Status"

    @pytest.mark.parametrize(
        "review",
        [
            pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, id="no-request"),
            pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}, id="no-uid"),
        ],
    )
    def test_missing_request_or_uid_is_400(self, h: Harness, review: dict[str, Any]) -> None:
        """Without request or uid there is nothing to answer: 400 with a JSON Status naming the problem."""
        resp = h.post(review)
        status = orjson.loads(resp.data)
        assert resp.status_code == 400 and status["code"] == 400 and "request" in status["message"]

    @pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
    def test_wrong_content_type_is_415(self, h: Harness, content_type: str) -> None:
        """Only application/json is accepted."""
        resp = h.post(admission_review(gpu_pod()), content_type=content_type)
        assert resp.status_code == 415 and orjson.loads(resp.data)["code"] == 415

    def test_json_with_charset_is_accepted(self, h: Harness) -> None:
        """A charset parameter does not change the media type."""
        assert h.post(admission_review(gpu_pod()), content_type="application/json; charset=utf-8").status_code == 200

    def test_body_over_the_limit_is_413(self, h: Harness) -> None:
        """A body over MAX_BODY_BYTES is refused by its Content-Length with 413 JSON; the Admitter never runs."""
        resp = h.post(b" " * (MAX_BODY_BYTES + 1))
        assert resp.status_code == 413 and orjson.loads(resp.data)["reason"] == "RequestEntityTooLarge"
        assert h.admitter.calls == []

    def test_the_largest_review_kube_apiserver_sends_for_a_stored_pod_is_judged(self, h: Harness) -> None:
        """An UPDATE's review of a Pod as large as etcd stores (1.5 MiB, nearly all of it one annotation of
        `<`), carrying it as object and oldObject, encoded as Go encodes it (`<` as a six-byte `\\u003c`):
        about 18 MiB, six times the old 3 MiB limit, and judged (a release of such a Pod was refused 413)."""
        obj = gpu_pod()
        obj["metadata"]["annotations"] = {"example.com/notes": "<" * (ETCD_MAX_OBJECT_BYTES - 4096)}
        review = admission_review(obj, operation="UPDATE")
        review["request"]["oldObject"] = obj
        body = orjson.dumps(review).replace(b"<", b"\\u003c")
        assert 3 * 1024 * 1024 < 2 * 5 * ETCD_MAX_OBJECT_BYTES < len(body) <= MAX_BODY_BYTES
        resp = h.post(body)
        assert resp.status_code == 200
        assert orjson.loads(resp.data)["response"]["uid"] == review["request"]["uid"]

    def stream_post(self, h: Harness, body: bytes, *, terminated: bool = True) -> tuple[int, bytes]:
        """A POST without Content-Length, as gunicorn hands over a chunked request (stream terminated)."""
        environ = EnvironBuilder(
            path="/mutate", method="POST", input_stream=io.BytesIO(body), content_type="application/json"
        ).get_environ()
        environ.pop("CONTENT_LENGTH")  # werkzeug's builder measures the stream; a chunked request has none
        if terminated:
            environ["wsgi.input_terminated"] = True
        chunks, status, _ = run_wsgi_app(h.client.application, environ)
        return int(status.split()[0]), b"".join(chunks)

    def test_streamed_body_over_the_limit_is_413(self, h: Harness) -> None:
        """A body without Content-Length is cut off after MAX_BODY_BYTES with 413, not truncated into bad JSON."""
        status, _ = self.stream_post(h, b" " * (MAX_BODY_BYTES + 1))
        assert status == 413 and h.admitter.calls == []

    def test_streamed_body_within_the_limit_is_read(self, h: Harness) -> None:
        """A chunked AdmissionReview within the limit is answered normally."""
        status, _ = self.stream_post(h, orjson.dumps(admission_review(gpu_pod())))
        assert status == 200 and len(h.admitter.calls) == 1

    def test_unbounded_body_from_a_server_that_does_not_end_it_is_411(self, h: Harness) -> None:
        """Without Content-Length and without a server-terminated stream the body cannot be read safely."""
        status, body = self.stream_post(h, b"{}", terminated=False)
        assert status == 411 and orjson.loads(body)["code"] == 411

    @pytest.mark.parametrize(
        ("method", "path", "code"), [("GET", "/mutate", 405), ("POST", "/validate", 404), ("GET", "/healthz", 404)]
    )
    def test_flask_errors_are_json(self, h: Harness, method: str, path: str, code: int) -> None:
        """Flask's own 404 and 405 come back as JSON Status objects."""
        resp = h.client.open(path, method=method)
        assert resp.status_code == code and resp.mimetype == "application/json"
        assert orjson.loads(resp.data)["code"] == code

    def test_unexpected_exception_is_a_500_review_with_an_error_id_in_the_log(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A crash in the core answers allowed false, code 500, with an error id that the log line repeats."""
        h = harness(FakeAdmitter(error=RuntimeError("boom")))
        with caplog.at_level(logging.INFO, logger=ADMISSION_LOGGER):
            response = h.review(admission_review(gpu_pod(), uid="u-err"))["response"]
        assert (response["uid"], response["allowed"], response["status"]["code"]) == ("u-err", False, 500)
        [record] = admission_records(caplog)
        assert record["outcome"] == "error" and record["error_id"] in response["status"]["message"]
        assert h.counter("gpupool_admissions_total", outcome="error", pool="") == 1

    def test_failure_before_decoding_is_a_500_status_with_an_error_id_in_the_log(
        self, h: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A crash before there is a uid to answer (here: reading the body) is a JSON 500 naming an error id."""

        class BrokenStream(io.BytesIO):
            def read(self, size: int | None = -1) -> bytes:
                raise RuntimeError("connection reset while reading")

        environ = EnvironBuilder(
            path="/mutate", method="POST", input_stream=BrokenStream(b"{}"), content_type="application/json"
        ).get_environ()
        environ["CONTENT_LENGTH"] = "2"
        with caplog.at_level(logging.ERROR, logger=ADMISSION_LOGGER):
            chunks, status, headers = run_wsgi_app(h.client.application, environ)
        answer = orjson.loads(b"".join(chunks))
        assert status == "500 Internal Server Error" and headers["Content-Type"] == "application/json"
        [record] = [r for r in caplog.records if r.getMessage() == "request failed"]
        assert record.fields["error_id"] in answer["message"]  # type: ignore[attr-defined]
        assert h.admitter.calls == []


class TestMetricsAndLog:
    def test_outcomes_are_counted_by_outcome_and_pool(self) -> None:
        """Each answered Pod counts once under its outcome and pool."""
        h = harness(FakeAdmitter(verdict=deny("no pool fits")))
        h.review(admission_review(gpu_pod()))
        h.admitter.verdict = allow("not a GPU Pod")
        h.review(admission_review(gpu_pod()))
        assert h.counter("gpupool_admissions_total", outcome="denied", pool="") == 1
        assert h.counter("gpupool_admissions_total", outcome="unchanged", pool="") == 1

    def test_quota_denials_are_counted_by_namespace(self) -> None:
        """A ResourceQuota denial also counts in gpupool_quota_denials_total for its namespace."""
        message = "exceeded quota gpu-quota in namespace ml: requests.nvidia.com/gpu used 4 + requested 1 > hard 4"
        h = harness(FakeAdmitter(verdict=deny(message, reason="quota")))
        h.review(admission_review(gpu_pod()))
        assert h.counter("gpupool_quota_denials_total", namespace="ml") == 1

    def test_one_log_line_per_admission_without_the_body(self, h: Harness) -> None:
        """The line has uid, namespace, pod, outcome, pool and latency, and nothing of the Pod's body."""
        with_level(logging.INFO)
        h.review(admission_review(gpu_pod(name=None, generate_name="train-"), uid="u-log"))
        [line] = h.lines
        fields = orjson.loads(line)
        assert {k: fields[k] for k in ("uid", "namespace", "pod", "outcome", "pool")} == {
            "uid": "u-log",
            "namespace": "ml",
            "pod": "train-",
            "outcome": "mutated",
            "pool": str(POOL),
        }
        assert fields["latency_ms"] >= 0
        assert fields["logger"] == ADMISSION_LOGGER and line.endswith(b"}\n") and line.count(b"\n") == 1
        assert b"registry.example" not in line

    def test_no_admission_line_above_info(self, h: Harness) -> None:
        """At --log-level warning the admission lines are off."""
        with_level(logging.WARNING)
        h.review(admission_review(gpu_pod()))
        assert h.lines == []


@pytest.fixture(scope="module")
def real() -> Harness:
    """The app with the real core on the demo inventory (examples/cluster.yaml)."""
    return real_harness()


def real_harness() -> Harness:
    policy = load_policy_text("defaults: {placement: now}\n")  # admission-time placement (the default queues)
    inventory = SnapshotInventory.from_file(str(DEMO_INVENTORY), policy)
    registry = CollectorRegistry()
    lines: list[bytes] = []
    config = AppConfig(admitter=Admitter(policy, inventory), metrics=Metrics(registry), write_line=lines.append)
    return Harness(create_app(config).test_client(), FakeAdmitter(), registry, lines)


def debugged(value: str) -> dict[str, Any]:
    """An update of pods/ephemeralcontainers adding a debug container that sets NVIDIA_VISIBLE_DEVICES."""
    running = gpu_pod(namespace="ml")
    added = {**running, "spec": {**running["spec"], "ephemeralContainers": [
        {"name": "dbg", "image": "busybox", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]}]}}  # fmt: skip
    review = admission_review(added, operation="UPDATE", sub_resource="ephemeralcontainers", uid="dbg-1")
    review["request"]["oldObject"] = running
    return review


class TestEphemeralContainers:
    def test_an_ephemeral_container_with_all_is_refused_and_one_without_is_allowed_unchanged(self) -> None:
        """`kubectl debug` with NVIDIA_VISIBLE_DEVICES=all is refused in the review; with void it is allowed
        with no patch (never a patch on the subresource); both are counted as admissions of no pool."""
        real = real_harness()
        refused = real.review(debugged("all"))["response"]
        assert (refused["allowed"], refused["status"]["code"]) == (False, 403)
        assert "container 'dbg' sets NVIDIA_VISIBLE_DEVICES='all'" in refused["status"]["message"]
        assert real.review(debugged("void"))["response"] == {"uid": "dbg-1", "allowed": True}
        assert real.counter("gpupool_admissions_total", outcome="denied", pool="") == 1
        assert real.counter("gpupool_admissions_total", outcome="unchanged", pool="") == 1


class TestRealCore:
    def test_gpu_pod_is_placed_and_the_patch_applies(self, real: Harness) -> None:
        """On the demo inventory a 20Gi GPU Pod with only generateName is placed; the patch applies."""
        pod = gpu_pod(name=None, generate_name="train-", namespace=None)
        response = real.review(admission_review(pod, namespace="ml", dry_run=True))["response"]
        assert response["allowed"] is True
        patched = jsonpatch.apply_patch(pod, orjson.loads(base64.b64decode(response["patch"])))
        assert patched["metadata"]["annotations"]["gpupool.io/pool"] == response["auditAnnotations"]["pool"]
        assert patched["spec"]["nodeSelector"]

    def test_the_admission_line_carries_the_pods_group(self, real: Harness) -> None:
        """A Job's Pod is logged with its group (from its controller owner), so a group's admissions can be
        found in the log; a Pod of no group has no such field."""
        with_level(logging.INFO)
        real.lines.clear()
        job_pod = gpu_pod(name=None, generate_name="train-")
        job_pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "train", "uid": "u", "controller": True}]
        real.review(admission_review(job_pod, dry_run=True))
        real.review(admission_review(gpu_pod(), dry_run=True))
        grouped, alone = (orjson.loads(line) for line in real.lines)
        assert grouped["group"] == "Job/train"
        assert "group" not in alone

    def test_pod_without_gpupool_annotations_is_unchanged(self, real: Harness) -> None:
        """A Pod that asks for no GPU gets no patch."""
        pod = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
        assert real.review(admission_review(pod, uid="web-1"))["response"] == {"uid": "web-1", "allowed": True}

    def test_quota_denial_is_counted_for_its_namespace(self, real: Harness) -> None:
        """team-a's quota has 1 of 4 GPUs left: 2 GPUs are refused (403) and counted as a quota denial."""
        pod = gpu_pod(namespace="team-a", annotations={"gpupool.io/gpu-count": "2"})
        response = real.review(admission_review(pod, namespace="team-a"))["response"]
        assert response["allowed"] is False and response["status"]["code"] == 403
        assert "quota" in response["status"]["message"]
        assert real.counter("gpupool_quota_denials_total", namespace="team-a") == 1
        assert real.counter("gpupool_admissions_total", outcome="denied", pool="") == 1

    def test_dry_run_leaves_no_reservation(self, real: Harness) -> None:
        """Repeated dry runs get the same pool: nothing is reserved for them."""
        pools = {
            real.review(admission_review(gpu_pod(), dry_run=True))["response"]["auditAnnotations"]["pool"]
            for _ in range(20)
        }
        assert len(pools) == 1

    @pytest.mark.parametrize(
        ("edit", "field"),
        [
            (lambda p: p["metadata"].update(ownerReferences=5), "metadata.ownerReferences"),
            (lambda p: p.update(metadata=None), "metadata"),
            (lambda p: p["spec"]["containers"].insert(0, None), "spec.containers[0]"),
            (lambda p: p["metadata"]["annotations"].update({"gpupool.io/gpu-count": "²"}), "gpupool.io/gpu-count"),
            (lambda p: p["metadata"]["annotations"].update({"gpupool.io/gpu-count": "7" * 5000}), "gpu-count"),
            (lambda p: p["metadata"]["annotations"].update({"gpupool.io/min-driver": "535.²"}), "min-driver"),
            (lambda p: p["spec"]["containers"][0].update(resources={"limits": {"nvidia.com/gpu": "1e5000"}}),
             "limits nvidia.com/gpu"),
        ],
        ids=["owner-references-number", "metadata-null", "container-null", "superscript-count", "5000-digit-count",
             "superscript-driver", "huge-limit"],
    )  # fmt: skip
    def test_malformed_pods_are_refused_in_the_review_never_an_internal_error(
        self, real: Harness, edit: Any, field: str
    ) -> None:
        """Issue 12's internal errors: each of these answered code 500 (or HTTP 500, which lets the Pod
        through under failurePolicy Ignore). Now: HTTP 200, allowed false, code 400, naming the field."""
        review = admission_review(gpu_pod())
        edit(review["request"]["object"])
        resp = real.post(review)
        assert resp.status_code == 200
        response = orjson.loads(resp.data)["response"]
        assert (response["allowed"], response["status"]["code"]) == (False, 400)
        assert field in response["status"]["message"]
