"""`ensure_certificates`: make a directory hold a usable `ca.crt`/`ca.key` and `tls.crt`/`tls.key`,
changing as little as possible: valid files are kept byte for byte, so it can run on every start.

Rotation never shows a reader a certificate and key that do not belong together. The server re-reads
`tls.crt` and `tls.key` for each new connection, and two files cannot be replaced in one step, so a
renewal keeps `tls.key` and replaces only `tls.crt` (one atomic rename). A new key is generated only when
`tls.key` is missing, and it is written before its certificate. Likewise a CA renewal keeps `ca.key` and
the CA name, so old and new `ca.crt` both verify old and new serving certificates while a `caBundle`
rolls over.

Trust never changes silently: a `ca.key` that is not the key of `ca.crt` stops the run (whoever could
write it would otherwise get a CA of their choosing issued and signing the serving certificate).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from webhook.serving.certs.files import (
    CERT_MODE,
    KEY_MODE,
    CertError,
    load_cert,
    load_key,
    locked,
    private_directory,
    tighten_key,
    write_atomic,
)
from webhook.serving.certs.issue import (
    PrivateKey,
    is_ca,
    issue_ca,
    issue_serving,
    key_description,
    new_key,
    same_key,
    signed_by,
)
from webhook.serving.certs.names import DEFAULT_DAYS, RENEW_WITHIN, ServingNames, check_days, serving_names, utc

CA_KEY, CA_CERT, TLS_KEY, TLS_CERT = "ca.key", "ca.crt", "tls.key", "tls.crt"


class Action(StrEnum):
    CREATED = "created"
    KEPT = "kept"
    RENEWED = "renewed"


@dataclass(frozen=True)
class FileAction:
    """What happened to one file (or the directory), and why."""

    path: Path
    action: Action
    reason: str

    def line(self) -> str:
        return f"{self.action} {self.path}: {self.reason}"


@dataclass(frozen=True)
class CertReport:
    """The outcome of `ensure_certificates`, one entry per file in the order they are written."""

    ca_key: FileAction
    ca_cert: FileAction
    tls_key: FileAction
    tls_cert: FileAction
    names: ServingNames
    not_after: datetime  # of the serving certificate
    directory: FileAction | None = None  # only when the directory was created or its mode tightened

    @property
    def files(self) -> tuple[FileAction, ...]:
        return (self.ca_key, self.ca_cert, self.tls_key, self.tls_cert)

    @property
    def lines(self) -> tuple[str, ...]:
        """What `gpupool certs` prints: the directory if it changed, then one line per file."""
        entries = self.files if self.directory is None else (self.directory, *self.files)
        return tuple(entry.line() for entry in entries)

    @property
    def changed(self) -> bool:
        return any(f.action is not Action.KEPT for f in self.files)


def ensure_certificates(  # noqa: PLR0913 (the certs command's flags)
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
    now = utc(now)
    made_private = private_directory(out_dir)
    directory = None
    if made_private is not None:
        action = Action.CREATED if made_private.startswith("new") else Action.KEPT
        directory = FileAction(out_dir, action, made_private)

    with locked(out_dir) as dir_fd:
        old_ca_key = load_key(out_dir / CA_KEY)
        old_ca_cert, _ = load_cert(out_dir / CA_CERT, replace_if_corrupt=False)
        old_tls_key = load_key(out_dir / TLS_KEY)
        old_tls_cert, tls_cert_existed = load_cert(out_dir / TLS_CERT, replace_if_corrupt=True)
        if old_ca_cert is not None and old_ca_key is not None and not same_key(old_ca_cert, old_ca_key):
            raise CertError(
                f"{out_dir / CA_KEY} is not the key of {out_dir / CA_CERT}, so no CA is issued from it (whoever "
                f"could write {CA_KEY} would choose the CA): put back the {CA_KEY} that belongs to {CA_CERT}, "
                "or remove both to make a new CA (the caBundle then changes)"
            )

        ca_key = old_ca_key or new_key()
        tls_key = old_tls_key or new_key()
        ca_why = _ca_renewal_reason(old_ca_cert, ca_key, old_ca_key is None, now, renew_within)
        ca_cert = issue_ca(ca_key, now) if ca_why or old_ca_cert is None else old_ca_cert
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
            tls_cert = issue_serving(tls_key, names, ca_cert=ca_cert, ca_key=ca_key, days=days, now=now)
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
            directory=directory,
        )
        if report.changed:
            os.fsync(dir_fd)  # make the renames durable before saying "created"/"renewed"
    return report


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
    if not is_ca(cert):
        return "not a CA certificate"
    return _expiry_reason(cert, now, renew_within)


def _serving_renewal_reason(  # noqa: PLR0913 (every input of the renewal rule, by keyword)
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
    if not signed_by(cert, ca_cert):
        return "not signed by the current CA"
    if not same_key(cert, key):
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


# --- writing -------------------------------------------------------------------------------------


def _put_key(path: Path, key: PrivateKey, is_new: bool) -> FileAction:
    if is_new:
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_atomic(path, pem, KEY_MODE)
        return FileAction(path, Action.CREATED, f"new {key_description(key)} key")
    reason = f"{key_description(key)} key"
    if tighten_key(path):  # a kept key must not stay readable by others
        reason += ", permissions tightened to 0600"
    return FileAction(path, Action.KEPT, reason)


def _put_cert(path: Path, cert: x509.Certificate, why: str | None, *, existed: bool) -> FileAction:
    until = f"valid until {cert.not_valid_after_utc:%Y-%m-%d}"
    if why is None:
        return FileAction(path, Action.KEPT, until)
    write_atomic(path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    if existed:
        return FileAction(path, Action.RENEWED, f"{why}; {until}")
    return FileAction(path, Action.CREATED, f"new certificate, {until}")
