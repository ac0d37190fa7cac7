"""The webhook's CA and serving certificate: created, renewed, and (for --client-ca) read.

`ensure_certificates` makes a directory hold a usable `ca.crt`/`ca.key` and `tls.crt`/`tls.key`,
changing as little as possible: valid files are kept byte for byte, so it can run on every start.

Rotation never shows a reader a certificate and key that do not belong together. The server re-reads
`tls.crt` and `tls.key` for each new connection, and two files cannot be replaced in one step, so a
renewal keeps `tls.key` and replaces only `tls.crt` (one atomic rename). A new key is generated only when
`tls.key` is missing, and it is written before its certificate. Likewise a CA renewal keeps `ca.key` and
the CA name, so old and new `ca.crt` both verify old and new serving certificates while a `caBundle`
rolls over.

Keys are ECDSA P-256: kube-apiserver (Go) and OpenSSL support it, it is generated in microseconds where
RSA 2048 takes tens of milliseconds or more, and it gives smaller handshakes. Existing RSA (>= 2048 bit)
and other ECDSA keys are accepted and kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.domain.errors import ConfigError

CA_KEY, CA_CERT, TLS_KEY, TLS_CERT = "ca.key", "ca.crt", "tls.key", "tls.crt"
DEFAULT_OUT, DEFAULT_SERVICE, DEFAULT_NAMESPACE = "certs", "gpupool-webhook", "gpupool-system"
DEFAULT_DAYS = 365
CA_LIFETIME = timedelta(days=3650)
MAX_DAYS = 3650  # a serving certificate should not outlive the CA that signs it
RENEW_WITHIN = timedelta(days=30)
CLOCK_SKEW = timedelta(minutes=5)  # notBefore is backdated so a client whose clock lags still accepts it
CA_COMMON_NAME = "gpupool webhook CA"
KEY_MODE, CERT_MODE = 0o600, 0o644

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS_1123_LABEL = re.compile(_LABEL)
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


class CertError(ConfigError):
    """A certificate or key file that cannot be used or written; the message names the file."""


class Action(StrEnum):
    CREATED = "created"
    KEPT = "kept"
    RENEWED = "renewed"


@dataclass(frozen=True)
class FileAction:
    """What happened to one file, and why."""

    path: Path
    action: Action
    reason: str

    def line(self) -> str:
        return f"{self.action} {self.path}: {self.reason}"


@dataclass(frozen=True)
class ServingNames:
    """The subject alternative names of the serving certificate, in the order they are written."""

    dns: tuple[str, ...]
    ips: tuple[IPAddress, ...]

    @property
    def common_name(self) -> str:
        return self.dns[2]  # svc.ns.svc, the name kube-apiserver dials


@dataclass(frozen=True)
class CertReport:
    """The outcome of `ensure_certificates`, one entry per file in the order they are written."""

    ca_key: FileAction
    ca_cert: FileAction
    tls_key: FileAction
    tls_cert: FileAction
    names: ServingNames
    not_after: datetime  # of the serving certificate

    @property
    def files(self) -> tuple[FileAction, ...]:
        return (self.ca_key, self.ca_cert, self.tls_key, self.tls_cert)

    @property
    def changed(self) -> bool:
        return any(f.action is not Action.KEPT for f in self.files)


def dns_names(service: str, namespace: str) -> list[str]:
    """The four names a Service is reachable by inside the cluster, shortest first."""
    check_service(service)
    check_namespace(namespace)
    svc = f"{service}.{namespace}.svc"
    return [service, f"{service}.{namespace}", svc, f"{svc}.cluster.local"]


def check_service(name: str) -> str:
    """Raise ValueError unless `name` is a valid Service name (an RFC 1035 label)."""
    if not _DNS_1035_LABEL.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid Service name (lowercase letters, digits and '-', "
            "starting with a letter, at most 63 characters)"
        )
    return name


def check_namespace(name: str) -> str:
    """Raise ValueError unless `name` is a valid namespace name (an RFC 1123 label)."""
    if not _DNS_1123_LABEL.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid namespace name (lowercase letters, digits and '-', at most 63 characters)"
        )
    return name


def check_days(days: int, renew_within: timedelta = RENEW_WITHIN) -> int:
    """Raise ValueError unless a certificate of `days` would not be due for renewal the moment it is made."""
    low = renew_within.days + 1
    if not low <= days <= MAX_DAYS:
        raise ValueError(
            f"{days} is out of range: use {low} to {MAX_DAYS} days "
            f"(certificates are renewed {renew_within.days} days before they expire)"
        )
    return days


def parse_host(value: str) -> str | IPAddress:
    """An extra SAN: an IP address, or a DNS name (lowercased, trailing dot dropped); else ValueError."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        pass
    else:
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            raise ValueError(f"{value!r}: an IP address with a zone (%...) cannot be in a certificate")
        return ip
    name = value.lower().removesuffix(".")
    # A numeric last label is a mistyped IP address (e.g. 10.0.0.256), never a real host name.
    if len(name) > 253 or not _DNS_NAME.fullmatch(name) or name.rsplit(".", 1)[-1].isdigit():
        raise ValueError(f"{value!r} is neither an IP address nor a valid DNS name")
    return name


