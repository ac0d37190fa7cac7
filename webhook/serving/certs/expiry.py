"""When the serving certificate a server was given expires: `notAfter` of the `--cert` file, read again
whenever the file changes, so the gpupool_serving_certificate_expiry_seconds gauge follows rotations."""

from __future__ import annotations

import os
import threading
from datetime import datetime

from cryptography import x509


class CertificateExpiry:
    """`notAfter` of the first certificate in a PEM file, re-read when its inode, size or mtime change
    (what the server's TLS reload watches too: a rotated Secret swaps the file, a re-run of `gpupool certs`
    renames a new one into place). Cheap enough for every scrape: one stat while the file is unchanged."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # the health port may serve two scrapes at once
        self._version: tuple[int, int, int] | None = None
        self._not_after: datetime | None = None

    def not_after(self) -> datetime | None:
        """The certificate's notAfter; None when no readable certificate was ever found. While the file is
        missing or half-written (a rotation under way), the last one read stands: the server, too, keeps
        serving the certificate it had until the new files load."""
        try:
            st = os.stat(self.path)
        except OSError:
            return self._not_after
        version = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if version != self._version:
                try:
                    with open(self.path, "rb") as f:
                        cert = x509.load_pem_x509_certificate(f.read())
                except (OSError, ValueError):
                    return self._not_after  # not remembered: read again on the next call
                self._version, self._not_after = version, cert.not_valid_after_utc
            return self._not_after
