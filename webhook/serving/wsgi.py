"""A whole request to the bytes of its answer, through the WSGI app (PEP 3333). No sockets here.

gpupool's worker hands a thread one whole request (webhook.serving.http11.Request); the thread builds
its environ once, here, calls the app, and frames the status, headers and body it answers
(`respond`, with webhook.serving.http11). The body is in memory already, so `wsgi.input` is a BytesIO
and is always terminated.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote_to_bytes

import h11

from webhook.serving.http11 import Answer, HttpConnection, ProtocolError, Request

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import WSGIApplication, WSGIEnvironment

SERVER_SOFTWARE = "gpupool"
log = logging.getLogger("gpupool.worker")
# Header fields the environ carries under CGI names of their own, not HTTP_*.
_CGI_NAMES = {b"content-type": "CONTENT_TYPE", b"content-length": "CONTENT_LENGTH"}


def base_environ(*, url_scheme: str, multiprocess: bool) -> dict[str, Any]:
    """What every request's environ shares within one worker (copied for each request)."""
    return {
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": url_scheme,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": multiprocess,
        "wsgi.run_once": False,
        "wsgi.input_terminated": True,  # the body is all there: reading to its end is safe
        "SERVER_SOFTWARE": SERVER_SOFTWARE,
        "SCRIPT_NAME": "",
    }


def environ_for(request: Request, base: dict[str, Any], client: Any, server: Any) -> WSGIEnvironment:
    """The environ of one request: `client` and `server` are the peer's and the listener's addresses.
    Raises ProtocolError for a target that is not a path (nor an absolute URI with one)."""
    environ = base.copy()
    target = request.target.decode("latin-1")
    if not target.startswith("/"):
        target = _origin_form(target)
    path, _, query = target.partition("?")
    if "#" in query:
        query = query.partition("#")[0]
    elif "#" in path:
        path = path.partition("#")[0]
    # PEP 3333: native strings holding the bytes as latin-1, the path percent-decoded.
    environ["PATH_INFO"] = unquote_to_bytes(path).decode("latin-1") if "%" in path else path
    environ["QUERY_STRING"] = query
    environ["RAW_URI"] = target
    environ["REQUEST_METHOD"] = request.method.decode("latin-1")
    environ["SERVER_PROTOCOL"] = "HTTP/" + request.http_version.decode("latin-1")
    environ["SERVER_NAME"], environ["SERVER_PORT"] = str(server[0]), str(server[1])
    environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = str(client[0]), str(client[1])
    environ["wsgi.input"] = io.BytesIO(request.body)
    for name, value in request.headers:
        if b"_" in name:
            # X_Forwarded_For and X-Forwarded-For would both be HTTP_X_FORWARDED_FOR: one could pass for
            # the other (gunicorn drops such fields too).
            continue
        key = _CGI_NAMES.get(name) or "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
        text = value.decode("latin-1")
        environ[key] = environ[key] + "," + text if key in environ else text  # RFC 9110: repeated fields join
    return environ


def _origin_form(target: str) -> str:
    """The path and query of an absolute URI (`https://host/mutate?x`), as a proxy may send it."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ProtocolError(400, f"request target {target[:100]!r} is not a path; accepted: /mutate")
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/"


def call_app(app: WSGIApplication, environ: WSGIEnvironment) -> Answer:
    """Call the WSGI app once; its whole answer. An exception from the app propagates."""
    started: list[tuple[str, list[tuple[str, str]]]] = []
    written: list[bytes] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None
    ) -> Callable[[bytes], object]:
        if exc_info and exc_info[1] is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])  # PEP 3333: too late to change the answer
        started[:] = [(status, headers)]
        return written.append

    result: Iterable[bytes] = app(environ, start_response)
    try:
        chunks = list(result)  # an app may call start_response on its first iteration
        body = b"".join(written + chunks)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not started:
        raise RuntimeError("the WSGI app returned without calling start_response")
    status, headers = started[0]
    code, _, reason = status.partition(" ")
    return Answer(
        int(code),
        reason.encode("latin-1"),
        [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers],
        body,
    )


class Reply(NamedTuple):
    data: bytes  # the answer's bytes, framed (empty when there is no answer to send)
    close: bool  # close the connection after them


def respond(  # noqa: PLR0913 (one request's connection, app and environ, by keyword)
    http: HttpConnection,
    request: Request,
    *,
    app: WSGIApplication,
    base: dict[str, Any],
    client: Any,
    server: Any,
    close: bool,
) -> Reply:
    """The answer to one whole request: the app's, framed; or a refusal (a target that is not a path), or a
    500 when the app fails (a bug: logged with its traceback), each closing the connection."""
    close = close or request.close
    try:
        environ = environ_for(request, base, client, server)
    except ProtocolError as exc:
        return Reply(http.refusal(exc), close=True)
    try:
        answer = call_app(app, environ)
    except Exception:  # the app answers its own errors: one that escapes is a bug
        log.exception("the WSGI app failed on %s %r", request.method.decode("latin-1"), request.target)
        return Reply(http.refusal(ProtocolError(500, "gpupool internal error")), close=True)
    try:
        return Reply(http.answer(answer, close=close), close)
    except h11.LocalProtocolError as exc:  # the app answered something HTTP/1.1 cannot carry
        log.error("cannot send the answer to %s %r: %s", request.method.decode("latin-1"), request.target, exc)
        return Reply(b"", close=True)
