"""Tests for webhook.serving.server: the real `gpupool serve` in a subprocess, talked to like kube-apiserver.

One server (two workers, demo inventory) serves most tests of this module; certificate rotation, client
certificates (--client-ca), worker restarts and SIGTERM get servers of their own because they configure,
change or end them.
"""

from __future__ import annotations

import base64
import gc
import http.client
import os
import shutil
import signal
import socket
import ssl
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.builders import gpu_node, pod, quota
from tests.conftest import (
    DEMO_INVENTORY,
    NAMESPACE,
    REPO,
    SERVICE,
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
from webhook.serving.certs import ensure_certificates
from webhook.serving.server import freeze_when_ready
from webhook.testing.kubesim import KubeSim

pytestmark = pytest.mark.slow
MIB = 1024 * 1024


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


# --- client certificates (--client-ca) ---------------------------------------------------------------


def client_certificate(ca_dir: Path, out_dir: Path, name: str = "kube-apiserver") -> tuple[Path, Path]:
    """A client certificate (extendedKeyUsage clientAuth) for `name`, signed by ca_dir's ca.crt and ca.key,
    as the one kube-apiserver shows from its admission kubeconfig; returns (certificate, key) files."""
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        # Names the CA's key: with two CAs of the same name in one file (a rotation), OpenSSL picks by it.
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = out_dir / f"{name}.crt", out_dir / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    no_password = serialization.NoEncryption()
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, no_password))
    return cert_file, key_file


def new_ca(directory: Path) -> Path:
    """A fresh CA (ca.crt, ca.key) in `directory`, made by `gpupool certs`' own code."""
    ensure_certificates(directory, SERVICE, NAMESPACE)
    return directory


@dataclass
class CertClient(ApiServerClient):
    """An ApiServerClient that shows a client certificate, as kube-apiserver does with a kubeconfig user."""

    cert_files: tuple[Path, Path] | None = None

    def context(self) -> ssl.SSLContext:
        ctx = super().context()
        if self.cert_files is not None:
            ctx.load_cert_chain(*self.cert_files)
        return ctx


def refusal(port: int, ca_file: Path, cert_files: tuple[Path, Path] | None) -> ssl.SSLError | OSError | None:
    """How one admission over a new connection fails (the TLS error), or None when it is answered."""
    client = CertClient(port, ca_file, cert_files=cert_files)
    try:
        assert client.review(admission_review(gpu_pod(), dry_run=True))["response"]["allowed"] is True
    except (ssl.SSLError, OSError) as exc:  # the handshake's alert, or the reset connection after it
        return exc
    finally:
        client.close()
    return None


def refused_in_handshake(error: BaseException | None, reasons: tuple[str, ...]) -> bool:
    """The client saw the server's alert, or (the server closing right after sending it, under TLS 1.3
    where the client's side of the handshake is already done) the connection reset or ended."""
    return isinstance(error, ConnectionError | ssl.SSLEOFError) or getattr(error, "reason", None) in reasons


@dataclass
class MutualTls:
    server: ServerProcess
    port: int
    health_port: int
    ca_file: Path  # the serving certificate's CA, which the client trusts
    client: tuple[Path, Path]  # signed by the client CA the server was given
    stranger: tuple[Path, Path]  # signed by another CA with the very same name


@pytest.fixture(scope="module")
def mutual_tls(
    cert_dir: Path, tmp_path_factory: pytest.TempPathFactory, start_server: Callable[..., ServerProcess]
) -> MutualTls:
    """`gpupool serve` with GPUPOOL_CLIENT_CA set to a client CA of its own (not the serving CA)."""
    tmp = tmp_path_factory.mktemp("mtls")
    client_ca, other_ca = new_ca(tmp / "client-ca"), new_ca(tmp / "other-ca")
    port, health_port = free_port(), free_port()
    env = server_env(GPUPOOL_CLIENT_CA=str(client_ca / "ca.crt"))
    argv = serve_argv(cert_dir, port, health_port, "--inventory", str(DEMO_INVENTORY))
    server = start_server(argv, health_port, env=env)
    return MutualTls(
        server,
        port,
        health_port,
        cert_dir / "ca.crt",
        client_certificate(client_ca, tmp / "client"),
        client_certificate(other_ca, tmp / "stranger"),
    )


