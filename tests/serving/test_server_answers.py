"""Tests for webhook.serving.server: the real `gpupool serve` in a subprocess, talked to like kube-apiserver.

One server (two workers, demo inventory) serves every test of this module: TLS as kube-apiserver
verifies it, the AdmissionReview answers, bad input, the health port and the log. Client certificates
(test_server_client_ca.py), certificate rotation, worker restarts and SIGTERM (test_server_restarts.py)
and the live inventory (test_server_live.py) get servers of their own because they configure, change
or end them.
"""

from __future__ import annotations

import base64
import socket
import ssl
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
import yaml

from tests.conftest import (
    DEMO_INVENTORY,
    REPO,
    SERVICE_DNS,
    ApiServerClient,
    ServerProcess,
    admission_review,
    free_port,
    gpu_pod,
    health_get,
    serve_argv,
    server_env,
    wait_until,
)
from tests.serving.clientcerts import client_certificate, new_ca, refusal
from webhook.serving.app import MAX_BODY_BYTES

pytestmark = pytest.mark.slow


@dataclass
class Served:
    server: ServerProcess
    port: int
    health_port: int
    cert_dir: Path

    def client(self) -> ApiServerClient:
        return ApiServerClient(self.port, self.cert_dir / "ca.crt")


@pytest.fixture(scope="module")
def served(cert_dir: Path, start_server: Callable[..., ServerProcess]) -> Served:
    """`gpupool serve` on the demo inventory with 2 workers, configured partly by environment variables.

    GPUPOOL_PORT names a wrong port on purpose: the --port flag must win over it.
    """
    port, health_port = free_port(), free_port()
    env = server_env(GPUPOOL_WORKERS="2", GPUPOOL_THREADS="4", GPUPOOL_PORT="1", GPUPOOL_INVENTORY=str(DEMO_INVENTORY))
    server = start_server(serve_argv(cert_dir, port, health_port), health_port, env=env)
    return Served(server, port, health_port, cert_dir)


@pytest.fixture
def client(served: Served) -> Iterator[ApiServerClient]:
    c = served.client()
    yield c
    c.close()


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = orjson.loads(base64.b64decode(response["patch"]))
    return patch


class TestTransport:
    def test_tls_verified_for_the_service_name_and_connection_kept_alive(self, client: ApiServerClient) -> None:
        """The certificate verifies for gpupool-webhook.gpupool-system.svc; one TLS connection serves many."""
        client.review(admission_review(gpu_pod(), dry_run=True))
        sock = client.connection.sock
        for _ in range(5):
            client.review(admission_review(gpu_pod(), dry_run=True))
        assert client.connection.sock is sock
        assert isinstance(sock, ssl.SSLSocket) and sock.version() in ("TLSv1.2", "TLSv1.3")

    def test_tls_below_1_2_is_refused(self, served: Served) -> None:
        """A client limited to TLS 1.1 is refused by the server (its protocol-version alert)."""
        ctx = ssl.create_default_context(cafile=str(served.cert_dir / "ca.crt"))
        with warnings.catch_warnings():  # TLS 1.1 is deprecated in Python: that is the point here
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # so the refusal is the server's, not this client's
        with (
            socket.create_connection(("127.0.0.1", served.port), timeout=30) as raw,
            pytest.raises(ssl.SSLError) as info,
        ):
            ctx.wrap_socket(raw, server_hostname=SERVICE_DNS)
        assert info.value.reason == "TLSV1_ALERT_PROTOCOL_VERSION"

    def test_without_client_ca_no_client_certificate_is_checked(self, served: Served, tmp_path: Path) -> None:
        """Without --client-ca the server asks for no client certificate: clients with none, and clients
        with one from any CA, are answered alike."""
        stranger = client_certificate(new_ca(tmp_path / "ca"), tmp_path / "client")
        assert refusal(served.port, served.cert_dir / "ca.crt", stranger) is None
        assert refusal(served.port, served.cert_dir / "ca.crt", None) is None

    def test_wrong_service_name_does_not_verify(self, served: Served) -> None:
        """The certificate is for the webhook's Service only: another name fails verification."""
        other = ApiServerClient(served.port, served.cert_dir / "ca.crt", server_name="other.default.svc")
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                other.review(admission_review(gpu_pod(), dry_run=True))
        finally:
            other.close()


