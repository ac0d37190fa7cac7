"""`gpupool serve --client-ca`: only a client certificate from that CA is answered (the health port needs
none), and a changed CA file is picked up without a restart.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import (
    DEMO_INVENTORY,
    ServerProcess,
    free_port,
    health_get,
    serve_argv,
    server_env,
    wait_until,
)
from tests.serving.clientcerts import client_certificate, new_ca, refusal, refused_in_handshake

pytestmark = pytest.mark.slow


# --- client certificates (--client-ca) ---------------------------------------------------------------


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