class TestClientCertificates:
    def test_a_client_without_a_certificate_is_refused(self, mutual_tls: MutualTls) -> None:
        """With --client-ca, a connection that shows no client certificate fails in the TLS handshake:
        anyone who merely reaches the port gets no admission answered (and reserves nothing)."""
        error = refusal(mutual_tls.port, mutual_tls.ca_file, None)
        # TLS 1.3 says certificate_required, 1.2 handshake_failure; or the reset right after the alert.
        reasons = ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE")
        assert refused_in_handshake(error, reasons), error
        # The worker logs it after closing the connection: wait for the line rather than race it.
        wait_until(lambda: "peer did not return a certificate" in mutual_tls.server.log(), 10, "the warning")

    def test_a_certificate_from_another_ca_is_refused(self, mutual_tls: MutualTls) -> None:
        """A client certificate signed by another CA (even one with the same name) is refused."""
        error = refusal(mutual_tls.port, mutual_tls.ca_file, mutual_tls.stranger)
        # The same issuer name leads OpenSSL to the client CA, whose signature check then fails.
        reasons = ("TLSV1_ALERT_DECRYPT_ERROR", "TLSV1_ALERT_UNKNOWN_CA")
        assert refused_in_handshake(error, reasons), error

    def test_a_certificate_from_the_client_ca_is_answered_and_health_needs_none(self, mutual_tls: MutualTls) -> None:
        """kube-apiserver's certificate, signed by the --client-ca, gets its answers; the plain-HTTP
        health port (probes, Prometheus) asks for no certificate."""
        assert refusal(mutual_tls.port, mutual_tls.ca_file, mutual_tls.client) is None
        assert health_get(mutual_tls.health_port, "/readyz")[0] == 200
        assert health_get(mutual_tls.health_port, "/metrics")[0] == 200


def test_a_changed_client_ca_file_is_picked_up_without_a_restart(
    cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """The --client-ca file is re-read like a rotated serving certificate: new handshakes follow it
    (old CA, then both during a rotation, then the new one alone), and a file that does not load
    (caught mid-write) keeps the previous CA instead of refusing everyone."""
    old_ca, next_ca = new_ca(tmp_path / "old-ca"), new_ca(tmp_path / "next-ca")
    old_client = client_certificate(old_ca, tmp_path / "old-client")
    next_client = client_certificate(next_ca, tmp_path / "next-client")
    bundle = tmp_path / "client-ca" / "ca.crt"
    bundle.parent.mkdir()

    def put(data: bytes) -> None:  # as the kubelet updates a mounted ConfigMap: a new file, renamed over
        staged = bundle.with_name("staged")
        staged.write_bytes(data)
        os.replace(staged, bundle)

    old_pem, next_pem = (old_ca / "ca.crt").read_bytes(), (next_ca / "ca.crt").read_bytes()
    put(old_pem)
    port, health_port = free_port(), free_port()
    argv = serve_argv(cert_dir, port, health_port, "--inventory", str(DEMO_INVENTORY), "--client-ca", str(bundle))
    server = start_server(argv, health_port)
    ca = cert_dir / "ca.crt"

    def answered() -> tuple[bool, bool]:
        return refusal(port, ca, old_client) is None, refusal(port, ca, next_client) is None

    assert answered() == (True, False)
    put(b"-----BEGIN CERTIFICATE-----\nhalf written")
    assert answered() == (True, False)
    assert "keeping the previous certificate" in server.log()
    put(old_pem + next_pem)
    assert answered() == (True, True)
    put(next_pem)
    assert answered() == (False, True)


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

    def test_declared_length_over_3_mib_is_413_before_reading(self, served: Served) -> None:
        """A Content-Length over 3 MiB is refused from the headers alone, without waiting for the body."""
        client = served.client()
        try:
            conn = client.connection
            conn.putrequest("POST", "/mutate?timeout=10s")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(3 * MIB + 1))
            conn.endheaders(b"{")
            resp = conn.getresponse()
            assert resp.status == 413 and self.status_of(resp.read())["code"] == 413
        finally:
            client.close()

    def test_chunked_body_over_3_mib_is_413(self, served: Served) -> None:
        """A chunked body (no Content-Length) is cut off at 3 MiB with 413."""
        client = served.client()

        def chunks() -> Iterator[bytes]:
            for _ in range(3 * 16 + 1):
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


