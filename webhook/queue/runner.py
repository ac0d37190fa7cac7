"""The leader's loop: whenever something changed, release what now fits; tell the Pods and the metrics.

Every replica runs one Runner per worker process, identity `POD_NAME-pid` (webhook.serving wires it), all
on the same Lease: exactly one process in the cluster leads, the others only answer admissions. The
leader keeps no state of its own that another replica would need: released Pods carry
`gpupool.io/pool` and no gate, queued Pods their gate, so a new leader carries on from its own watch.

A pass (webhook.queue.release.plan, under the inventory's lock) decides the queue in order and applies
each release to the index at once; the writes follow outside the lock, `WRITERS` at a time (a release
waits on the API's round trip, not on this process, so one at a time would cap the releases at one per
round trip), each a PATCH with the resourceVersion it was decided on. The index is then settled with
what the API answered: the released Pod (counted until the watch shows it), or, on a conflict (409: the
Pod changed; decided again next pass), a deletion (404) or a refusal, the Pod as it was. A write whose
answer is lost (a timeout) is looked up before it is undone, so a release that did happen is never
counted as not.

A new leader first waits until its Pod watch has caught up with the Lease it took (resourceVersions are
etcd's revisions, so the watch has then seen every release its predecessor wrote), at most
`CATCH_UP_SECONDS`; a leader stops writing as soon as it may have lost the Lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

from webhook.domain.model import PodKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_from_obj
from webhook.pools.memo import Memo
from webhook.queue.leader import Elector
from webhook.queue.release import Release, Wait, plan, settle
from webhook.queue.waiting import Waiting, is_queued
from webhook.sources.writes import Conflict, Event, Gone, Refused, Released, ReleaseResult

log = logging.getLogger("gpupool.queue")

TICK_SECONDS = 1.0  # a pass at least this often while leading, whatever the watches say
CATCH_UP_SECONDS = 5.0  # at most this long for a new leader's watch to reach the Lease's version
BATCH = 500  # releases decided per pass; the next pass follows at once
WRITERS = 8  # release PATCHes in flight at once (the API client's connection pool holds them: live.api_client)


class Inventory(Protocol):
    """What the runner needs of the live inventory (webhook.sources.live.LiveInventory)."""

    policy: Policy

    def read(self) -> AbstractContextManager[PoolIndex]: ...

    @property
    def ready(self) -> bool: ...

    def pod_version(self) -> str: ...


class Releaser(Protocol):
    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult: ...

    def read(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Events(Protocol):
    def record(self, event: Event) -> None: ...


class QueueMetrics(Protocol):
    """What the runner reports (webhook.serving.metrics implements it)."""

    def queue_waiting(self, by_namespace: dict[str, int]) -> None: ...

    def queue_released(self, outcome: str, wait_seconds: float | None) -> None: ...

    def queue_leading(self, leading: bool) -> None: ...


class NoMetrics:
    def queue_waiting(self, by_namespace: dict[str, int]) -> None:
        return None

    def queue_released(self, outcome: str, wait_seconds: float | None) -> None:
        return None

    def queue_leading(self, leading: bool) -> None:
        return None


class TokenBucket:
    """A client-side rate limit, as client-go's: `qps` a second sustained, `burst` at once."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst = qps, burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def delay(self) -> float:
        """Take a token: the seconds to wait before the write it is for (0 when one is there)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


UNLIMITED = TokenBucket(1e9, 10**9)


class PassResult(NamedTuple):
    released: int
    waiting: list[Wait]


class Runner:
    def __init__(
        self,
        inventory: Inventory,
        waiting: Waiting,
        elector: Elector,
        releaser: Releaser,
        *,
        events: Events,
        metrics: QueueMetrics | None = None,
        limiter: TokenBucket = UNLIMITED,
        clock: Callable[[], float] = time.monotonic,
        policy: Callable[[Inventory], Policy] = lambda inventory: inventory.policy,
        writers: int = WRITERS,
    ) -> None:
        """`policy` gives the policy a pass on the runner's inventory decides by: the inventory's own by
        default; the server's is the one admission uses now, which a change of namespace rules makes
        newer than the inventory (webhook.serving.policyfile)."""
        self.inventory, self.waiting, self.elector = inventory, waiting, elector
        self._policy = policy
        self._rebind_lock = threading.Lock()
        self._next: tuple[Inventory, Waiting] | None = None  # to follow from the next pass on (`rebind`)
        self._releaser, self._events = releaser, events
        self._metrics = metrics or NoMetrics()
        self._clock = clock
        self._limiter = limiter
        self._writers = writers
        self._pool = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="gpupool-release")
        self._stop = threading.Event()
        self._shapes = Memo()  # what a Pod's shape decides, for one policy only
        self._shapes_for: Policy | None = None
        self._told: dict[PodKey, str] = {}  # Pods told they are queued, by uid
        self._uncertain: dict[PodKey, Release] = {}  # written, answer lost: looked up before undone
        self._caught_up = False
        self._catch_up_since: float | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> Runner:
        for target, name in ((self.elector.run, "gpupool-leader"), (self.run, "gpupool-queue")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def rebind(self, inventory: Inventory, waiting: Waiting) -> None:
        """Follow another inventory and its queue (read again for a new policy, and ready) from the next
        pass on, still leading: a pass under way finishes on the old one."""
        with self._rebind_lock:
            self._next = (inventory, waiting)
        self.waiting.wake.set()

    def _take_rebind(self) -> None:
        with self._rebind_lock:
            rebound, self._next = self._next, None
        if rebound is None:
            return
        self.inventory, self.waiting = rebound
        # A write whose answer was lost is settled by the new inventory's own list, which shows the Pod as
        # the API has it; a Pod told it waits is not told again.
        self._uncertain.clear()
        self._shapes_for = None
        self.waiting.wake.set()

    def stop(self) -> None:
        """Stop releasing, then hand the Lease back (a rolling update's next leader takes over at once)."""
        self._stop.set()
        self.waiting.wake.set()
        elector, loop = self._threads or (None, None)
        if loop is not None:
            loop.join(10.0)
        self._pool.shutdown(wait=False)
        self.elector.stop()
        if elector is not None:
            elector.join(10.0)

    def run(self) -> None:
        while not self._stop.is_set():
            self.waiting.wake.wait(TICK_SECONDS)
            self.waiting.wake.clear()
            if self._stop.is_set():
                return
            self._take_rebind()
            leading = self.elector.leading()
            self._metrics.queue_leading(leading)
            self._metrics.queue_waiting(self.waiting.by_namespace())
            if not leading:
                self._caught_up, self._catch_up_since = False, None
                continue
            if not self.inventory.ready or not self._catch_up():
                continue
            try:
                result = self.run_pass()
            except Exception:  # a bug must not stop the queue for good: logged, and the next pass tries again
                log.exception("a pass of the queue failed")
                continue
            if result.released >= BATCH:
                self.waiting.wake.set()

    def _catch_up(self) -> bool:
        """A new leader's watch must have reached the Lease's version (or had CATCH_UP_SECONDS to)."""
        if self._caught_up:
            return True
        wanted, since = self.elector.acquired_version, self._catch_up_since
        if since is None:
            self._catch_up_since = since = self._clock()
        if _at_least(self.inventory.pod_version(), wanted) or self._clock() - since >= CATCH_UP_SECONDS:
            self._caught_up = True
            self._catch_up_since = None
            return True
        self.waiting.wake.set()  # look again soon
        self._stop.wait(0.05)
        return False

    def run_pass(self) -> PassResult:
        """One pass: settle writes whose answer was lost, decide, write, tell."""
        self._resolve_uncertain()
        policy = self._policy(self.inventory)
        if policy is not self._shapes_for:
            self._shapes, self._shapes_for = Memo(), policy
        with self.inventory.read() as index:
            decided = plan(self.waiting.ordered(), index, policy, shapes=self._shapes, limit=BATCH)
        self._tell_queued(decided.waits)
        return PassResult(self._write_all(decided.releases), decided.waits)

    def _write_all(self, releases: list[Release]) -> int:
        """Write the releases, `writers` at a time, in their order; each answer is settled here, on the
        runner's thread, as it comes. Stops sending (and undoes the rest) once it may no longer lead."""
        released = 0
        sending: set[Future[tuple[Release, ReleaseResult]]] = set()
        for i, release in enumerate(releases):
            if self._stop.is_set() or self.elector.remaining() < 1.0:
                self._undo(releases[i:])  # may no longer lead: another replica decides them
                break
            if len(sending) >= self._writers:
                done, sending = futures.wait(sending, return_when=futures.FIRST_COMPLETED)
                released += sum(self._answered(*f.result()) for f in done)
            delay = self._limiter.delay()
            if delay:
                self._stop.wait(delay)
            sending.add(self._pool.submit(self._send, release))
        for future in sending:
            released += self._answered(*future.result())
        return released

    def _send(self, release: Release) -> tuple[Release, ReleaseResult]:
        namespace, name = release.queued.key
        try:
            return release, self._releaser.release(namespace, name, release.patch)
        except Exception as exc:  # a bug must not leave the Pod counted as released for good: looked up next pass
            log.exception("release of %s/%s failed", namespace, name)
            return release, Refused(0, f"{type(exc).__name__}: {exc}")

    def _answered(self, release: Release, result: ReleaseResult) -> int:
        """Settle the index with a write's answer: 1 when the Pod was released."""
        namespace, name = release.queued.key
        if isinstance(result, Released):
            self._settle(release, result.obj)
            self._released(release, "released")
            return 1
        if isinstance(result, Conflict | Gone):
            self._settle(release, None)
            self._metrics.queue_released("conflict" if isinstance(result, Conflict) else "gone", None)
            return 0
        if result.status == 0:  # no answer: it may have been written
            self._uncertain[release.queued.key] = release
        else:
            self._settle(release, None)
            log.warning("release of %s/%s refused (%d): %s", namespace, name, result.status, result.message)
        self._metrics.queue_released("error", None)
        return 0

    def _settle(self, release: Release, obj: dict[str, Any] | None) -> None:
        policy = self.inventory.policy
        answer = pod_from_obj(obj, policy.gpu_resources, policy.partition_prefixes) if obj is not None else None
        with self.inventory.read() as index:
            settle(index, release, answer)

    def _undo(self, releases: list[Release]) -> None:
        with self.inventory.read() as index:
            for release in releases:
                settle(index, release, None)

    def _resolve_uncertain(self) -> None:
        for key, release in list(self._uncertain.items()):
            try:
                obj = self._releaser.read(*key)
            except OSError:
                continue  # still cannot ask: it keeps counting as released
            del self._uncertain[key]
            if obj is not None and not is_queued(obj):
                self._settle(release, obj)
                self._released(release, "released")
            else:
                self._settle(release, None)

    def _released(self, release: Release, outcome: str) -> None:
        q = release.queued
        self._told.pop(q.key, None)
        self._metrics.queue_released(outcome, _since(q.created))
        self._events.record(
            Event(q.key[0], q.key[1], q.uid, "Released", f"gpupool released the Pod to pool {release.pool}")
        )

    def _tell_queued(self, waits: list[Wait]) -> None:
        """An Event on each Pod the first time this leader sees it wait, saying what it waits for."""
        seen = set()
        for wait in waits:
            q = wait.queued
            seen.add(q.key)
            if self._told.get(q.key) != q.uid:
                self._told[q.key] = q.uid
                self._events.record(Event(q.key[0], q.key[1], q.uid, "Queued", f"gpupool queue: {wait.reason}"))
        for key in [k for k in self._told if k not in seen and self.waiting.get(k) is None]:
            del self._told[key]


def _at_least(version: str, wanted: str) -> bool:
    """Has a resourceVersion reached another (both etcd revisions)? Anything else: never."""
    return version.isdigit() and wanted.isdigit() and int(version) >= int(wanted)


def _since(created: str) -> float | None:
    """Seconds since an RFC 3339 time (the Pod's creation); None when unreadable."""
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max((datetime.now(UTC) - then).total_seconds(), 0.0)
