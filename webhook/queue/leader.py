"""Who may release: leader election on a `coordination.k8s.io/v1` Lease, timed by the monotonic clock.

client-go's rules (Kueue's timings): a candidate takes the Lease when nobody holds it, when it holds it
itself, or when the record it last observed has not changed for the Lease's duration (15 s); the holder
renews every retry period (2 s); a holder that has not renewed within the renew deadline (10 s) of its
last successful renewal stops leading at once, before anyone else may take the Lease (they wait the full
duration after they last saw it change). A candidate takes part only once it is ready to release (its
inventory has synced). Every write carries the resourceVersion it read, so two candidates never both win.
A leader's term is the Lease's `leaseTransitions` while it holds it; its releases carry `<identity>/<term>`
(webhook.admission.fence), which the validating webhook checks against the Lease as they commit, so a
release that lands after its leader's term is refused.
A candidate's identity is its Pod's (`POD_NAME`: one leader process per Pod, webhook.serving.leaderproc).
A Lease its identity holds that this very candidate did not write is a previous incarnation's (a leader
process that died and was restarted; the supervisor starts the next only once the last has exited): it is
taken over at once, with a new term, never renewed as if it were this candidate's, so a release the dead
process still had in flight carries a term that is over and is refused.
On `stop` the holder hands the Lease back (holder "", duration 1 s) so that the next replica of a rolling
update takes over at once.

Why not the `kubernetes` package's own `leaderelection.LeaderElection`: it measures the lease and the
renew deadline with the wall clock (a clock step makes a follower take a valid Lease, or a leader keep
leading past its deadline), its `run()` blocks with no way to stop it, it never hands the Lease back, and
its `LeaseLock` calls the API without a timeout (a dead connection keeps a leader "renewing" forever).
An attempt stuck all the same (a bug, a deadlock) is seen by the leader process's heartbeat (`rounds`).
gpupool keeps its rules and its Lease format and adds what it lacks; the wall clock is only written into
the Lease for humans and other clients (acquireTime, renewTime), never read to decide.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple, Protocol

from webhook.sources.outcomes import LeaseError, LeaseRecord
from webhook.sources.rounds import Rounds

log = logging.getLogger("gpupool.leader")


class LeaseTimes(NamedTuple):
    duration: float = 15.0  # how long a Lease not renewed stays another's
    renew_deadline: float = 10.0  # a leader that cannot renew within this of its last renewal stops leading
    retry: float = 2.0  # how often candidates try and leaders renew

    @classmethod
    def of(cls, duration: int) -> LeaseTimes:
        """A Lease of `duration` seconds, its renew deadline and retry in the default's proportions
        (15, 10, 2): a shorter one fails over sooner at more renewals a second."""
        return cls(float(duration), duration * 2 / 3, duration * 2 / 15)


DEFAULT_TIMES = LeaseTimes()


class Leases(Protocol):
    """The Lease's API (webhook.sources.writes.LeaseStore)."""

    def get(self) -> LeaseRecord | None: ...
    def create(self, record: LeaseRecord) -> LeaseRecord | None: ...
    def replace(self, record: LeaseRecord) -> LeaseRecord | None: ...