def serial_of(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


class Traffic:
    """Background clients: one keeps its connection, one reconnects for every request (new handshakes)."""

    def __init__(self, port: int, ca_file: Path) -> None:
        self.port, self.ca_file = port, ca_file
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(reconnect,)) for reconnect in (False, True)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _run(self, reconnect: bool) -> None:
        client = ApiServerClient(self.port, self.ca_file)
        while not self._stop.is_set():
            try:
                response = client.review(admission_review(gpu_pod(), dry_run=True))["response"]
                assert response["allowed"] is True
                with self._lock:
                    self.ok += 1
            except Exception as exc:  # every failure is collected and reported by the test
                with self._lock:
                    self.failures.append(repr(exc))
                client.close()
            if reconnect:
                client.close()
        client.close()


def new_connection_serial(port: int, ca_file: Path) -> int:
    client = ApiServerClient(port, ca_file)
    try:
        client.review(admission_review(gpu_pod(), dry_run=True))
        return serial_of(client.peer_certificate())
    finally:
        client.close()


def test_certificate_rotation_under_traffic(
    cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """Replaced certificate files take effect for new handshakes, with zero failed requests.

    First a renewal that keeps the key (only tls.crt is replaced), then a new key and certificate
    replaced one file after the other, so for a moment the files do not match.
    """
    certs = tmp_path / "certs"
    shutil.copytree(cert_dir, certs)
    port, health_port = free_port(), free_port()
    server = start_server(serve_argv(certs, port, health_port, "--inventory", str(DEMO_INVENTORY)), health_port)
    ca = certs / "ca.crt"
    serials = [new_connection_serial(port, ca)]
    with Traffic(port, ca) as traffic:
        wait_until(lambda: traffic.ok >= 20, 60, "traffic before the rotation")
        ensure_certificates(certs, SERVICE, NAMESPACE, hosts=["localhost", "127.0.0.1", "webhook.example"])
        wait_until(lambda: new_connection_serial(port, ca) != serials[-1], 60, "the renewed certificate")
        serials.append(new_connection_serial(port, ca))

        staged = tmp_path / "staged"
        staged.mkdir()
        for name in ("ca.crt", "ca.key"):
            shutil.copy2(certs / name, staged / name)
        ensure_certificates(staged, SERVICE, NAMESPACE, hosts=["localhost", "127.0.0.1"])  # new key
        before = traffic.ok
        os.replace(staged / "tls.key", certs / "tls.key")
        wait_until(lambda: traffic.ok >= before + 20, 60, "traffic while key and certificate differ")
        os.replace(staged / "tls.crt", certs / "tls.crt")
        wait_until(lambda: new_connection_serial(port, ca) != serials[-1], 60, "the new key's certificate")
        serials.append(new_connection_serial(port, ca))
        done = traffic.ok
        wait_until(lambda: traffic.ok >= done + 20, 60, "traffic after the rotation")
    assert traffic.failures == []
    assert len(set(serials)) == 3
    assert "keeping the previous certificate" in server.log()  # the mismatched moment was served


def test_a_new_worker_forked_mid_rotation_serves_with_the_previous_certificate(
    cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """A worker forked while tls.key already belongs to the next certificate and tls.crt does not yet
    (a restart after a crash, during a Secret rotation) still completes its very first handshake."""
    certs = tmp_path / "certs"
    shutil.copytree(cert_dir, certs)
    port, health_port = free_port(), free_port()
    server = start_server(
        serve_argv(certs, port, health_port, "--inventory", str(DEMO_INVENTORY), "--workers", "1"), health_port
    )
    ca = certs / "ca.crt"
    serial = new_connection_serial(port, ca)
    staged = tmp_path / "staged"
    staged.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copy2(certs / name, staged / name)
    ensure_certificates(staged, SERVICE, NAMESPACE, hosts=["localhost", "127.0.0.1"])
    os.replace(staged / "tls.key", certs / "tls.key")  # the key of a certificate not yet in place

    replace_the_worker(server)
    assert new_connection_serial(port, ca) == serial
    assert "keeping the previous certificate" in server.log()


def replace_the_worker(server: ServerProcess) -> None:
    """SIGKILL the server's only worker and wait until the master's replacement is ready."""
    assert server.health_port is not None and server.proc is not None
    health_port, proc = server.health_port, server.proc
    (old_worker,) = orjson.loads(health_get(health_port, "/readyz")[1])["workers"]
    os.kill(int(old_worker), signal.SIGKILL)

    def new_worker_ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the master exited with {proc.returncode}:\n{server.log()}")
        status, body, _ = health_get(health_port, "/readyz")
        workers = orjson.loads(body).get("workers", {}) if body else {}
        return status == 200 and old_worker not in workers

    wait_until(new_worker_ready, 60, "a new worker")


def test_a_replacement_worker_serves_what_the_master_loaded_at_start(
    cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """The inventory and policy files are read once, by the master, before it forks: after both files
    turned to garbage, a killed worker's replacement still boots and answers from what was loaded at
    start, and the master keeps running."""
    inventory, policy = tmp_path / "cluster.yaml", tmp_path / "policy.yaml"
    shutil.copy(DEMO_INVENTORY, inventory)
    shutil.copy(REPO / "examples" / "policy.yaml", policy)
    port, health_port = free_port(), free_port()
    argv = serve_argv(cert_dir, port, health_port, "--inventory", str(inventory), "--policy", str(policy))
    server = start_server([*argv, "--workers", "1"], health_port)
    # students get class low by default from examples/policy.yaml; the built-in policy has no default.
    pod = gpu_pod(namespace="students", annotations={"gpupool.io/gpu-count": "1"})

    def answer() -> dict[str, Any]:
        client = ApiServerClient(port, cert_dir / "ca.crt")
        try:
            response: dict[str, Any] = client.review(admission_review(pod, uid="same", dry_run=True))["response"]
            return response
        finally:
            client.close()

    before = answer()
    assert before["auditAnnotations"]["pool"].startswith("nvidia/low/")
    inventory.write_text("kind: List\nitems: [{kind: Node}]\n", encoding="utf-8")
    policy.write_text("classes: 7\n", encoding="utf-8")
    replace_the_worker(server)
    assert answer() == before
    assert server.proc is not None and server.proc.poll() is None


SLOW_SERVER = textwrap.dedent(
    """
    # A server on gpupool's own gunicorn settings whose Admitter takes a while and marks each request.
    import pathlib, sys, time
    from webhook.serving.server import ServeOptions, WorkerApp, serve
    from webhook.admission.verdict import allow

    cert, key, port, health_port, marks = sys.argv[1:6]

    class SlowAdmitter:
        def admit(self, pod, *, namespace, dry_run=False):
            name = pod["metadata"]["name"]
            (pathlib.Path(marks) / name).touch()
            time.sleep(2)
            return allow(f"slowly {name}")

    def load():
        from webhook.serving.app import AppConfig, create_app
        from webhook.serving.metrics import Metrics
        metrics = Metrics.private()
        metrics.inventory_ready.set(1)
        return WorkerApp(create_app(AppConfig(admitter=SlowAdmitter(), metrics=metrics)))

    options = ServeOptions(cert=cert, key=key, inventory=None, policy=None, host="127.0.0.1",
                           port=int(port), health_port=int(health_port), workers=1, threads=4)
    sys.exit(serve(options, load))
    """
)


def test_sigterm_finishes_in_flight_requests(
    cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """SIGTERM while four admissions are in the Admitter: all four are answered, then the server exits 0."""
    port, health_port = free_port(), free_port()
    marks = tmp_path / "marks"
    marks.mkdir()
    argv = [
        sys.executable,
        "-c",
        SLOW_SERVER,
        str(cert_dir / "tls.crt"),
        str(cert_dir / "tls.key"),
        str(port),
        str(health_port),
        str(marks),
    ]
    server = start_server(argv, health_port)
    answers: dict[str, Any] = {}

    def call(name: str) -> None:
        client = ApiServerClient(port, cert_dir / "ca.crt")
        try:
            answers[name] = client.review(admission_review(gpu_pod(name=name), uid=name))["response"]
        except (OSError, http.client.HTTPException, AssertionError) as exc:
            answers[name] = exc
        finally:
            client.close()

    names = [f"pod-{i}" for i in range(4)]
    threads = [threading.Thread(target=call, args=(n,)) for n in names]
    for t in threads:
        t.start()
    wait_until(lambda: len(list(marks.iterdir())) == 4, 60, "four requests inside the Admitter")
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert answers == {n: {"uid": n, "allowed": True} for n in names}
    assert server.proc.wait(60) == 0


class TestLiveInventory:
    """Without --inventory the server watches the cluster: here the API simulator, through a kubeconfig."""

    def test_serves_from_the_live_cluster_with_burst_safety(
        self, cert_dir: Path, start_server: Callable[..., ServerProcess], tmp_path: Path
    ) -> None:
        """Ready after the first list; placements follow the cluster; admissions reserve their GPUs."""
        with KubeSim(bookmark_interval=0.5) as sim:
            sim.load([gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034)])
            kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
            port, health_port = free_port(), free_port()
            argv = serve_argv(cert_dir, port, health_port, "--kubeconfig", str(kubeconfig))
            server = start_server(argv, health_port)
            client = ApiServerClient(port, cert_dir / "ca.crt")
            try:
                medium = gpu_pod(annotations={"gpupool.io/gpu-class": "medium"})
                answers = [client.review(admission_review(medium))["response"] for _ in range(5)]
                assert [a["auditAnnotations"]["pool"] for a in answers] == ["nvidia/medium/NVIDIA-L4"] * 5
                assert [bool(a.get("warnings")) for a in answers] == [False] * 4 + [True]  # 4 free GPUs
                high = gpu_pod(annotations={"gpupool.io/gpu-class": "high"})
                assert not client.review(admission_review(high))["response"]["allowed"]
                sim.add(gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, gpu_class="high", memory_mib=40960))
                wait_until(
                    lambda: client.review(admission_review(high, dry_run=True))["response"]["allowed"],
                    20,
                    "the new node in the server's decisions",
                )
            finally:
                client.close()
                server.stop()


def job_review(job: str, i: int, *, namespace: str = "ml", gpus: int = 1) -> dict[str, Any]:
    """The review kube-apiserver sends when a Job controller creates its i-th Pod: generateName only, the
    Job as controller owner, no gpupool.io/group annotation (the Job groups them)."""
    pod = gpu_pod(name=None, generate_name=f"{job}-", namespace=namespace,
                  annotations={"gpupool.io/min-memory": "1Gi", "gpupool.io/gpu-count": str(gpus)})  # fmt: skip
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"uid-{job}", "controller": True}
    ]
    return admission_review(pod, uid=f"{job}-{i}", namespace=namespace)


