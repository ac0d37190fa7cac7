"""The --policy file while the server runs: a changed file is read, validated and switched to between two
admissions, without a restart; an invalid one keeps the policy in use.

The file is watched the way the certificates are (webhook.serving.gunicorn_app.CertificateReloader): by its
inode, size and modification time, which all change when the kubelet swaps a ConfigMap volume's `..data`
symlink to a new directory, and then by the SHA-256 of its bytes, so that a file rewritten with the same
content changes nothing. Each worker polls every `POLL_SECONDS` on a thread of its own; nothing is read
on the admission path.

What a new policy costs depends on what it changes (webhook.pools.index.pooling):

- namespace rules and the defaults only admission reads: the Admitter is rebound to the new policy,
  with the same inventory (`Admitter.use`); nothing is listed again;
- anything else (classes, the product table, vendors, reservation times): the index is built for it, so a new
  inventory is opened for the new policy (the snapshot file read again, or the cluster listed and
  watched anew) while the current one keeps answering by the old policy. Every reservation made
  meanwhile is made in both (`Admitter.mirror_into`); the switch happens once the new inventory is
  ready and every reservation made before it began is gone (none left, or `reservationSeconds` passed),
  so the new one holds every admission the watch has not shown yet.

The server adds what else a worker runs on its inventory (the queue, webhook.serving.queueing): `reopen`
opens the new inventory and `switched` is told of the new inventory once the Admitter uses it, before the
old one is closed.

A policy taken into use logs its warnings (webhook.domain.exactness: quotas `placement: now` cannot keep
exact with `admitters` processes admitting), as the server does for the one it starts with.

A file that does not load keeps the policy in use (and a new inventory being built for an earlier
change goes on), logs the error naming the field, counts it (`gpupool_policy_reloads_total{result=
"failure"}`, `gpupool_policy_last_reload_successful`) and shows in /readyz's details (`status`), which the
gunicorn master reads from a PolicyFile of its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webhook.admission.core import Admitter
from webhook.domain.errors import ConfigError, read_user_file
from webhook.domain.exactness import policy_warnings
from webhook.domain.policy import Policy, PolicyError, load_policy_text
from webhook.pools.index import pooling
from webhook.pools.inventory import Inventory
from webhook.sources.open import reopen_inventory

POLL_SECONDS = 1.0  # well under the minute or two a ConfigMap change takes to reach the Pod

log = logging.getLogger("gpupool.policy")

FileVersion = tuple[int, int, int]  # inode, size, mtime in ns; (-1, -1, -1) when it cannot be read


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    """A policy as read from its file: the validated policy, and which bytes it came from."""

    path: str
    policy: Policy
    sha256: str
    file: FileVersion


def read_policy_file(path: str) -> PolicyVersion:
    """The policy in `path`, merged over the built-in default and validated; a ConfigError naming the file
    and the field when it is not a valid policy. The file is read once, so the hash is of what was parsed."""
    version = file_version(path)
    data, text = read_user_file(path, PolicyError, "policy file")
    return PolicyVersion(path, load_policy_text(text, source=path), hashlib.sha256(data).hexdigest(), version)


def file_version(path: str) -> FileVersion:
    try:
        st = os.stat(path)  # follows the symlinks of a ConfigMap volume to the file of the current version
    except OSError:
        return (-1, -1, -1)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class PolicyFile:
    """The policy file as it changes: the last valid version read from it, and why a newer one is refused."""

    def __init__(self, loaded: PolicyVersion) -> None:
        self.current = loaded
        self.error: str | None = None  # why the file's newest version is not in use; None when it is
        self._seen: FileVersion = loaded.file
        self._lock = threading.Lock()  # the master's /readyz may be asked on two threads at once

    def check(self) -> PolicyVersion | ConfigError | None:
        """What changed since the last call: a new valid version (now `current`), the error that refuses the
        file as it is now, or None when it is unchanged (or rewritten with the same bytes)."""
        with self._lock:
            version = file_version(self.current.path)
            if version == self._seen:
                return None
            self._seen = version
            try:
                new = read_policy_file(self.current.path)
            except ConfigError as exc:
                self.error = str(exc)
                return exc
            self._seen = new.file  # what was read, should the file have changed again in between
            same = new.sha256 == self.current.sha256
            self.current, self.error = new, None
            return None if same else new

    def status(self) -> dict[str, Any]:
        """For /readyz: the file, the version in use, and why the newest is refused (null when it is not)."""
        self.check()
        return {"file": self.current.path, "sha256": self.current.sha256, "error": self.error}


class PolicyReloader:
    """A worker's thread that follows the policy file and rebinds its Admitter (see the module's docstring).

    `reloaded(ok)` is told of every change taken into use (True) or refused (False), for the metrics;
    `admitters`, the processes that admit (replicas x workers), is what the policy's warnings are about."""

    def __init__(  # noqa: PLR0913 (a constructor: injectable clocks and callbacks, by keyword)
        self,
        file: PolicyFile,
        admitter: Admitter,
        reloaded: Callable[[bool], None] = lambda ok: None,
        *,
        admitters: int = 1,
        interval: float = POLL_SECONDS,
        reopen: Callable[[Inventory, Policy], Inventory] = reopen_inventory,
        switched: Callable[[Inventory], None] = lambda inventory: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._file = file
        self._admitter = admitter
        self._reloaded = reloaded
        self._admitters = admitters
        self._interval = interval
        self._reopen = reopen
        self._switched = switched
        self._clock = clock
        self._used = file.current.sha256  # the version the Admitter decides by (the file may be ahead)
        self._pending: _Pending | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-policy", daemon=True)

    def start(self) -> PolicyReloader:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following the file; a new inventory still being built is closed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval + 10)
        self._abandon()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.step()
            except Exception:  # the thread must keep following the file; the log says what broke
                log.exception("following the policy file failed")

    def step(self) -> None:
        """One look at the file, and one at the new inventory being built, if any."""
        change = self._file.check()
        if isinstance(change, ConfigError):
            self._refused(str(change))
        elif change is not None:
            self._begin(change)
        self._advance()

    def _begin(self, version: PolicyVersion) -> None:
        self._abandon()  # a newer file wins over a change still waiting for its inventory
        admitter = self._admitter
        if pooling(version.policy) == pooling(admitter.policy):
            admitter.use(version.policy)
            self._in_use(version, "the pools are unchanged, the inventory is kept")
            return
        try:
            successor = self._reopen(admitter.inventory, version.policy)
        except ConfigError as exc:
            self._refused(f"the inventory cannot be read for it: {exc}")
            return
        admitter.mirror_into(successor)
        # Reservations made from now on are in both; those made before are gone by then at the latest.
        deadline = self._clock() + admitter.policy.defaults.reservation_seconds
        self._pending = _Pending(version, successor, deadline)
        log.info(
            "policy %s changes the pools: reading the inventory again for it; %s stays in use until then",
            _short(version.sha256),
            _short(self._used),
            extra={"fields": {"policy": version.path, "sha256": version.sha256}},
        )

    def _advance(self) -> None:
        pending = self._pending
        if pending is None or not pending.inventory.ready:
            return
        current = self._admitter.inventory
        if self._clock() < pending.deadline:
            with current.read() as index:
                if index.usage.reservations:
                    return  # some may predate the mirroring: wait until they are matched or expire
        self._pending = None
        self._admitter.use(pending.version.policy, pending.inventory)
        self._switched(pending.inventory)
        current.close()
        self._in_use(pending.version, "with the inventory read again for it")

    def _abandon(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._admitter.mirror_into(None)
            pending.inventory.close()

    def _in_use(self, version: PolicyVersion, how: str) -> None:
        self._used = version.sha256
        log.info(
            "policy %s in use (%s)",
            _short(version.sha256),
            how,
            extra={"fields": {"policy": version.path, "sha256": version.sha256}},
        )
        log_policy_warnings(version.policy, self._admitters, version.path)
        self._reloaded(True)

    def _refused(self, why: str) -> None:
        log.error(
            "policy file refused, %s stays in use: %s",
            _short(self._used),
            why,
            extra={"fields": {"policy": self._file.current.path, "error": why}},
        )
        self._reloaded(False)


def log_policy_warnings(policy: Policy, admitters: int, source: str) -> None:
    """One warning line per thing the policy cannot promise with `admitters` processes admitting."""
    for warning in policy_warnings(policy, admitters):
        log.warning("policy: %s", warning, extra={"fields": {"policy": source, "admitters": admitters}})


@dataclass(frozen=True, slots=True)
class _Pending:
    """A policy waiting for the inventory opened for it."""

    version: PolicyVersion
    inventory: Inventory
    deadline: float  # by then, every reservation made before the mirroring began has expired


def _short(sha256: str) -> str:
    return sha256[:12]
