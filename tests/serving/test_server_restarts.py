"""The server through change: certificates rotated under traffic, workers forked mid-rotation or
replaced, and SIGTERM finishing the requests in flight.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from cryptography import x509

from tests.conftest import (
    DEMO_INVENTORY,
    NAMESPACE,
    REPO,
    SERVICE,
    ApiServerClient,
    ServerProcess,
    admission_review,
    free_port,
    gpu_pod,
    health_get,
    serve_argv,
    wait_until,
)
from webhook.serving.certs import ensure_certificates

pytestmark = pytest.mark.slow


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
    from webhook.serving.gunicorn_app import WorkerApp
    from webhook.serving.server import ServeOptions, serve
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
