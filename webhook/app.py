"""The Flask app: `POST /mutate` turns an AdmissionReview into the core's Verdict and back.

HTTP concerns only (content type, body limit, status codes, metrics, the log line); what the request
means is webhook.review's business and what to do with a Pod is the Admitter's. Every answer is JSON:
a Kubernetes `Status` for a malformed call (4xx), an AdmissionReview for everything else, including
an unexpected failure (allowed: false, code 500, and an error id that is also in the log).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from flask import Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException, LengthRequired, RequestEntityTooLarge, UnsupportedMediaType

from webhook.logs import ADMISSION_LOGGER, AdmissionLog, admission_fields
from webhook.metrics import Metrics
from webhook.review import (
    AdmissionRequest,
    PodRef,
    ReviewError,
    error_body,
    parse_review,
    pod_ref,
    response_body,
    skip_verdict,
    status_body,
)
from webhook.verdict import Verdict

# kube-apiserver's request body limit is 3 MiB (etcd's object limit plus headroom); an AdmissionReview
# carries the object (and oldObject), so a bigger body is not a real admission call.
MAX_BODY_BYTES = 3 * 1024 * 1024
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


class Admitter(Protocol):
    """The core (webhook.admission.Admitter): one decision per Pod."""

    def admit(self, pod: Mapping[str, Any], *, namespace: str, dry_run: bool = False) -> Verdict: ...


QuotaDenialTest = Callable[[Verdict], bool]


def quota_denial(verdict: Verdict) -> bool:
    """A denial by a namespace ResourceQuota or a per-class quota of the policy."""
    return not verdict.allowed and verdict.reason in ("quota", "class-quota")


@dataclass(frozen=True)
class AppConfig:
    """What the app needs; built by `gpupool serve` in each worker, or by a test."""

    admitter: Admitter
    metrics: Metrics
    log: logging.Logger = field(default_factory=lambda: logging.getLogger(ADMISSION_LOGGER))
    write_line: Callable[[bytes], object] | None = None  # where admission lines go; None: stderr
    is_quota_denial: QuotaDenialTest = quota_denial  # which denials count as quota denials
    max_body_bytes: int = MAX_BODY_BYTES


def create_app(config: AppConfig) -> Flask:
    """A Flask app serving POST /mutate; nothing else is routed on the admission port."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    view = _MutateView(config)
    app.add_url_rule("/mutate", "mutate", view, methods=["POST"], provide_automatic_options=False)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error(config.log))
    return app


class _MutateView:
    def __init__(self, config: AppConfig) -> None:
        self._admit = config.admitter.admit
        self._metrics = config.metrics
        self._log = config.log
        self._lines = AdmissionLog(config.log, config.write_line)
        self._is_quota_denial = config.is_quota_denial
        self._max_body = config.max_body_bytes

    def __call__(self) -> Response:
        started = time.perf_counter()
        # The exact header kube-apiserver sends is checked without parsing it (the hot path).
        if request.environ.get("CONTENT_TYPE") != JSON and request.mimetype != JSON:
            raise UnsupportedMediaType(f"Content-Type must be {JSON}, not {request.mimetype or 'missing'}")
        body = _read_body(self._max_body)
        try:
            review = parse_review(body)
            verdict = skip_verdict(review)
        except ReviewError as exc:
            # Not an admission (no uid to answer): a warning with the reason, never the body.
            self._log.warning("bad request", extra={"fields": {"code": exc.status, "reason": str(exc)}})
            return _status_response(exc.status, str(exc))
        ref = pod_ref(review)
        try:
            if verdict is None:
                assert review.object is not None  # skip_verdict refuses a Pod CREATE without one
                verdict = self._admit(review.object, namespace=ref.namespace, dry_run=review.dry_run)
            payload = response_body(review, verdict)
        except Exception:  # any failure still answers the call; the log has the traceback
            return self._error(review, ref, started)
        self._record(review, ref, verdict, time.perf_counter() - started)
        return Response(payload, 200, mimetype=JSON)

    def _record(self, review: AdmissionRequest, ref: PodRef, verdict: Verdict, seconds: float) -> None:
        pool = str(verdict.placement.pool) if verdict.placement is not None else ""
        quota = not verdict.allowed and self._is_quota_denial(verdict)
        self._metrics.record(
            outcome=verdict.outcome,
            pool=pool,
            seconds=seconds,
            dry_run=review.dry_run,
            namespace=ref.namespace,
            quota_denial=quota,
        )
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
            )
            self._lines.info(fields)

    def _error(self, review: AdmissionRequest, ref: PodRef, started: float) -> Response:
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
        return Response(error_body(review, error_id), 200, mimetype=JSON)


def _read_body(limit: int) -> bytes:
    """The request body, at most `limit` bytes, else 413; a declared length is checked before reading.

    Read here rather than with `request.get_data()`: werkzeug cuts a chunked body at the limit without
    an error, which would turn an oversized request into a confusing "not JSON".
    """
    length = request.content_length
    if length is not None and length > limit:
        raise RequestEntityTooLarge()
    stream = request.environ["wsgi.input"]
    if length is not None:
        data: bytes = stream.read(length)
        return data
    if not request.environ.get("wsgi.input_terminated"):
        raise LengthRequired("a body without Content-Length needs chunked transfer encoding")
    data = stream.read(limit + 1)  # gunicorn ends a chunked body's stream at its last chunk
    if len(data) > limit:
        raise RequestEntityTooLarge()
    return data


def _status_response(code: int, message: str) -> Response:
    return Response(status_body(code, message, _REASONS.get(code, "Unknown")), code, mimetype=JSON)


def _http_error(exc: HTTPException) -> Response:
    """Flask's own errors (404, 405, 413, 415) as JSON, never its HTML pages."""
    code = exc.code or 500
    if code == 404:
        message = f"no such path {request.path}: this port serves POST /mutate only"
    elif code == 405:
        message = f"{request.method} is not allowed on {request.path}: use POST"
    elif code == 413:
        message = f"the body is larger than {current_app.config['MAX_CONTENT_LENGTH']} bytes"
    else:
        message = exc.description or exc.name
    return _status_response(code, message)


def _unexpected_error(log: logging.Logger) -> Callable[[Exception], Response]:
    def handle(exc: Exception) -> Response:
        # Only reached before the AdmissionReview is decoded (no uid to answer with yet).
        error_id = uuid.uuid4().hex[:12]
        log.error("request failed", exc_info=exc, extra={"fields": {"error_id": error_id}})
        return _status_response(500, f"gpupool internal error (error id {error_id})")

    return handle