class TestResponseContract:
    def test_gpu_pod_is_mutated_and_the_patch_applies(self, client: ApiServerClient) -> None:
        """apiVersion/kind echoed, uid echoed, JSONPatch in base64 that applies and names the audit pool."""
        pod = gpu_pod()
        result = client.review(admission_review(pod, uid="contract-1"))
        assert (result["apiVersion"], result["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
        response = result["response"]
        assert (response["uid"], response["allowed"], response["patchType"]) == ("contract-1", True, "JSONPatch")
        patched = jsonpatch.apply_patch(pod, decoded_patch(response))
        assert patched["metadata"]["annotations"]["gpupool.io/pool"] == response["auditAnnotations"]["pool"]
        assert "status" not in response
        assert all(len(w) <= 120 for w in response.get("warnings", []))

    @pytest.mark.parametrize("name", ["admissionreview.json", "admissionreview-v1beta1.json"])
    def test_sample_reviews_from_examples(self, client: ApiServerClient, name: str) -> None:
        """The README's sample AdmissionReviews are answered in their version and the patch applies."""
        review = orjson.loads((REPO / "examples" / name).read_bytes())
        review["request"]["dryRun"] = True  # leave the module's shared server without reservations
        result = client.review(review)
        response = result["response"]
        assert result["apiVersion"] == review["apiVersion"] and response["uid"] == review["request"]["uid"]
        patched = jsonpatch.apply_patch(review["request"]["object"], decoded_patch(response))
        assert patched["metadata"]["annotations"]["gpupool.io/pool"] == response["auditAnnotations"]["pool"]

    def test_a_mig_pod_gets_its_instance_through_the_server(self, client: ApiServerClient, served: Served) -> None:
        """Issue 10 end to end: examples/pods/device-mig.yaml over TLS is pinned to a 3g.20gb MIG instance,
        its own resource added; /metrics gauges that pool by its device product."""
        pod = yaml.safe_load((REPO / "examples" / "pods" / "device-mig.yaml").read_text("utf-8"))
        response = client.review(admission_review(pod, namespace="ml-train", dry_run=True))["response"]
        pool = "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb"
        assert (response["allowed"], response["auditAnnotations"]["pool"]) == (True, pool)
        patched = jsonpatch.apply_patch(pod, decoded_patch(response))
        assert patched["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.20gb"] == "1"
        _, body, _ = health_get(served.health_port, "/metrics")
        assert f'gpupool_pool_gpus{{pool="{pool}"}} 4.0' in body.decode()

    def test_v1beta1_is_answered_in_v1beta1(self, client: ApiServerClient) -> None:
        """An admission.k8s.io/v1beta1 review gets a v1beta1 answer."""
        result = client.review(admission_review(gpu_pod(), api_version="admission.k8s.io/v1beta1", dry_run=True))
        assert result["apiVersion"] == "admission.k8s.io/v1beta1" and result["response"]["allowed"] is True

    def test_impossible_request_is_denied_with_status(self, client: ApiServerClient) -> None:
        """A Pod no pool can satisfy is refused with status {code, message} and no patch."""
        pod = gpu_pod(annotations={"gpupool.io/min-memory": "4Ti"})
        response = client.review(admission_review(pod, uid="deny-1"))["response"]
        assert response["allowed"] is False and response["uid"] == "deny-1"
        assert response["status"]["code"] in (400, 403) and response["status"]["message"]
        assert "patch" not in response and "patchType" not in response

    def test_bad_annotation_is_denied_as_invalid(self, client: ApiServerClient) -> None:
        """A malformed gpupool annotation is refused with code 400 and a message naming it."""
        pod = gpu_pod(annotations={"gpupool.io/min-memory": "lots"})
        response = client.review(admission_review(pod))["response"]
        assert response["allowed"] is False and response["status"]["code"] == 400
        assert "min-memory" in response["status"]["message"]


class TestRequestKinds:
    @pytest.mark.parametrize(
        "review",
        [
            pytest.param(admission_review(gpu_pod(), operation="UPDATE"), id="update"),
            pytest.param(admission_review(gpu_pod(), operation="DELETE"), id="delete"),
            pytest.param(admission_review(gpu_pod(), sub_resource="status"), id="subresource"),
            pytest.param(
                admission_review({"kind": "Deployment"}, resource="deployments", group="apps"), id="other-resource"
            ),
            pytest.param(admission_review(gpu_pod(annotations={"kubernetes.io/config.mirror": "x"})), id="mirror"),
            pytest.param(admission_review(gpu_pod(node_name="gpu-node-1")), id="node-name"),
        ],
    )
    def test_allowed_unchanged(self, client: ApiServerClient, review: dict[str, Any]) -> None:
        """Requests that are not an unscheduled Pod CREATE are allowed with no patch."""
        assert client.review(review)["response"] == {"uid": review["request"]["uid"], "allowed": True}

    def test_dry_run_gets_the_same_answer_as_a_real_request(self, client: ApiServerClient) -> None:
        """A dry run answers what the real request then answers (same worker: one kept-alive connection)."""
        pod = gpu_pod(name="dry-then-real")
        dry = client.review(admission_review(pod, uid="same", dry_run=True))
        real = client.review(admission_review(pod, uid="same"))
        assert dry == real

    def test_generate_name_only_pod_without_namespace_is_placed(self, client: ApiServerClient) -> None:
        """A Pod with only generateName and no namespace in its metadata is placed (namespace from request)."""
        pod = gpu_pod(name=None, generate_name="job-", namespace=None)
        response = client.review(admission_review(pod, namespace="ml", dry_run=True))["response"]
        assert response["allowed"] is True and response["patchType"] == "JSONPatch"


class TestBadInput:
    def status_of(self, reply_body: bytes) -> dict[str, Any]:
        status: dict[str, Any] = orjson.loads(reply_body)
        assert status["kind"] == "Status"
        return status

    @pytest.mark.parametrize(
        ("body", "code"),
        [
            pytest.param(b"this is not json", 400, id="not-json"),
            pytest.param(b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', 400, id="no-request"),
            pytest.param(
                b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}', 400, id="no-uid"
            ),
        ],
    )
    def test_malformed_body(self, client: ApiServerClient, body: bytes, code: int) -> None:
        """Malformed calls get a JSON Status with the code, and the connection stays usable."""
        reply = client.post(body)
        assert reply.status == code and self.status_of(reply.body)["code"] == code
        assert client.review(admission_review(gpu_pod(), dry_run=True))["response"]["allowed"] is True

    def test_wrong_content_type_is_415(self, client: ApiServerClient) -> None:
        """A body sent as text/plain is refused with 415 JSON."""
        reply = client.post(orjson.dumps(admission_review(gpu_pod())), content_type="text/plain")
        assert reply.status == 415 and self.status_of(reply.body)["code"] == 415

    def test_declared_length_over_the_limit_is_413_before_reading(self, served: Served) -> None:
        """A Content-Length over MAX_BODY_BYTES is refused from the headers alone, without waiting for the body."""
        client = served.client()
        try:
            conn = client.connection
            conn.putrequest("POST", "/mutate?timeout=10s")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
            conn.endheaders(b"{")
            resp = conn.getresponse()
            assert resp.status == 413 and self.status_of(resp.read())["code"] == 413
        finally:
            client.close()

    def test_chunked_body_over_the_limit_is_413(self, served: Served) -> None:
        """A chunked body (no Content-Length) is cut off at MAX_BODY_BYTES with 413."""
        client = served.client()

        def chunks() -> Iterator[bytes]:
            for _ in range(MAX_BODY_BYTES // (64 * 1024) + 1):
                yield b" " * (64 * 1024)

        try:
            reply = client.post(chunks(), chunked=True)
        finally:
            client.close()
        assert reply.status == 413 and self.status_of(reply.body)["code"] == 413

    @pytest.mark.parametrize(
        ("method", "path", "code"),
        [("GET", "/mutate", 405), ("GET", "/validate", 405), ("POST", "/admit", 404), ("GET", "/metrics", 404)],
    )
    def test_not_found_and_wrong_method_are_json(
        self, client: ApiServerClient, method: str, path: str, code: int
    ) -> None:
        """The TLS port serves POST /mutate and POST /validate only; everything else is a JSON 404 or 405."""
        reply = client.post(b"{}", method=method, path=path)
        assert reply.status == code and self.status_of(reply.body)["code"] == code


class TestHealthPort:
    def test_healthz_and_readyz_with_every_worker(self, served: Served) -> None:
        """/healthz is ok; /readyz is ready and lists both workers as ready."""
        assert health_get(served.health_port, "/healthz")[0] == 200
        status, body, _ = health_get(served.health_port, "/readyz")
        ready = orjson.loads(body)
        assert status == 200 and ready["ready"] is True
        assert len(ready["workers"]) == 2 and all(ready["workers"].values())

    def test_metrics_count_admissions_across_workers(self, served: Served) -> None:
        """/metrics adds up both workers' admissions and shows the pool gauges and inventory state."""
        clients = [served.client() for _ in range(4)]  # several connections: both workers take some
        for c in clients:
            c.review(admission_review(gpu_pod(annotations={"gpupool.io/min-memory": "4Ti"})))
            c.close()
        status, body, ctype = health_get(served.health_port, "/metrics")
        text = body.decode()
        assert status == 200 and ctype.startswith("text/plain")
        denied = [line for line in text.splitlines() if line.startswith('gpupool_admissions_total{outcome="denied"')]
        assert denied and float(denied[0].split()[-1]) >= 4
        for name in (
            "gpupool_pool_gpus_free{",
            "gpupool_pool_nodes{",
            "gpupool_inventory_age_seconds",
            "gpupool_admission_duration_seconds_bucket",
            "gpupool_inventory_ready{",
        ):
            assert name in text, name


class TestLog:
    def test_every_line_is_json_and_admissions_have_their_fields(self, served: Served, client: ApiServerClient) -> None:
        """Each log line is a JSON object; an admission line has uid, namespace, pod, outcome, pool, latency."""
        client.review(admission_review(gpu_pod(name="logged"), uid="log-uid-1", dry_run=True))

        def logged() -> bool:
            return any(e.get("uid") == "log-uid-1" for e in served.server.log_lines())

        wait_until(logged, 30, "the admission log line")
        [line] = [e for e in served.server.log_lines() if e.get("uid") == "log-uid-1"]
        assert (line["namespace"], line["pod"], line["outcome"], line["dry_run"]) == ("ml", "logged", "mutated", True)
        assert line["pool"] and line["latency_ms"] > 0
        assert "registry.example" not in served.server.log()  # the Pod body is never logged
        # gunicorn's access log is off: the admission line is the one line per request
        assert not [e for e in served.server.log_lines() if e.get("logger") == "gunicorn.access"]