LIVE_POLICY = "namespaces: {vision: {memoryQuota: 48Gi}}\n"


@pytest.fixture(scope="class")
def live(
    cert_dir: Path, start_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KubeSim, ApiServerClient, ServerProcess]]:
    """`gpupool serve` on the API simulator: two pools the ranking cannot tell apart (same class, same
    memory per GPU; 16 GPUs each), a ResourceQuota in the tutorial's form in team-b (1 of 4 GPUs used)
    and a 48Gi GPU-memory quota for vision."""
    tmp = tmp_path_factory.mktemp("live")
    (tmp / "policy.yaml").write_text(LIVE_POLICY)
    with KubeSim(bookmark_interval=0.5) as sim:
        sim.load([
                *(gpu_node(f"a10-{i}", "NVIDIA-A10", 8, memory_mib=23034) for i in range(2)),
                *(gpu_node(f"l4-{i}", "NVIDIA-L4", 8, memory_mib=23034) for i in range(2)),
                quota("compute-resources", "team-b", {"nvidia.com/gpu": "4"}),
                pod("inference", "team-b", gpus=1, node="l4-1", phase="Running"),
            ])  # fmt: skip
        kubeconfig = sim.write_kubeconfig(tmp / "kubeconfig")
        port, health_port = free_port(), free_port()
        argv = serve_argv(
            cert_dir, port, health_port, "--kubeconfig", str(kubeconfig), "--policy", str(tmp / "policy.yaml")
        )
        server = start_server(argv, health_port)
        client = ApiServerClient(port, cert_dir / "ca.crt")
        try:
            yield sim, client, server
        finally:
            client.close()
            server.stop()