def serving_names(service: str, namespace: str, hosts: Sequence[str] = ()) -> ServingNames:
    """The in-cluster names of the Service plus every extra host, without duplicates."""
    dns = dns_names(service, namespace)
    ips: list[IPAddress] = []
    for host in hosts:
        parsed = parse_host(host)
        if isinstance(parsed, str):
            if parsed not in dns:
                dns.append(parsed)
        elif parsed not in ips:
            ips.append(parsed)
    return ServingNames(tuple(dns), tuple(ips))


def ensure_certificates(
    out_dir: Path,
    service: str,
    namespace: str,
    hosts: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
    *,
    now: datetime | None = None,
    renew_within: timedelta = RENEW_WITHIN,
) -> CertReport:
    """Create or renew ca.* and tls.* in `out_dir`; ValueError for bad arguments, CertError for bad files.

    Every file is read and checked before any is written, so an unusable file stops the run with
    nothing changed. Files are replaced atomically (temporary file in the same directory, then rename).
    """
    names = serving_names(service, namespace, hosts)
    check_days(days, renew_within)
    now = _utc(now)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CertError(f"{out_dir}: cannot create the directory: {exc.strerror}") from None
    if not out_dir.is_dir():
        raise CertError(f"{out_dir}: not a directory")

    with _locked(out_dir) as dir_fd:
        old_ca_key = _load_key(out_dir / CA_KEY)
        old_ca_cert, _ = _load_cert(out_dir / CA_CERT, replace_if_corrupt=False)
        old_tls_key = _load_key(out_dir / TLS_KEY)
        old_tls_cert, tls_cert_existed = _load_cert(out_dir / TLS_CERT, replace_if_corrupt=True)

        ca_key = old_ca_key or _new_key()
        tls_key = old_tls_key or _new_key()
        ca_why = _ca_renewal_reason(old_ca_cert, ca_key, old_ca_key is None, now, renew_within)
        ca_cert = _issue_ca(ca_key, now) if ca_why or old_ca_cert is None else old_ca_cert
        tls_why: str | None
        if old_tls_cert is None:
            tls_why = "not a PEM certificate, replaced" if tls_cert_existed else "missing"
        else:
            tls_why = _serving_renewal_reason(
                old_tls_cert,
                tls_key,
                key_is_new=old_tls_key is None,
                ca_cert=ca_cert,
                ca_renewed=ca_why is not None,
                names=names,
                now=now,
                renew_within=renew_within,
            )
        if tls_why or old_tls_cert is None:
            tls_cert = _issue_serving(tls_key, names, ca_cert=ca_cert, ca_key=ca_key, days=days, now=now)
        else:
            tls_cert = old_tls_cert

        # Order matters for readers (see the module docstring): each key before its certificate.
        report = CertReport(
            ca_key=_put_key(out_dir / CA_KEY, ca_key, old_ca_key is None),
            ca_cert=_put_cert(out_dir / CA_CERT, ca_cert, ca_why, existed=old_ca_cert is not None),
            tls_key=_put_key(out_dir / TLS_KEY, tls_key, old_tls_key is None),
            tls_cert=_put_cert(out_dir / TLS_CERT, tls_cert, tls_why, existed=tls_cert_existed),
            names=names,
            not_after=tls_cert.not_valid_after_utc,
        )
        if report.changed:
            os.fsync(dir_fd)  # make the renames durable before saying "created"/"renewed"
    return report


def key_description(key: PrivateKey) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return f"RSA {key.key_size}"
    return "ECDSA P-256" if isinstance(key.curve, ec.SECP256R1) else f"ECDSA {key.curve.name}"


# --- reading -------------------------------------------------------------------------------------


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CertError(f"{path}: cannot read: {exc.strerror}") from None


def _load_key(path: Path) -> PrivateKey | None:
    data = _read(path)
    if data is None:
        return None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CertError(f"{path}: the key is encrypted; an unencrypted PEM key is needed") from None
    except (ValueError, UnsupportedAlgorithm):
        raise CertError(f"{path}: not a PEM private key (remove the file to generate a new key)") from None
    if not isinstance(key, PrivateKey):
        raise CertError(f"{path}: unsupported key type {type(key).__name__}; use ECDSA or RSA")
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size < 2048:
        raise CertError(f"{path}: RSA keys shorter than 2048 bits are not accepted")
    return key


def _load_cert(path: Path, *, replace_if_corrupt: bool) -> tuple[x509.Certificate | None, bool]:
    """The certificate (None if missing or, with replace_if_corrupt, unreadable) and whether the file exists.

    An unreadable tls.crt is replaced, since nothing depends on its bytes; an unreadable ca.crt is an
    error, since it may be in caBundles and replacing it would be a silent change of trust.
    """
    data = _read(path)
    if data is None:
        return None, False
    try:
        return x509.load_pem_x509_certificate(data), True
    except ValueError:
        if replace_if_corrupt:
            return None, True
        raise CertError(f"{path}: not a PEM certificate (remove ca.crt to issue a new one for ca.key)") from None


