"""Certificate and key files: read and checked, written atomically with their modes, in a directory that
only its owner may write to, under a lock; and the client CA file `serve --client-ca` trusts."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from webhook.domain.errors import ConfigError
from webhook.serving.certs.issue import PrivateKey, is_ca
from webhook.serving.certs.names import utc

KEY_MODE, CERT_MODE, DIR_MODE = 0o600, 0o644, 0o700


class CertError(ConfigError):
    """A certificate or key file that cannot be used or written; the message names the file."""


def private_directory(path: Path) -> str | None:
    """Make `path` a directory nobody else can write to, and say what was done (None: nothing).

    A new one is created 0700 whatever the umask: mkdir's mode can only lose bits to the umask, so it is
    never more open than 0700, not even for a moment, and the chmod after it restores what the umask
    took. Whoever can write to the directory could plant keys in it. An existing directory that others
    may write to loses those write bits; it is otherwise left as its owner made it.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=DIR_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise CertError(f"{path}: not a directory") from None
        mode = stat.S_IMODE(path.stat().st_mode)
        if not mode & 0o022:
            return None
        try:
            path.chmod(mode & ~0o022)
        except OSError as exc:
            raise CertError(f"{path}: others may write to it, and it cannot be changed: {exc.strerror}") from None
        return f"others could write to it: permissions tightened to {mode & ~0o022:04o}"
    except OSError as exc:
        raise CertError(f"{path}: cannot create the directory: {exc.strerror}") from None
    try:
        path.chmod(DIR_MODE)
    except OSError as exc:
        raise CertError(f"{path}: cannot set mode {DIR_MODE:04o}: {exc.strerror}") from None
    return f"new directory, mode {DIR_MODE:04o}"


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes; None when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CertError(f"{path}: cannot read: {exc.strerror}") from None


def load_key(path: Path) -> PrivateKey | None:
    data = read_bytes(path)
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


def load_cert(path: Path, *, replace_if_corrupt: bool) -> tuple[x509.Certificate | None, bool]:
    """The certificate (None if missing or, with replace_if_corrupt, unreadable) and whether the file exists.

    An unreadable tls.crt is replaced, since nothing depends on its bytes; an unreadable ca.crt is an
    error, since it may be in caBundles and replacing it would be a silent change of trust.
    """
    data = read_bytes(path)
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
    data = read_bytes(path)
    if data is None:
        raise CertError(f"{path}: no such file")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertError(
            f"{path}: not a PEM certificate file; accepted: the PEM certificate(s) of the CA that signs "
            "the clients' certificates"
        ) from None
    now = utc(now)
    for cert in certs:
        subject = cert.subject.rfc4514_string() or "(no subject)"
        if not is_ca(cert):
            raise CertError(
                f"{path}: {subject!r} is not a CA certificate (no basicConstraints CA:TRUE); give the CA "
                "that signed the clients' certificates, not a client certificate"
            )
        if cert.not_valid_after_utc <= now:
            raise CertError(f"{path}: CA {subject!r} expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    return certs


def write_atomic(path: Path, data: bytes, mode: int) -> None:
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


def tighten_key(path: Path) -> bool:
    """Make a kept key file readable by its owner only; True when its mode had to change."""
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(KEY_MODE)
            return True
    except OSError as exc:
        raise CertError(f"{path}: cannot set mode 0600: {exc.strerror}") from None
    return False


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[int]:
    """Hold an exclusive lock on the directory, so two runs (say an init container and a cron job) never
    interleave their writes; yields the directory's file descriptor."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock
