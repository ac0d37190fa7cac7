"""Reading what webhook.serving.certs wrote, and a TLS handshake like kube-apiserver's: shared by the
certificate tests of the library (tests/serving/test_certs.py) and of `gpupool certs`
(tests/commands/test_certs.py)."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

# The environment variables `gpupool certs` reads, each with the GPUPOOL_CERTS_ prefix.
ENV_VARS = ("OUT", "SERVICE", "NAMESPACE", "HOSTS", "DAYS")


def cert(directory: Path, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate((directory / name).read_bytes())


def public_der(directory: Path, key_name: str) -> bytes:
    key = serialization.load_pem_private_key((directory / key_name).read_bytes(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def cert_public_der(c: x509.Certificate) -> bytes:
    return c.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def sans(c: x509.Certificate) -> tuple[list[str], set[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    ext = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {
        ip
        for ip in ext.get_values_for_type(x509.IPAddress)
        if not isinstance(ip, ipaddress.IPv4Network | ipaddress.IPv6Network)
    }
    return ext.get_values_for_type(x509.DNSName), ips


def handshake(server_dir: Path, server_hostname: str, ca_dir: Path | None = None) -> bytes:
    """Complete a TLS handshake like kube-apiserver: verify against ca.crt with SNI; return the server cert.

    The client trusts only `ca_dir`/ca.crt (default: the server's) and checks the host name; raises
    ssl.SSLCertVerificationError when verification fails.
    """
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(server_dir / "tls.crt", server_dir / "tls.key")
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED by default
    client_ctx.load_verify_locations(cafile=ca_dir / "ca.crt" if ca_dir else server_dir / "ca.crt")
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # RFC 5280 conformance (key identifiers etc.)

    server_sock, client_sock = socket.socketpair()
    server_sock.settimeout(30)
    client_sock.settimeout(30)

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(server_sock, server_side=True) as tls:
                tls.sendall(tls.recv(4))
        except (ssl.SSLError, OSError):
            pass  # the client rejected the certificate; the client side reports it

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client_ctx.wrap_socket(client_sock, server_hostname=server_hostname) as tls:
            tls.sendall(b"ping")
            assert tls.recv(4) == b"ping"
            peer = tls.getpeercert(binary_form=True)
            assert peer is not None
            return peer
    finally:
        client_sock.close()
        thread.join(timeout=30)
        server_sock.close()
