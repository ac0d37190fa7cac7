"""The leader's loop: whenever something changed, release what now fits; tell the Pods and the metrics.

Every replica runs one Runner, in its leader process beside the admission workers, identity `POD_NAME`
(webhook.serving.leaderproc and queueing wire it), all on the same Lease: exactly one process in the cluster leads;
the admission workers run none. The leader keeps no state of its own that another replica would need: released Pods
carry `gpupool.io/pool` and no gate, queued Pods their gate, so a new leader carries on from its own watch.

A pass (webhook.queue.release: `read_batch` the requests, outside the inventory's lock, then `decide_batch` under
it, letting go of it now and then, webhook.queue.breather, so a long queue holds up neither the watch nor this
replica's admissions) decides the queue in order and applies each release to the index at once; the writes follow
outside the lock, `WRITERS` in flight at a time (a release waits on the API's round trip, not on this process, so
one at a time would cap the releases at one per round trip), each a PATCH with the resourceVersion it was decided
on. The next pass does not wait for them: its index counts them as released already. The index is then settled with
what the API answered: the released Pod (counted until the watch shows it), or, on a conflict (409: the Pod changed;
decided again next pass), a deletion (404) or a refusal, the Pod as it was. A write whose answer is lost (a timeout)
is looked up before it is undone, so a release that did happen is never counted as not. A refused release is backed
off, bounded and ended (webhook.queue.refusals): the Pod holds no place while it backs off, and is never sent again
in a tight loop.

A pass counts the charges of Pods that name their node (webhook.pools.charges) by the rule their admission counts
them by (`pending`): read from the API before the lock is taken, so a release never takes the quota or room of a
charged Pod its watch has not shown yet; a pass that cannot read them releases nothing. Before it sends them, a pass
records its releases in the same object, with the version it read (webhook.queue.records): an admission charging a
Pod that names its node then counts them however late its watch shows them, and a charge written after the pass read
the charges makes the record fail (409), so the pass releases nothing and the next one decides again with it. Either
way no charge and release share a quota or room.

Each release carries this leader's fencing token (`gpupool.io/released-by: <identity>/<term>`,
webhook.admission.fence): a release that commits after the term is over is refused by the validating webhook, so no
two leaders' releases ever share a quota or room, however late a write lands.

A new leader first waits until its Pod watch has caught up with the Lease it took (resourceVersions are etcd's
revisions, so the watch has then seen every release its predecessor wrote), at most `CATCH_UP_SECONDS`; a leader
stops writing as soon as it may have lost the Lease."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from webhook.admission.fence import token
from webhook.admission.patch import with_token
from webhook.domain.model import PodKey
from webhook.domain.policy import Policy
from webhook.pools.charges import Charge, ChargeError, ChargeStore, pending
from webhook.pools.kubeobj import pod_from_obj
from webhook.pools.memo import Memo
from webhook.queue import records
from webhook.queue.breather import Breather
from webhook.queue.leader import Elector, reached
from webhook.queue.outcomes import PassResult
from webhook.queue.parking import Parking
from webhook.queue.ports import UNLIMITED, Events, NoMetrics, QueueInventory, QueueMetrics, Releaser, TokenBucket
from webhook.queue.refusals import Refusals
from webhook.queue.release import Batch, Plan, Release, decide_batch, read_batch, settle
from webhook.queue.reshape import Reshaper
from webhook.queue.standing import Order, Standing
from webhook.queue.status import StatusFeed, StatusSink
from webhook.queue.telling import Teller
from webhook.queue.waiting import Changed, Queued, Waiting, is_queued
from webhook.sources.outcomes import Conflict, Gone, Refused, Released, ReleaseResult

log = logging.getLogger("gpupool.queue")

TICK_SECONDS = 1.0  # a look at least this often while leading: a pass if the index changed unannounced
ANSWER_SECONDS = 0.05  # while writes are in flight, their answers are settled at least this often
CATCH_UP_SECONDS = 5.0  # at most this long for a new leader's watch to reach the Lease's version
BATCH = 500  # releases decided per pass; the next pass follows at once
WRITERS = 8  # release PATCHes in flight at once (the API client's connection pool holds them: live.api_client)


class Runner:
    def __init__(  # noqa: PLR0913 (a constructor: its parts and injectable clocks, by keyword)
        self,
        inventory: QueueInventory,
        waiting: Waiting,
        elector: Elector,
        releaser: Releaser,
        *,
        events: Events,
        metrics: QueueMetrics | None = None,
        limiter: TokenBucket = UNLIMITED,
        clock: Callable[[], float] = time.monotonic,
        policy: Callable[[QueueInventory], Policy] = lambda inventory: inventory.policy,
        writers: int = WRITERS,
        reshaper: Reshaper | None = None,
        charges: ChargeStore | None = None,
        wall: Callable[[], float] = time.time,
        status: StatusSink | None = None,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> None:
        """`policy` gives the policy a pass on the runner's inventory decides by: the inventory's own by
        default; the server's is the one admission uses now, which a change of namespace rules makes
        newer than the inventory (webhook.serving.policyfile). `reshaper`: the MIG re-cuts, after each
        pass's releases (webhook.queue.reshape), when the policy has `migReshaping`. `charges`: the charges of
        Pods that name their node (webhook.pools.charges; None: no API holds any), read by every pass with
        Pods to decide and counted as admission counts them; `wall`: the clock they expire by. `status`: where
        the pools' GPUPool statuses go while leading (webhook.queue.status). `heartbeat`: called each time
        the loop goes round (at least every TICK_SECONDS while it is not stuck; the leader process's
        supervisor kills a process whose loop stopped beating, webhook.serving.leaderproc)."""
        self._heartbeat = heartbeat
        self.inventory, self.waiting, self.elector = inventory, waiting, elector
        self.reshaper = reshaper
        self._charges, self._wall = charges, wall
        self._records = records.Recorder(charges)
        self._repairs = records.Repairs()
        self._status = StatusFeed(status, clock) if status is not None else None
        self._policy = policy
        self._rebind_lock = threading.Lock()
        self._next: tuple[QueueInventory, Waiting] | None = None  # to follow from the next pass on (`rebind`)
        self._releaser = releaser
        self._metrics = metrics or NoMetrics()
        self._clock = clock
        self._limiter = limiter
        self._writers = writers
        self._pool = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="gpupool-release")
        self._sending: set[Future[tuple[Release, ReleaseResult]]] = set()  # writes in flight, settled by the loop
        self._passed_at = float("-inf")  # when the last pass began (the loop's clock)
        self._reported_at = float("-inf")  # when the backlog was last reported to the metrics
        self._changes_seen: int | None = None  # the index's changes when the last pass had decided
        self._stop = threading.Event()
        self._shapes = Memo()  # what a Pod's shape decides, for one policy only
        self._shapes_for: Policy | None = None
        self._parking = Parking()  # the waiting shapes' requests and parked answers (webhook.queue.parking)
        self._teller = Teller(events, self._metrics)  # the Pods' Events (webhook.queue.telling)
        self._standing = Standing()  # the last pass's Waits, and where it ended (webhook.queue.standing)
        self._generation = -1  # the parked answers' generation the last pass ended with
        self._queue_now = 0.0  # the queue's clock when the pass under way began to decide
        self._uncertain: dict[PodKey, Release] = {}  # written, answer lost: looked up before undone
        self._refusals = Refusals()  # Pods whose releases the API refused: backed off, then given up on
        self._caught_up = False
        self._catch_up_since: float | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> Runner:
        for target, name in ((self.elector.run, "gpupool-leader"), (self.run, "gpupool-queue")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def rebind(self, inventory: QueueInventory, waiting: Waiting) -> None:
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
        self._shapes_for, self._changes_seen = None, None
        self._parking = Parking()
        self._standing = Standing()
        self._teller.afresh()
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
        try:
            while not self._stop.is_set():
                self._heartbeat()
                woke = self.waiting.wake.wait(ANSWER_SECONDS if self._sending else TICK_SECONDS)
                if self._stop.is_set():
                    return
                if not woke and self._clock() - self._passed_at < TICK_SECONDS:
                    self._answers()  # writes came back, nothing else changed: no pass for that
                    continue
                self.waiting.wake.clear()
                self._loop_once(tick=not woke)
        finally:
            self._answers(every=True)  # nothing of this leader's still in flight once it stops

    def _loop_once(self, *, tick: bool = False) -> None:
        """`tick`: nothing woke the loop (TICK_SECONDS went by); the pass is then made only if the index
        changed since the last one (a change no watch event announces, such as a reservation that expired,
        or an answer settled) or writes are in flight or unsettled: over an unchanged index and queue a
        pass decides what the last one did, and with a long queue that is not free."""
        self._take_rebind()
        leading = self.elector.leading()
        self._metrics.queue_leading(leading)
        self._tell_status(leading)
        if self._clock() - self._reported_at >= TICK_SECONDS:  # a walk of the whole queue: not every pass
            self._reported_at = self._clock()
            self._metrics.queue_waiting(self.waiting.backlog(datetime.now(UTC)))
        if not leading:
            self._caught_up, self._catch_up_since, self._changes_seen = False, None, None
            self._standing.forget()
            self._teller.afresh()
            self._answers()
            return
        if not self.inventory.ready or not self._catch_up():
            return
        if tick and self._unchanged():
            return
        try:
            result = self._pass()
        except Exception:  # a bug must not stop the queue for good: logged, and the next pass tries again
            log.exception("a pass of the queue failed")
            self._teller.afresh()  # (the Pods that changed before it are no longer known apart)
            return
        if result.decided >= BATCH:
            self.waiting.wake.set()

    def _tell_status(self, leading: bool) -> None:
        """The pools' statuses from the last pass (at most every STATUS_SECONDS), or forgotten when not leading."""
        if self._status is None:
            return
        try:
            self._status.look(leading, self.inventory.read)
        except Exception:  # a bug must not stop the queue: logged, and the next look tries again
            log.exception("the pools' status could not be worked out")

    def _unchanged(self) -> bool:
        """Would a pass now decide on exactly what the last one did (same index, queue and policy, nothing
        of its own in flight)? The queue's changes wake the loop, so they never reach this."""
        if self._sending or self._uncertain or self._policy(self.inventory) is not self._shapes_for:
            return False
        if self._refusals and self._refusals.due(self._passed_at, self._clock()):
            return False  # a refused Pod's backoff ran out: it is tried again
        if self.reshaper is not None and self.reshaper.active:  # Pods wait for a re-cut, or one is under way:
            return False  # idle and timeout clocks run
        bound = self._parking.wake_at()
        if bound is not None and self.waiting.now() >= bound:
            return False  # a parked Pod or gang has waited long: it may hold a pool now (webhook.queue.backfill)
        with self.inventory.read() as index:
            return index.changes == self._changes_seen

    def _catch_up(self) -> bool:
        """A new leader's watch must have reached the Lease's version (or had CATCH_UP_SECONDS to)."""
        if self._caught_up:
            return True
        wanted, since = self.elector.acquired_version, self._catch_up_since
        if since is None:
            self._catch_up_since = since = self._clock()
        if reached(self.inventory.pod_version(), wanted) or self._clock() - since >= CATCH_UP_SECONDS:
            self._caught_up = True
            self._catch_up_since = None
            return True
        self.waiting.wake.set()  # look again soon
        self._stop.wait(0.05)
        return False

    def run_pass(self) -> PassResult:
        """One pass, its writes answered before it returns (the loop's own passes do not wait for theirs)."""
        result = self._pass()
        return result._replace(released=result.released + self._answers(every=True))

    def _pass(self) -> PassResult:
        """Settle the writes answered since the last pass and those whose answer was lost, decide, send,
        tell. The writes are not waited for: the next pass may start while they are in flight (its index
        counts them as released), so room that appears meanwhile waits for no API round trip but its own.
        It goes on from the last one's end when it may (webhook.queue.standing): it decides only new Pods."""
        released = self._answers()
        self._resolve_uncertain()
        self._passed_at = self._clock()
        policy = self._policy(self.inventory)
        if policy is not self._shapes_for:
            self._shapes, self._shapes_for = Memo(), policy
            self._standing.forget()
        changed = self.waiting.take_changed()
        new = self._standing.tail(changed, self.waiting, self._parking.wake_at()) if self._may_go_on(policy) else None
        result = self._decide(policy, new, changed) if new is not None else None  # None: an earlier Pod's answer woke
        result = result or self._decide(policy, None, changed) or PassResult(0, [])  # (the whole is always decided)
        return result._replace(released=result.released + released)

    def _may_go_on(self, policy: Policy) -> bool:
        """May a pass go on from the last one's end (webhook.queue.standing)? Not while a Pod backs off, nor
        while MIG re-cuts follow the waits."""
        return not self._refusals and (self.reshaper is None or policy.mig_reshaping is None)

    def _decide(self, policy: Policy, new: list[Queued] | None, changed: Changed | None) -> PassResult | None:
        """Decide the whole queue (`new` None) or go on from the last pass's end with `new`, the Pods that
        arrived behind it (None when an answer the last pass took was woken meanwhile: decide the whole)."""
        now, self._queue_now = self._passed_at, self.waiting.now()  # (the queue's clock before deciding)
        going_on = new is not None
        carried = self._standing.carried()
        self._standing.forget()  # until this pass has ended
        if new is None:
            lines = self.waiting.lines()  # (webhook.queue.lines: copies of the lines that changed only)
            self._parking.keep_waiting(lines)
            back = self._refusals.held_back(self.waiting.get, now) if self._refusals else {}  # (hold no place)
            batch, last = read_batch(lines, policy, self._shapes, self._parking, back), lines.last
        else:
            last = new[-1].order if new else None
            batch = read_batch(new, policy, self._shapes, self._parking)._replace(carried=carried)
            if carried is None or any(gang in carried.judged_gangs for gang in batch.gangs):
                return None  # a member of a gang judged already: the gang is judged again, whole
        read = self._read_charges() if batch else ([], "")  # nothing to release: nothing to count them against
        if read is None:
            return PassResult(0, [])
        charges, version = read
        held = self.inventory.read()
        with held as index:
            self._parking.look(index, policy)
            generation = self._parking.generation
            if going_on and (self._parking.woken or generation != self._generation):
                return None  # something a Pod the last pass went over read changed: all are decided
            if self.reshaper is not None:
                self.reshaper.fence(index)  # no release to a node being re-cut
            # Counted as admission counts them: a charge taken back when the pass ends changes the index,
            # so while one counts, the next tick decides again (it may have expired by then).
            wall, ttl = self._wall(), policy.defaults.reservation_seconds
            # The room left for releases, once what the record will drop is dropped (shown long enough).
            limit = self._records.room(records.kept(charges, index, wall, ttl), wall, BATCH) if self._charges else BATCH
            with pending(index, charges, wall, now, releases=False):
                decided = decide_batch(
                    batch, index, policy, limit=limit, pause=Breather(held, self._clock), now=self.waiting.now()
                )
                self._changes_seen = index.changes
            if self._parking.generation != generation:  # every answer forgotten meanwhile: none to go on from
                decided = decided._replace(end=None)
            self._generation = self._parking.generation
            kept = records.kept(charges, index, wall, ttl) if self._charges is not None else []
            repairing = self._repairs.of(decided, going_on=going_on)
            mine = records.entries(repairing, index, policy, kept, wall) if self._charges is not None else None
        if mine is not None and mine.charges and not self._records.record(mine, kept, version):
            self._undo(decided.releases)
            self._changes_seen = None
            self.waiting.wake.set()  # decided again at once, with what was charged meanwhile
            return PassResult(0, decided.waits)
        return self._tell(decided, batch, last, policy, (going_on, changed))

    def _tell(
        self, decided: Plan, batch: Batch, last: Order | None, policy: Policy, of: tuple[bool, Changed | None]
    ) -> PassResult:
        """Keep the pass's Waits, tell them (the Pods, the pools' statuses), send its releases, re-cut."""
        going_on, changed = of  # (did it go on, and what changed since the last pass)
        if going_on:
            self._standing.went_on(decided, last)
        else:
            self._standing.took(decided, last, whole=decided.end is not None)
        hold = policy.defaults.queue_hold_after_seconds
        self._standing.judged(decided.waits, self._queue_now, hold, whole=not going_on)
        self._teller.passed(decided.waits, changed, self.waiting.get, whole=not going_on)
        if self._status is not None:
            self._status.passed(self._standing, self.waiting)
        released = self._send_all(decided.releases)
        if self.reshaper is not None:
            try:
                self.reshaper.step(policy, batch.request_of(), decided.waits, self.inventory)
            except Exception:  # a bug must not stop the queue: logged, and the next pass tries again
                log.exception("MIG re-cutting failed in a pass")
        waits, steps = self._standing.waits, (decided.decisions, decided.visits, decided.walked)
        return PassResult(released, waits, len(decided.releases), *steps)

    def _read_charges(self) -> tuple[list[Charge], str] | None:
        """The charges of Pods that name their node, as the API holds them now, and their version (none
        without a store); None when they cannot be read: the pass releases nothing rather than release
        into their room, and the next tick tries again."""
        if self._charges is None:
            return [], ""
        try:
            return self._charges.read()
        except ChargeError as exc:
            log.warning("no release this pass: the charges of Pods that name their node: %s", exc)
            self._changes_seen = None
            return None

    def _send_all(self, releases: list[Release]) -> int:
        """Send the releases in their order, at most `writers` in flight (answers taken meanwhile are
        settled, and counted in the result when released). Stops sending (and undoes the rest) once it may
        no longer lead."""
        released = 0
        for i, release in enumerate(releases):
            if self._stop.is_set() or self.elector.remaining() < 1.0:
                self._undo(releases[i:])  # may no longer lead: another replica decides them
                break
            while len(self._sending) >= self._writers:
                released += self._answers(one=True)
            delay = self._limiter.delay()
            if delay:
                self._stop.wait(delay)
            future = self._pool.submit(self._send, release)
            future.add_done_callback(self._on_answer)
            self._sending.add(future)
        return released

    def _on_answer(self, future: Future[tuple[Release, ReleaseResult]]) -> None:
        """On the writer's thread: a write that did not release its Pod wakes the loop, which decides it
        again; a release is settled at the loop's next look (at most ANSWER_SECONDS later)."""
        if not isinstance(future.result()[1], Released):
            self.waiting.wake.set()

    def _answers(self, *, one: bool = False, every: bool = False) -> int:
        """Settle the writes answered so far (with `one`, wait for at least one; with `every`, for all), on
        the loop's thread; the number released."""
        if not self._sending:
            return 0
        if every or one:
            until = futures.ALL_COMPLETED if every else futures.FIRST_COMPLETED
            done, pending = futures.wait(self._sending, return_when=until)
        else:
            done = {f for f in self._sending if f.done()}
            pending = self._sending - done
        self._sending = pending  # settled in release order (a set's is arbitrary): lost ones are looked up so
        return sum(self._answered(*f.result()) for f in sorted(done, key=lambda f: f.result()[0].queued.order))

    def _send(self, release: Release) -> tuple[Release, ReleaseResult]:
        namespace, name = release.queued.key
        # The fencing token of this leader's term, in the release itself: the validating webhook refuses
        # the write if it commits once the term is over (webhook.admission.fence).
        patch = with_token(release.patch, release.queued.view.shape, token(self.elector.identity, self.elector.term))
        try:
            return release, self._releaser.release(namespace, name, patch)
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
            ended = self._refusals.refused(release.queued, result.status, result.message, self._clock())
            if ended is not None:
                self._teller.record(ended)
        self._metrics.queue_released("error", None)
        return 0

    def _settle(self, release: Release, obj: dict[str, Any] | None) -> None:
        if obj is None:
            self._standing.forget()  # the Pod counts as queued again: decided again, with the Pods behind it
            self._teller.look_again(release.queued.key)
        policy = self.inventory.policy
        answer = pod_from_obj(obj, policy.gpu_resources, policy.partition_prefixes) if obj is not None else None
        with self.inventory.read() as index:
            settle(index, release, answer)

    def _undo(self, releases: list[Release]) -> None:
        self._standing.forget()
        with self.inventory.read() as index:
            for release in releases:
                self._teller.look_again(release.queued.key)
                settle(index, release, None)

    def _resolve_uncertain(self) -> None:
        for key, release in list(self._uncertain.items()):
            try:
                obj = self._releaser.read(*key)
            except OSError:
                # Still cannot ask: it keeps counting as released, and so do the others, asked from the next
                # pass on, this one last (one Pod that cannot be read never keeps the others unasked). Each
                # lookup can take the client's whole timeout: one after another, they held the loop past
                # the leader process's hung bound on an API that does not answer.
                self._uncertain[key] = self._uncertain.pop(key)
                break
            del self._uncertain[key]
            if obj is not None and not is_queued(obj):
                self._settle(release, obj)
                self._released(release, "released")
            else:
                self._settle(release, None)

    def _released(self, release: Release, outcome: str) -> None:
        self._refusals.forget(release.queued.key)
        self._teller.released(release, outcome)