class TestGroupsAndQuotasLive:
    """The server on the live inventory (the API simulator): a workload's burst stays on one pool, and the
    quota forms and the GPU-memory quota are enforced, as kube-apiserver would see it."""

    def test_a_burst_of_16_job_pods_lands_on_one_pool_while_it_has_room(
        self, live: tuple[KubeSim, ApiServerClient, ServerProcess]
    ) -> None:
        """16 Pods of one Job, sent back to back, none of them created in the cluster (the watch shows
        none): every one goes to the same pool, which has exactly 16 free GPUs, with no warning; the 17th
        finds it full and is placed on the other pool, saying the group is split. Each admission line
        names the group. (Without groups the ranking alternates between the two pools.)"""
        sim, client, server = live
        answers = [client.review(job_review("train", i))["response"] for i in range(17)]
        pools = [a["auditAnnotations"]["pool"] for a in answers]
        assert len(set(pools[:16])) == 1, pools
        assert pools[16] != pools[0]
        assert all("warnings" not in a for a in answers[:16])
        first, other = pools[0].rsplit("/", 1)[1], pools[16].rsplit("/", 1)[1]
        assert answers[16]["warnings"] == [f"gpupool: group Job/train split across pools {first} and {other}"]
        assert sim.open_watches("pods") >= 1  # watching, and none of the Pods was created in the cluster

        def logged() -> bool:
            return sum(e.get("group") == "Job/train" for e in server.log_lines()) == 17

        wait_until(logged, 30, "17 admission lines naming the group")

    def test_the_tutorials_quota_form_is_enforced(self, live: tuple[KubeSim, ApiServerClient, ServerProcess]) -> None:
        """team-b's `nvidia.com/gpu: 4`: 3 more GPUs fit beside the 1 a running Pod holds; then 4 more do
        not (403: used 1 + 3 just admitted), and the message says Kubernetes does not enforce the form."""
        _, client, _ = live
        fits = client.review(job_review("eval", 0, namespace="team-b", gpus=3))["response"]
        assert fits["allowed"] is True, fits
        denied = client.review(job_review("eval-4", 0, namespace="team-b", gpus=4))["response"]
        assert (denied["allowed"], denied["status"]["code"]) == (False, 403)
        assert denied["status"]["message"].startswith(
            "exceeded quota compute-resources in namespace team-b: nvidia.com/gpu used 4 + requested 4 > hard 4; "
            "Kubernetes does not enforce"
        )

    def test_the_memory_quota_is_enforced(self, live: tuple[KubeSim, ApiServerClient, ServerProcess]) -> None:
        """vision may hold 48Gi of GPU memory: two 22.5Gi GPUs fit, a third does not."""
        _, client, _ = live
        assert client.review(job_review("seg", 0, namespace="vision", gpus=2))["response"]["allowed"] is True
        denied = client.review(job_review("seg", 1, namespace="vision"))["response"]
        assert (denied["allowed"], denied["status"]["code"]) == (False, 403)
        assert denied["status"]["message"] == (
            "GPU memory quota in namespace vision exceeded: used 46068Mi + requested 23034Mi > hard 48Gi"
        )


class TestGcFreeze:
    """The worker's start-up objects are frozen out of full collections once its inventory is loaded."""

    class FakeInventory:
        def __init__(self, ready: bool) -> None:
            self.ready = ready

    @pytest.fixture(autouse=True)
    def unfrozen(self) -> Iterator[None]:
        gc.unfreeze()
        yield
        gc.unfreeze()  # the test process's objects go back to normal collection

    def test_a_loaded_inventory_freezes_at_once(self) -> None:
        freeze_when_ready(self.FakeInventory(ready=True))
        assert gc.get_freeze_count() > 0

    def test_a_live_inventory_freezes_after_its_first_sync(self) -> None:
        inventory = self.FakeInventory(ready=False)
        freeze_when_ready(inventory, poll_seconds=0.01)
        time.sleep(0.1)
        assert gc.get_freeze_count() == 0, "nothing is frozen before the inventory is loaded"
        inventory.ready = True
        wait_until(lambda: gc.get_freeze_count() > 0, 10, "the freeze after the first sync")
