"""gunicorn driven from code for the admission port: the application, its logger and its TLS context.

webhook.serving.server's `serve` builds the settings and the hooks; this module is what gunicorn calls
back: `WebhookApplication` takes the settings from a dict and runs the worker's `LoadApp` after the fork,
`NoAccessLogger` leaves out the access log the admission line replaces, and `CertificateReloader` is the
`ssl_context` hook that follows the certificate files (tls.crt, tls.key and the --client-ca file): the
context is re-used while they are unchanged and rebuilt on the next new connection after they change, so
a rotated Secret takes effect without a restart; a pair that does not match yet keeps the previous one.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger
from gunicorn.sock import ssl_context as gunicorn_ssl_context

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

log = logging.getLogger("gpupool.server")


@dataclass(frozen=True, slots=True)
class WorkerApp:
    """What a worker serves, and what to stop when it exits (the inventory's watches, timers)."""

    wsgi: WSGIApplication
    close: Callable[[], None] = lambda: None


LoadApp = Callable[[], WorkerApp]


class NoAccessLogger(GunicornLogger):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's logger without the access log, which the admission line replaces.

    With `logconfig_dict` set, gunicorn builds every request's access-log fields (a timestamp, a
    dozen header look-ups) before logging decides to drop the line by level: a few percent of a
    worker's CPU per request for nothing.
    """

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None


class WebhookApplication(BaseApplication):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn driven from code: settings from a dict, the WSGI app from a loader run in the worker."""

    def __init__(self, settings: Mapping[str, Any], load_app: LoadApp) -> None:
        self._settings = dict(settings)
        self._load_app = load_app
        self._close: Callable[[], None] = lambda: None
        super().__init__()

    def load_config(self) -> None:
        for name, value in self._settings.items():
            self.cfg.set(name, value)

    def load(self) -> WSGIApplication:
        """Runs in the worker, after the fork."""
        loaded = self._load_app()
        self._close = loaded.close
        return loaded.wsgi

    def close_worker(self) -> None:
        self._close()


class CertificateReloader:
    """gunicorn's `ssl_context` hook: one context per certificate version, TLS 1.2 at least.

    gunicorn asks for a context on every new connection; building one costs about 0.7 ms of CPU, so
    it is cached and rebuilt only when a file's inode, size or mtime changes: the certificate, the key,
    and the client CA when there is one (gunicorn's factory reads it from the `ca_certs` setting).
    """

    def __init__(self, cert: str, key: str, client_ca: str | None = None) -> None:
        self._paths = (cert, key) if client_ca is None else (cert, key, client_ca)
        self._log_fields = {"cert": cert} if client_ca is None else {"cert": cert, "client_ca": client_ca}
        self._lock = threading.Lock()  # called from any thread that wraps a socket
        self._version: tuple[int, ...] | None = None
        self._context: ssl.SSLContext | None = None

    def __call__(self, conf: Any, default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        version = self._file_version()
        with self._lock:
            if self._context is not None and version == self._version:
                return self._context
            try:
                context = default_factory()
            except (ssl.SSLError, OSError) as exc:
                if self._context is None:
                    raise
                # Mid-rotation (new certificate, old key), a file briefly missing or a CA file being
                # rewritten: keep serving with the previous context and try again on the next connection.
                log.warning("keeping the previous certificate: the new files do not load yet: %s", exc)
                return self._context
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            self._context, self._version = context, version
            log.info("serving certificate loaded", extra={"fields": self._log_fields})
            return context

    def _file_version(self) -> tuple[int, ...]:
        version: list[int] = []
        for path in self._paths:
            try:
                st = os.stat(path)
            except OSError:
                version += [-1, -1, -1]
                continue
            version += [st.st_ino, st.st_size, st.st_mtime_ns]
        return tuple(version)


def prime_tls_context(cfg: Any) -> None:
    """Load the TLS context once in the master, so every worker is forked holding a working one.

    A worker forked later (after a crash or a timeout) whose first handshake lands while the Secret's
    certificate and key are half-swapped then keeps serving with the inherited pair instead of failing
    that handshake (see CertificateReloader).
    """
    try:
        gunicorn_ssl_context(cfg)
    except (ssl.SSLError, OSError) as exc:  # checked at start; a rotation may be under way right now
        log.warning("could not load the certificate before forking the workers: %s", exc)
