"""The Flask app: `POST /mutate` and `POST /validate` turn an AdmissionReview into the core's Verdict and back.

HTTP concerns only (content type, body limit, status codes, metrics, the log line); what the request
means is webhook.serving.review's business and what to do with a Pod is the Admitter's (for /mutate) or
the Validator's (webhook.admission.validation, for /validate: the Pod as it will be stored, on CREATE and
UPDATE). Every answer is JSON:
a Kubernetes `Status` for a malformed call (4xx), an AdmissionReview for everything else, including
an unexpected failure (allowed: false, code 500, and an error id that is also in the log).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, LengthRequired, RequestEntityTooLarge, UnsupportedMediaType
from werkzeug.http import parse_options_header
from werkzeug.routing import Rule
from werkzeug.wsgi import get_content_length

from webhook.admission.validation import Caller, Checked
from webhook.admission.verdict import Verdict
from webhook.serving.logs import ADMISSION_LOGGER, AdmissionLog, admission_fields
from webhook.serving.metrics import Metrics
from webhook.serving.review import (
    AdmissionRequest,
    PodRef,
    ReviewError,
    error_body,
    parse_review,
    pod_ref,
    response_body,
    skip_verdict,
    status_body,
    validate_skip_verdict,
)

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

# The largest AdmissionReview kube-apiserver can send for a Pod etcd stores. etcd refuses a request over
# its --max-request-bytes (1.5 MiB by default), so a stored Pod is at most that (in its protobuf form, which
# a tenant can grow by patches of 3 MiB each, kube-apiserver's own body limit, long after admission). The
# review of an UPDATE (the queue's release, a tenant's edit) carries it twice, object and oldObject, and
# Go's encoding/json writes each <, > and & (and control characters, U+2028 and U+2029) as a six-byte
# \u escape: 2 x 6 x 1.5 MiB, plus the review's own fields (uid, kind, userInfo, options). A bigger body
# is no admission call. Bodies are still read against this limit as they arrive (413 from the
# Content-Length, or as a chunked body passes it), and the worker's buffer budget bounds what all its
# requests hold together (webhook.serving.clients).
ETCD_MAX_OBJECT_BYTES = 1536 * 1024
GO_JSON_ESCAPE_FACTOR = 6
REVIEW_ENVELOPE_BYTES = 1024 * 1024
MAX_BODY_BYTES = 2 * GO_JSON_ESCAPE_FACTOR * ETCD_MAX_OBJECT_BYTES + REVIEW_ENVELOPE_BYTES  # 19 MiB
JSON = "application/json"

_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "RequestEntityTooLarge",
    411: "LengthRequired",
    415: "UnsupportedMediaType",
    500: "InternalError",
}


class AdmitsPods(Protocol):
    """What the app needs of the core (webhook.admission.core.Admitter): one answer per Pod."""

    def admit(self, pod: Any, *, namespace: str, dry_run: bool = False) -> Verdict: ...

    def admit_ephemeral(self, pod: Any, *, namespace: str, old: Any = None) -> Verdict:
        """An update of pods/ephemeralcontainers: a denial, or allowed unchanged (never a patch)."""
        ...


class ValidatesPods(Protocol):
    """What /validate needs of the core (webhook.admission.validation.Validator)."""

    def validate_create(self, pod: Any, *, namespace: str, dry_run: bool = False) -> Checked: ...

    def validate_update(self, pod: Any, old: Any, *, namespace: str, caller: Caller) -> Checked: ...


def quota_denial(verdict: Verdict) -> bool:
    """A denial by a namespace ResourceQuota, or a per-class or GPU-memory quota of the policy."""
    return not verdict.allowed and verdict.reason in ("quota", "class-quota", "memory-quota")


def would_deny(verdict: Verdict) -> str:
    """The code of the denial an audited Pod was spared ("" for any other answer)."""
    return verdict.reason if verdict.outcome == "audited" and verdict.reason else ""


@dataclass(frozen=True)
class AppConfig:
    """What the app needs; built by `gpupool serve` in each worker, or by a test."""

    admitter: AdmitsPods
    metrics: Metrics
    validator: ValidatesPods | None = None  # None: no /validate (404)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger(ADMISSION_LOGGER))
    write_line: Callable[[bytes], object] | None = None  # where admission lines go; None: stderr
    max_body_bytes: int = MAX_BODY_BYTES


def create_app(config: AppConfig) -> Flask:
    """A Flask app for the admission port: POST /mutate and POST /validate, nothing else.

    Both are answered by a thin WSGI entry in front of Flask's dispatch (`_AdmissionEntry`), and only
    there: measured side by side on gunicorn (docs/performance.md), Flask's request context, URL
    matching and Response object cost more CPU per call than all of gpupool's own work, and took
    throughput below the goal of 0.75x a Flask no-op. Flask answers everything else on the port (404,
    405). Each error has one answer, built by one function (`_status_answer`, `_http_error_answer`,
    `_internal_error`) whichever of the two reached it.
    """
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    # The routes are declared so that Flask answers other methods on them with 405; POST never
    # reaches Flask (the entry answers it), so the rules have no view.
    routes: dict[str, Callable[[WSGIEnvironment], Answer]] = {"/mutate": _Mutate(config).answer}
    if config.validator is not None:
        routes["/validate"] = _Validate(config, config.validator).answer
    for path in routes:
        app.url_map.add(Rule(path, methods=["POST"], endpoint=path.lstrip("/")))
    app.register_error_handler(HTTPException, _flask_http_error)
    app.register_error_handler(Exception, _flask_internal_error(config.log))
    app.wsgi_app = _AdmissionEntry(app.wsgi_app, routes, config.log)  # type: ignore[method-assign]
    return app


Answer = tuple[int, bytes]  # HTTP status code and JSON body


class _Call(NamedTuple):
    """One AdmissionReview read from its request: the review, its Pod, and the answer it gets unread (a
    request the webhook leaves alone) or None."""

    review: AdmissionRequest
    ref: PodRef
    skipped: Verdict | None


def _read_call(
    environ: WSGIEnvironment, limit: int, log: logging.Logger, skip: Callable[[AdmissionRequest], Verdict | None]
) -> _Call | Answer:
    """The review of a POST to /mutate or /validate, or the 400 answer to one that is not an admission (no
    uid to answer: a warning with the reason, never the body). A malformed HTTP request (411, 413, 415)
    raises an HTTPException."""
    body = _json_body(environ, limit)
    try:
        review = parse_review(body)
        return _Call(review, pod_ref(review), skip(review))
    except ReviewError as exc:
        log.warning("bad request", extra={"fields": {"code": exc.status, "reason": str(exc)}})
        return _status_answer(exc.status, str(exc))


class _Mutate:
    """POST /mutate: the WSGI environ in, (status, JSON body) out."""

    def __init__(self, config: AppConfig) -> None:
        self._admitter = config.admitter
        self._admit = config.admitter.admit
        self._metrics = config.metrics
        self._log = config.log
        self._lines = AdmissionLog(config.log, config.write_line)
        self._max_body = config.max_body_bytes

    def answer(self, environ: WSGIEnvironment) -> Answer:
        """The answer to one call; a malformed HTTP request (411, 413, 415) raises an HTTPException."""
        started = time.perf_counter()
        call = _read_call(environ, self._max_body, self._log, skip_verdict)
        if not isinstance(call, _Call):
            return call
        review, ref, verdict = call
        try:
            if verdict is None and review.is_ephemeral_update:
                verdict = self._admitter.admit_ephemeral(review.object, namespace=ref.namespace, old=review.old_object)
            elif verdict is None:
                verdict = self._admit(review.object, namespace=ref.namespace, dry_run=review.dry_run)
            payload = response_body(review, verdict)
        except Exception:  # any failure still answers the call; the log has the traceback
            return self._error(review, ref, started)
        self._record(review, ref, verdict, time.perf_counter() - started)
        return 200, payload

    def _record(self, review: AdmissionRequest, ref: PodRef, verdict: Verdict, seconds: float) -> None:
        pool = str(verdict.placement.pool) if verdict.placement is not None else ""
        quota = quota_denial(verdict)
        self._metrics.record(
            outcome=verdict.outcome,
            pool=pool,
            seconds=seconds,
            dry_run=review.dry_run,
            namespace=ref.namespace,
            quota_denial=quota,
        )
        spared = would_deny(verdict)
        if spared:
            self._metrics.record_would_deny(namespace=ref.namespace, reason=spared, dry_run=review.dry_run)
        if self._lines.enabled:
            fields = admission_fields(
                uid=review.uid,
                namespace=ref.namespace,
                pod=ref.name,
                outcome=verdict.outcome,
                pool=pool,
                latency_ms=seconds * 1000,
                dry_run=review.dry_run,
                code=verdict.code,
                message="" if verdict.allowed else verdict.message,
                group=verdict.group.name if verdict.group is not None else "",
                audit=verdict.audit,
                audit_reason=would_deny(verdict),
            )
            self._lines.info(fields)

    def _error(self, review: AdmissionRequest, ref: PodRef, started: float) -> Answer:
        error_id = uuid.uuid4().hex[:12]
        seconds = time.perf_counter() - started
        self._log.exception(
            "admission",
            extra={
                "fields": admission_fields(
                    uid=review.uid,
                    namespace=ref.namespace,
                    pod=ref.name,
                    outcome="error",
                    pool="",
                    latency_ms=seconds * 1000,
                    dry_run=review.dry_run,
                    code=500,
                    error_id=error_id,
                )
            },
        )
        self._metrics.record(outcome="error", pool="", seconds=seconds, dry_run=review.dry_run)
        return 200, error_body(review, error_id)


class _Validate:
    """POST /validate: the WSGI environ in, (status, JSON body) out; one log line and metric per call."""

    def __init__(self, config: AppConfig, validator: ValidatesPods) -> None:
        self._validator = validator
        self._metrics = config.metrics
        self._log = config.log
        self._lines = AdmissionLog(config.log, config.write_line)
        self._max_body = config.max_body_bytes

    def answer(self, environ: WSGIEnvironment) -> Answer:
        """The answer to one call; a malformed HTTP request (411, 413, 415) raises an HTTPException."""
        started = time.perf_counter()
        call = _read_call(environ, self._max_body, self._log, validate_skip_verdict)
        if not isinstance(call, _Call):
            return call
        review, ref, skipped = call
        try:
            if skipped is not None:
                checked = Checked(skipped)
            elif review.is_pod_create:
                checked = self._validator.validate_create(
                    review.object, namespace=ref.namespace, dry_run=review.dry_run
                )
            else:
                caller = Caller(review.username, review.groups)
                checked = self._validator.validate_update(
                    review.object, review.old_object, namespace=ref.namespace, caller=caller
                )
            payload = response_body(review, checked.verdict)
        except Exception:  # any failure still answers the call; the log has the traceback
            return self._error(review, ref, started)
        self._record(review, ref, checked, time.perf_counter() - started)
        return 200, payload

    def _record(self, review: AdmissionRequest, ref: PodRef, checked: Checked, seconds: float) -> None:
        verdict = checked.verdict
        outcome = "allowed" if verdict.allowed else "denied"
        operation = _operation(review)
        self._metrics.record_validation(operation=operation, outcome=outcome, seconds=seconds, dry_run=review.dry_run)
        spared = would_deny(verdict)
        if spared:
            self._metrics.record_would_deny(namespace=ref.namespace, reason=spared, dry_run=review.dry_run)
        if self._lines.enabled:
            fields = admission_fields(
                uid=review.uid,
                namespace=ref.namespace,
                pod=ref.name,
                outcome=outcome,
                pool=checked.pool,
                latency_ms=seconds * 1000,
                dry_run=review.dry_run,
                code=verdict.code,
                message="" if verdict.allowed else verdict.message,
                operation=operation,
                user=review.username if review.is_pod_update else "",
                reservation=checked.reservation,
                audit=verdict.audit,
                audit_reason=would_deny(verdict),
            )
            self._lines.info(fields, message="validation")

    def _error(self, review: AdmissionRequest, ref: PodRef, started: float) -> Answer:
        error_id = uuid.uuid4().hex[:12]
        seconds = time.perf_counter() - started
        operation = _operation(review)
        fields = admission_fields(
            uid=review.uid,
            namespace=ref.namespace,
            pod=ref.name,
            outcome="error",
            pool="",
            latency_ms=seconds * 1000,
            dry_run=review.dry_run,
            code=500,
            error_id=error_id,
            operation=operation,
        )
        self._log.exception("validation", extra={"fields": fields})
        self._metrics.record_validation(operation=operation, outcome="error", seconds=seconds, dry_run=review.dry_run)
        return 200, error_body(review, error_id)


def _operation(review: AdmissionRequest) -> str:
    """The metric's and log line's `operation`: CREATE, UPDATE, or other for a request not checked."""
    return "CREATE" if review.is_pod_create else "UPDATE" if review.is_pod_update else "other"


class _AdmissionEntry:
    """WSGI entry: POST to /mutate or /validate straight to its answer, every other request to Flask."""

    def __init__(
        self, flask_app: WSGIApplication, routes: dict[str, Callable[[WSGIEnvironment], Answer]], log: logging.Logger
    ) -> None:
        self._flask_app = flask_app
        self._routes = routes
        self._log = log

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        route = self._routes.get(environ.get("PATH_INFO", ""))
        if route is None or environ.get("REQUEST_METHOD") != "POST":
            return self._flask_app(environ, start_response)
        try:
            code, payload = route(environ)
        except HTTPException as exc:  # 411, 413, 415: the call itself is malformed
            code, payload = _http_error_answer(exc)
        except Exception as exc:  # before there is a uid to answer in a review (after, _Mutate and _Validate do)
            code, payload = _internal_error(self._log, exc)
        start_response(
            _STATUS_LINES.get(code) or _status_line(code),
            [("Content-Type", JSON), ("Content-Length", str(len(payload)))],
        )
        return [payload]


def _status_line(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"{code} Unknown"


_STATUS_LINES = {code: _status_line(code) for code in (200, *_REASONS)}


def _json_body(environ: WSGIEnvironment, limit: int) -> bytes:
    """The JSON body of an admission call; 415 for another Content-Type (see `_read_body` for the rest)."""
    content_type = environ.get("CONTENT_TYPE")
    # The exact header kube-apiserver sends is checked without parsing it (the hot path).
    if content_type != JSON:
        mimetype = parse_options_header(content_type)[0].lower() if content_type else ""
        if mimetype != JSON:
            raise UnsupportedMediaType(f"Content-Type must be {JSON}, not {mimetype or 'missing'}")
    return _read_body(environ, limit)


def _read_body(environ: WSGIEnvironment, limit: int) -> bytes:
    """The request body, at most `limit` bytes, else 413; a declared length is checked before reading.

    Read here rather than with `request.get_data()`: werkzeug cuts a chunked body at the limit without
    an error, which would turn an oversized request into a confusing "not JSON".
    """
    length = get_content_length(environ)
    if length is not None and length > limit:
        raise RequestEntityTooLarge(f"the body is larger than {limit} bytes")
    stream = environ["wsgi.input"]
    if length is not None:
        data: bytes = stream.read(length)
        return data
    if not environ.get("wsgi.input_terminated"):
        raise LengthRequired("a body without Content-Length needs chunked transfer encoding")
    data = stream.read(limit + 1)  # gunicorn ends a chunked body's stream at its last chunk
    if len(data) > limit:
        raise RequestEntityTooLarge(f"the body is larger than {limit} bytes")
    return data


def _status_answer(code: int, message: str) -> Answer:
    return code, status_body(code, message, _REASONS.get(code, "Unknown"))


def _http_error_answer(exc: HTTPException, path: str = "", method: str = "") -> Answer:
    """A malformed call or request (404, 405, 411, 413, 415) as a JSON Status, never HTML."""
    code = exc.code or 500
    if code == 404:
        return _status_answer(code, f"no such path {path}: this port serves POST /mutate and POST /validate only")
    if code == 405:
        return _status_answer(code, f"{method} is not allowed on {path}: use POST")
    return _status_answer(code, exc.description or exc.name)


def _internal_error(log: logging.Logger, exc: Exception) -> Answer:
    """An unforeseen failure: a 500 Status with an error id that the log line repeats."""
    error_id = uuid.uuid4().hex[:12]
    log.error("request failed", exc_info=exc, extra={"fields": {"error_id": error_id}})
    return _status_answer(500, f"gpupool internal error (error id {error_id})")


def _flask_http_error(exc: HTTPException) -> Response:
    code, payload = _http_error_answer(exc, request.path, request.method)
    return Response(payload, code, content_type=JSON)


def _flask_internal_error(log: logging.Logger) -> Callable[[Exception], Response]:
    def handle(exc: Exception) -> Response:
        code, payload = _internal_error(log, exc)
        return Response(payload, code, content_type=JSON)

    return handle
