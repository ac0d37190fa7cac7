"""JSON log lines: one object per line on stderr, for the webhook, gunicorn and the health server alike.

Structured fields ride on a log record's `fields` attribute (`logger.info(msg, extra={"fields": ...})`)
so a line can be filtered by `outcome` or `pool` without parsing text. Request bodies are never logged:
only the fields `admission_fields` names.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

ADMISSION_LOGGER = "gpupool.admission"
MAX_NAME_CHARS = 256  # Kubernetes names are at most 253 characters
MAX_MESSAGE_CHARS = 2048
LEVELS = ("debug", "info", "warning", "error", "critical")


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", ...fields, "exception"?}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # default=str: a field that is not JSON (a Path, an enum) must not lose the whole line
        return orjson.dumps(entry, default=str).decode("utf-8")


class AdmissionLog:
    """The one line per admission, written straight to a file descriptor in JsonFormatter's shape.

    It bypasses logging's machinery (LogRecord, handler lock, text encoding), which costs several times
    more than the line itself: measurable when a whole admission takes a few hundred microseconds. The
    level still comes from the `gpupool.admission` logger, so `--log-level warning` silences it. Each
    line is one write(2), so lines from concurrent threads never interleave.
    """

    def __init__(self, logger: logging.Logger, write: Callable[[bytes], object] | None = None) -> None:
        self._logger = logger
        self._write = write or _write_stderr
        self._second: tuple[int, str] = (-1, "")  # the last second's formatted text (strftime is slow)

    @property
    def enabled(self) -> bool:
        return self._logger.isEnabledFor(logging.INFO)

    def info(self, fields: dict[str, Any], message: str = "admission") -> None:
        entry = {"time": self._timestamp(time.time()), "level": "info", "logger": self._logger.name,
                 "message": message, **fields}  # fmt: skip
        self._write(orjson.dumps(entry, default=str, option=orjson.OPT_APPEND_NEWLINE))

    def _timestamp(self, now: float) -> str:
        """`_utc_timestamp(now)`, formatting the date and time only once per second."""
        seconds = int(now)
        cached = self._second  # one read: another thread may replace it (with an equally valid pair)
        if cached[0] != seconds:
            cached = self._second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
        return f"{cached[1]}.{int((now - seconds) * 1000):03d}Z"


def _write_stderr(line: bytes) -> None:
    view = memoryview(line)
    while view:
        view = view[os.write(2, view) :]


def admission_fields(  # noqa: PLR0913 (one log line's fields, each by keyword)
    *,
    uid: str,
    namespace: str,
    pod: str,
    outcome: str,
    pool: str,
    latency_ms: float,
    dry_run: bool = False,
    code: int = 200,
    message: str = "",
    error_id: str = "",
    group: str = "",
    operation: str = "",
    user: str = "",
    reservation: str = "",
    audit: str = "",
    audit_reason: str = "",
) -> dict[str, Any]:
    """The fields of the one line logged per admission (and per validating call: its `operation`, the
    `user` of an UPDATE, what it did with the Pod's `reservation`; under `enforcement: audit`, what gpupool
    would have done, `audit`, and the code of the denial it would have made, `audit_reason`); empty
    optional fields are left out.
    Text that came with the request is cut to a few hundred characters: a hostile review cannot make a
    line of megabytes."""
    fields: dict[str, Any] = {
        "uid": _cut(uid, MAX_NAME_CHARS),
        "namespace": _cut(namespace, MAX_NAME_CHARS),
        "pod": _cut(pod, MAX_NAME_CHARS),
        "outcome": outcome,
        "pool": pool,
        "latency_ms": round(latency_ms, 3),
    }
    if dry_run:
        fields["dry_run"] = True
    if code != 200:
        fields["code"] = code
    if message:
        fields["reason"] = _cut(message, MAX_MESSAGE_CHARS)
    if error_id:
        fields["error_id"] = error_id
    if group:
        fields["group"] = _cut(group, MAX_NAME_CHARS + 64)
    if operation:
        fields["operation"] = operation
    if user:
        fields["user"] = _cut(user, MAX_NAME_CHARS + 64)
    if reservation:
        fields["reservation"] = reservation
    if audit:
        fields["audit"] = _cut(audit, MAX_MESSAGE_CHARS)
    if audit_reason:
        fields["audit_reason"] = audit_reason
    return fields


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def logging_config(level: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` for the whole server (also gunicorn's `logconfig_dict`)."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    upper = level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"json": handler},
        "root": {"level": upper, "handlers": ["json"]},
        "loggers": {
            # gunicorn's access log is off: the admission line says more, once per request
            "gunicorn.error": {"level": upper, "handlers": ["json"], "propagate": False},
            "gunicorn.access": {"level": "WARNING", "handlers": ["json"], "propagate": False},
            "gpupool": {"level": upper, "handlers": ["json"], "propagate": False},
        },
    }


def _utc_timestamp(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
