"""Client certificates for kube-apiserver signed by a CA of the test's own, a client that presents one,
and how a TLS handshake was refused (the tests of --client-ca, here and in tests/commands/test_serve.py).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.conftest import (
    NAMESPACE,
    SERVICE,
    ApiServerClient,
    admission_review,
    gpu_pod,
)
from webhook.serving.certs import ensure_certificates


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