def read_ca_bundle(path: Path, now: datetime | None = None) -> list[x509.Certificate]:
    """The CA certificates in a PEM file that is to verify client certificates (`serve --client-ca`).

    CertError naming the file for what would otherwise make every handshake fail: no certificate,
    a certificate that is no CA (a client certificate given by mistake), or an expired CA.
    """
    data = _read(path)
    if data is None:
        raise CertError(f"{path}: no such file")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertError(
            f"{path}: not a PEM certificate file; accepted: the PEM certificate(s) of the CA that signs "
            "the clients' certificates"
        ) from None
    now = _utc(now)
    for cert in certs:
        subject = cert.subject.rfc4514_string() or "(no subject)"
        if not _is_ca(cert):
            raise CertError(
                f"{path}: {subject!r} is not a CA certificate (no basicConstraints CA:TRUE); give the CA "
                "that signed the clients' certificates, not a client certificate"
            )
        if cert.not_valid_after_utc <= now:
            raise CertError(f"{path}: CA {subject!r} expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    return certs


# --- deciding ------------------------------------------------------------------------------------


def _ca_renewal_reason(
    cert: x509.Certificate | None,
    key: PrivateKey,
    key_is_new: bool,
    now: datetime,
    renew_within: timedelta,
) -> str | None:
    if cert is None:
        return "missing"
    if key_is_new:
        return f"{CA_KEY} was missing, so this is a new CA"
    if not _same_key(cert, key):
        return f"does not match {CA_KEY}"
    if not _is_ca(cert):
        return "not a CA certificate"
    return _expiry_reason(cert, now, renew_within)


def _serving_renewal_reason(
    cert: x509.Certificate,
    key: PrivateKey,
    *,
    key_is_new: bool,
    ca_cert: x509.Certificate,
    ca_renewed: bool,
    names: ServingNames,
    now: datetime,
    renew_within: timedelta,
) -> str | None:
    if ca_renewed:
        return "the CA was renewed"
    if key_is_new:
        return f"{TLS_KEY} is new"
    if not _signed_by(cert, ca_cert):
        return "not signed by the current CA"
    if not _same_key(cert, key):
        return f"does not match {TLS_KEY}"
    if cert.not_valid_before_utc > now:
        return "not valid yet"
    expiry = _expiry_reason(cert, now, renew_within)
    if expiry:
        return expiry
    return _names_change(cert, names)


def _expiry_reason(cert: x509.Certificate, now: datetime, renew_within: timedelta) -> str | None:
    end = cert.not_valid_after_utc
    if end <= now:
        return f"expired on {end:%Y-%m-%d}"
    if end - now <= renew_within:
        return f"expires on {end:%Y-%m-%d}, within {renew_within.days} days"
    return None


def _names_change(cert: x509.Certificate, names: ServingNames) -> str | None:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "has no subject alternative names"
    have = {n.lower() for n in san.get_values_for_type(x509.DNSName)}
    have |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    want = set(names.dns) | {str(ip) for ip in names.ips}
    if have == want:
        return None
    parts = []
    if added := sorted(want - have):
        parts.append("added " + ", ".join(added))
    if removed := sorted(have - want):
        parts.append("removed " + ", ".join(removed))
    return "names changed: " + "; ".join(parts)


def _same_key(cert: x509.Certificate, key: PrivateKey) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)  # issuer name and signature
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# --- issuing -------------------------------------------------------------------------------------


def _new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


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


def _issue_ca(key: PrivateKey, now: datetime) -> x509.Certificate:
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


def _issue_serving(
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


# --- writing -------------------------------------------------------------------------------------


def _put_key(path: Path, key: PrivateKey, is_new: bool) -> FileAction:
    if is_new:
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _write_atomic(path, pem, KEY_MODE)
        return FileAction(path, Action.CREATED, f"new {key_description(key)} key")
    reason = f"{key_description(key)} key"
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(KEY_MODE)  # a kept key must not stay readable by others
            reason += ", permissions tightened to 0600"
    except OSError as exc:
        raise CertError(f"{path}: cannot set mode 0600: {exc.strerror}") from None
    return FileAction(path, Action.KEPT, reason)


def _put_cert(path: Path, cert: x509.Certificate, why: str | None, *, existed: bool) -> FileAction:
    until = f"valid until {cert.not_valid_after_utc:%Y-%m-%d}"
    if why is None:
        return FileAction(path, Action.KEPT, until)
    _write_atomic(path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    if existed:
        return FileAction(path, Action.RENEWED, f"{why}; {until}")
    return FileAction(path, Action.CREATED, f"new certificate, {until}")


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write via a temporary file in the same directory and rename, so readers see old or new, never half."""
    try:
        # mkstemp creates the file 0600, so a key is never readable by others, not even for a moment.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), mode)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise CertError(f"{path}: cannot write: {exc.strerror}") from None


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[int]:
    """Hold an exclusive lock on the directory, so two runs (say an init container and a cron job) never
    interleave their writes; yields the directory's file descriptor."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def _utc(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(UTC)
