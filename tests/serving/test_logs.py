"""Tests for webhook.serving.logs: every line one JSON object, admission fields, the logging configuration."""

from __future__ import annotations

import io
import logging
import logging.config
import sys
import time
from datetime import UTC, datetime

import orjson
import pytest

from webhook.serving.logs import AdmissionLog, JsonFormatter, admission_fields, logging_config


def record(message: str = "admission", **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("gpupool.admission", logging.INFO, __file__, 1, message, None, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


class TestJsonFormatter:
    def test_one_json_object_with_time_level_logger_message(self) -> None:
        """A line is a JSON object with UTC time, lower-case level, logger name and message."""
        line = JsonFormatter().format(record("hello"))
        entry = orjson.loads(line)
        assert "\n" not in line
        assert (entry["level"], entry["logger"], entry["message"]) == ("info", "gpupool.admission", "hello")
        assert entry["time"].endswith("Z") and "T" in entry["time"]

    def test_fields_are_merged_into_the_line(self) -> None:
        """Structured fields from `extra={"fields": ...}` become top-level keys."""
        entry = orjson.loads(JsonFormatter().format(record(fields={"uid": "u1", "latency_ms": 0.5})))
        assert (entry["uid"], entry["latency_ms"]) == ("u1", 0.5)

    def test_exception_is_kept_on_the_same_line(self) -> None:
        """A traceback is a field of the one line, not extra lines."""
        try:
            raise ValueError("bad")
        except ValueError:
            rec = record()
            rec.exc_info = sys.exc_info()
        line = JsonFormatter().format(rec)
        assert "\n" not in line and "ValueError: bad" in orjson.loads(line)["exception"]

    def test_value_that_is_not_json_does_not_lose_the_line(self) -> None:
        """A field of an unusual type is written as text."""
        entry = orjson.loads(JsonFormatter().format(record(fields={"path": object()})))
        assert entry["path"].startswith("<object")


class TestAdmissionFields:
    def test_required_fields_and_rounded_latency(self) -> None:
        """uid, namespace, pod, outcome, pool and latency (ms, 3 decimals) are always there."""
        fields = admission_fields(uid="u", namespace="ns", pod="p", outcome="mutated", pool="a/b/c", latency_ms=1.23456)
        assert fields == {
            "uid": "u",
            "namespace": "ns",
            "pod": "p",
            "outcome": "mutated",
            "pool": "a/b/c",
            "latency_ms": 1.235,
        }

    def test_optional_fields_only_when_set(self) -> None:
        """dry_run, code, reason and error_id show up only when they say something."""
        fields = admission_fields(
            uid="u",
            namespace="ns",
            pod="p",
            outcome="error",
            pool="",
            latency_ms=1,
            dry_run=True,
            code=500,
            error_id="abc",
        )
        assert (fields["dry_run"], fields["code"], fields["error_id"]) == (True, 500, "abc")
        assert "reason" not in fields and "group" not in fields

    def test_the_workload_group_is_on_the_line_and_bounded(self) -> None:
        """A grouped Pod's line says its group, so a group's admissions can be followed; an owner name
        cannot make the line long."""
        fields = admission_fields(uid="u", namespace="ns", pod="p", outcome="mutated", pool="", latency_ms=1,
                                  group="Job/train-llama")  # fmt: skip
        assert fields["group"] == "Job/train-llama"
        long = admission_fields(uid="u", namespace="ns", pod="p", outcome="mutated", pool="", latency_ms=1,
                                group="Job/" + "x" * 5000)  # fmt: skip
        assert len(long["group"]) < 400


class TestLoggingConfig:
    def test_unknown_level_is_refused(self) -> None:
        """A level that is not one of debug..critical is an error, not silently info."""
        with pytest.raises(ValueError, match="log level"):
            logging_config("verbose")

    def test_config_writes_json_lines_for_gpupool_and_gunicorn(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Applied, the configuration makes gpupool's and gunicorn's loggers write JSON lines."""
        stream = io.StringIO()
        monkeypatch.setattr("sys.stderr", stream)
        names = ("", "gpupool", "gunicorn.error", "gunicorn.access")
        saved = {
            n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level, logging.getLogger(n).propagate)
            for n in names
        }
        try:
            logging.config.dictConfig(logging_config("info"))
            logging.getLogger("gpupool.admission").info("admission", extra={"fields": {"uid": "u2"}})
            logging.getLogger("gunicorn.error").info("Booting worker")
            logging.getLogger("gpupool.admission").debug("hidden at info")
        finally:
            for name, (handlers, level, propagate) in saved.items():
                logger = logging.getLogger(name)
                logger.handlers[:], logger.propagate = handlers, propagate
                logger.setLevel(level)
        lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
        assert [(e["logger"], e["message"]) for e in lines] == [
            ("gpupool.admission", "admission"),
            ("gunicorn.error", "Booting worker"),
        ]
        assert lines[0]["uid"] == "u2"


class TestAdmissionLog:
    def test_line_has_the_formatter_shape_and_one_newline(self) -> None:
        """A direct admission line looks like every other log line: time, level, logger, message, fields."""
        lines: list[bytes] = []
        logger = logging.getLogger("gpupool.admission.test-shape")
        logger.setLevel(logging.INFO)
        AdmissionLog(logger, lines.append).info({"uid": "u1", "outcome": "mutated"})
        [line] = lines
        entry = orjson.loads(line)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert (entry["level"], entry["logger"], entry["message"], entry["uid"]) == (
            "info",
            "gpupool.admission.test-shape",
            "admission",
            "u1",
        )
        assert entry["time"].endswith("Z")

    def test_time_is_the_utc_time_of_each_line_across_seconds(self) -> None:
        """Each line's time is when it was written, to the millisecond, also after the second changes."""
        lines: list[bytes] = []
        logger = logging.getLogger("gpupool.admission.test-time")
        logger.setLevel(logging.INFO)
        log = AdmissionLog(logger, lines.append)
        seconds: set[str] = set()
        deadline = time.monotonic() + 5
        while len(seconds) < 2 and time.monotonic() < deadline:  # until a line lands in the next second
            lines.clear()
            before = datetime.now(UTC).replace(tzinfo=None)
            log.info({"uid": "u"})
            after = datetime.now(UTC).replace(tzinfo=None)
            stamp = orjson.loads(lines[-1])["time"]
            written = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
            assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= written <= after, stamp
            seconds.add(stamp[:19])
        assert len(seconds) == 2

    def test_enabled_follows_the_logger_level(self) -> None:
        """The logger's level decides: off above info."""
        logger = logging.getLogger("gpupool.admission.test-level")
        logger.setLevel(logging.WARNING)
        assert AdmissionLog(logger, lambda line: None).enabled is False
        logger.setLevel(logging.INFO)
        assert AdmissionLog(logger, lambda line: None).enabled is True

    def test_default_writes_whole_lines_to_stderr(self, capfd: pytest.CaptureFixture[str]) -> None:
        """Without a writer the line goes to file descriptor 2 in one piece."""
        AdmissionLog(logging.getLogger("gpupool.admission.test-fd")).info({"uid": "u3"})
        err = capfd.readouterr().err
        assert orjson.loads(err)["uid"] == "u3" and err.endswith("\n")


def test_text_from_the_request_is_cut_to_a_few_hundred_characters() -> None:
    """A hostile review's megabyte-long name or a long denial cannot make a log line of megabytes; the
    cut says how long the text was."""
    fields = admission_fields(
        uid="u" * 100_000, namespace="ns", pod="p" * 3_000_000, outcome="denied", pool="", latency_ms=1.0,
        message="m" * 100_000,
    )  # fmt: skip
    assert len(orjson.dumps(fields)) < 5_000
    assert fields["pod"].endswith("... (3000000 characters)")