class Elector:
    """One candidate. `run()` (on a thread) tries and renews until `stop()`; `leading()` says, at any
    moment, whether this candidate may act as the leader now."""

    def __init__(  # noqa: PLR0913 (a constructor: injectable clocks and callbacks, by keyword)
        self,
        leases: Leases,
        identity: str,
        times: LeaseTimes = DEFAULT_TIMES,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_change: Callable[[bool], None] = lambda leading: None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        """`ready` says whether this candidate could release now (its inventory has synced): one that
        could not does not take the Lease, even a free or expired one, since it would hold it and release
        nothing (a restarted worker lists for half a minute at scale while a synced replica waits)."""
        self._leases = leases
        self.ready = ready
        self.identity = identity
        self.times = times
        self._clock, self._wall = clock, wall
        self._on_change = on_change
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._valid_until = 0.0  # monotonic: leading until then, unless renewed
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._was_leading = False
        self.acquired_version = ""  # the Lease's resourceVersion when this candidate last took it over
        self.term = 0  # the Lease's leaseTransitions while this candidate holds it: its releases' fencing token
        self._won_once = False  # whether this candidate (not an earlier process of its identity) ever held it
        self.rounds = Rounds(clock)  # the attempt under way, for the leader process's heartbeat

    def leading(self) -> bool:
        with self._lock:
            return self._clock() < self._valid_until

    def remaining(self) -> float:
        """Seconds of leadership left without a renewal (0 when not leading)."""
        with self._lock:
            return max(self._valid_until - self._clock(), 0.0)

    def run(self) -> None:
        while not self._stop.is_set():
            self.rounds.begin()
            try:
                self.try_once()
            except LeaseError as exc:
                log.warning("leader election: %s", exc)
            self._notify()
            self.rounds.end()
            self._stop.wait(self.times.retry)
        self.rounds.begin()
        self._release()
        self._notify()
        self.rounds.end()

    def stop(self) -> None:
        self._stop.set()

    def try_once(self) -> bool:
        """One attempt to take or renew the Lease; True when this candidate holds it now."""
        started = self._clock()  # leadership is counted from before the request: the conservative side
        current = self._leases.get()
        now = self._wall()
        if current is None:
            if not self.ready():
                return False
            record = LeaseRecord(self.identity, int(self.times.duration), now, now, 0)
            return self._won(self._leases.create(record), started, took_over=True)
        if self._observed is None or current != self._observed:  # any write changes its resourceVersion
            self._observed, self._observed_at = current, started
        mine = current.holder == self.identity and self._won_once
        # Its identity's, but written by an earlier process of it (now gone): taken over at once, new term.
        free = not current.holder or current.holder == self.identity
        expired = started >= self._observed_at + max(current.duration_seconds, 1)
        if not (mine or free or expired) or not (mine or self.ready()):
            self._lose()
            return False
        record = LeaseRecord(
            holder=self.identity,
            duration_seconds=int(self.times.duration),
            acquire_time=current.acquire_time if mine else now,
            renew_time=now,
            transitions=current.transitions + (0 if mine else 1),
            resource_version=current.resource_version,
        )
        return self._won(self._leases.replace(record), started, took_over=not mine)

    def _won(self, written: LeaseRecord | None, started: float, *, took_over: bool) -> bool:
        if written is None:  # another candidate wrote first: read again next time
            self._lose()
            return False
        with self._lock:
            self._valid_until = started + self.times.renew_deadline
            self.term = written.transitions  # unchanged by a renewal; every change of holder adds one
        self._won_once = True
        self._observed, self._observed_at = written, started
        if took_over:
            self.acquired_version = written.resource_version
            log.info("%s leads the queue (Lease version %s)", self.identity, written.resource_version)
        return True

    def _lose(self) -> None:
        with self._lock:
            self._valid_until = min(self._valid_until, self._clock())

    def _release(self) -> None:
        """Hand the Lease back if this candidate holds it, so the next one need not wait out the duration."""
        if not self.leading() or self._observed is None or self._observed.holder != self.identity:
            return
        with self._lock:
            self._valid_until = 0.0
        now = self._wall()
        try:
            self._leases.replace(
                LeaseRecord("", 1, now, now, self._observed.transitions, self._observed.resource_version)
            )
            log.info("%s handed the queue's Lease back", self.identity)
        except LeaseError as exc:
            log.warning("could not hand the Lease back (it expires in %.0f s): %s", self.times.duration, exc)

    def _notify(self) -> None:
        leading = self.leading()
        if leading != self._was_leading:
            self._was_leading = leading
            self._on_change(leading)


def reached(version: str, wanted: str) -> bool:
    """Has a resourceVersion reached another (both etcd revisions: a new leader's watch and the Lease it
    took, webhook.queue.runner)? Anything else: never."""
    return version.isdigit() and wanted.isdigit() and int(version) >= int(wanted)
