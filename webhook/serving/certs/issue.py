"""Making keys and certificates, and the checks that tell whether a certificate belongs to a key or a CA.

Keys are ECDSA P-256: kube-apiserver (Go) and OpenSSL support it, it is generated in microseconds where
RSA 2048 takes tens of milliseconds or more, and it gives smaller handshakes. Existing RSA (>= 2048 bit)
and other ECDSA keys are accepted and kept.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.serving.certs.names import ServingNames

CA_LIFETIME = timedelta(days=3650)
CLOCK_SKEW = timedelta(minutes=5)  # notBefore is backdated so a client whose clock lags still accepts it
CA_COMMON_NAME = "gpupool webhook CA"

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_description(key: PrivateKey) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return f"RSA {key.key_size}"
    return "ECDSA P-256" if isinstance(key.curve, ec.SECP256R1) else f"ECDSA {key.curve.name}"


def same_key(cert: x509.Certificate, key: PrivateKey) -> bool:
    """Is `cert` a certificate for `key` (the same public key)?"""
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)


def is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)  # issuer name and signature
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _key_usage(*, sign: bool, encipher: bool, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=sign,
        content_commitment=False,
        key_encipherment=encipher,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def issue_ca(key: PrivateKey, now: datetime) -> x509.Certificate:
    # A fixed name: a renewed CA with the same name and key still verifies certificates the old one signed.
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign=False, encipher=False, cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def issue_serving(
    key: PrivateKey,
    names: ServingNames,
    *,
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    days: int,
    now: datetime,
) -> x509.Certificate:
    public = key.public_key()
    try:
        ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        authority = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:
        authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names.dns]
    sans += [x509.IPAddress(ip) for ip in names.ips]
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names.common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # RSA key exchange (TLS 1.2 without ECDHE) encrypts with the key, so RSA keys also need
        # keyEncipherment; ECDSA keys only sign.
        .add_extension(
            _key_usage(sign=True, encipher=isinstance(key, rsa.RSAPrivateKey), cert_sign=False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(authority, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
