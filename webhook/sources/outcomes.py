"""What gpupool's writes to the Kubernetes API answer, in gpupool's terms (webhook.sources.writes makes
them): plain values with no Kubernetes client type, so the queue, which decides on them, stays free of the
client (import-linter's contract in pyproject.toml)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple


class Released(NamedTuple):
    obj: dict[str, Any]  # the Pod as the API stored it


class Conflict(NamedTuple):
    message: str


class Gone(NamedTuple):
    message: str


class Refused(NamedTuple):
    status: int  # 0: no answer (timeout, connection)
    message: str


ReleaseResult = Released | Conflict | Gone | Refused


class LeaseRecord(NamedTuple):
    """What a Lease says about its holder (the fields leader election reads and writes)."""

    holder: str  # "" when nobody holds it (released)
    duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    resource_version: str = ""  # of the Lease as read; a replace carries it as its precondition


class LeaseError(Exception):
    """The API could not be asked (or answered an error other than a conflict)."""
