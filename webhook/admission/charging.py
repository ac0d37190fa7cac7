"""Admission of a Pod that bypasses placement in a queued namespace, exact across replicas.

Such a Pod (it names its node, or is a DaemonSet's) cannot be gated, so the queue's leader never sees it
before it runs; its replica's reservation lives in that replica's memory only. So its validating call
(which sees the Pod's final name) decides it against the index plus the charges other calls wrote in the
API (webhook.pools.charges), and, when it is allowed, writes its own charge with the version it read, as
kube-apiserver's ResourceQuota admission writes `status.used`: a write that lost the race (409) means read
again and decide again, at most MAX_TRIES times. The charge is the Pod's reservation everywhere: neither
its mutating call nor its validating call reserves it in memory as well (it would be counted twice).

A `now` Pod's mutating call, where its pool is chosen, reads the same charges (`for_now`) and places it
counting them and the releases the queue's leader recorded there (webhook.queue.records), so it takes
neither a charged Pod's room nor the room of a release its replica's watch has not shown yet, such as a
gang's that a leader left half released.

Pure but for logging: the store is given (webhook.sources.charge_store on a Lease), the clocks too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from webhook.admission import verdict
from webhook.admission.prepared import Prepared
from webhook.admission.verdict import Verdict
from webhook.domain.policy import Policy
from webhook.pools.charges import MAX_CHARGES, RECORD_BYTES, Charge, ChargeError, ChargeStore, record_bytes

log = logging.getLogger("gpupool.admission")

MAX_TRIES = 5  # reads and writes of the charges per admission before it is refused as unavailable


# Given the charges as read and the wall clock's now: the verdict, and the charges that still count (not
# expired, their Pod not shown by the watch yet: webhook.pools.charges.unseen).
Decide = Callable[[list[Charge], float], tuple[Verdict, list[Charge]]]


def is_charged(prepared: Prepared, policy: Policy) -> bool:
    """Whether the Pod is charged in the API rather than reserved in memory: it bypasses placement, its
    namespace queues, and it requests devices itself."""
    return (
        prepared.bypasses
        and policy.placement(prepared.pod.namespace) == "queue"
        and bool(prepared.request.own_requests)
    )


def charge(
    store: ChargeStore,
    prepared: Prepared,
    decide: Decide,
    wall: Callable[[], float],
    ttl: float,
    *,
    write: bool = True,
) -> Verdict:
    """Decide the Pod against the charges and, if it is allowed on one node, charge it there for `ttl`
    seconds (until its watch shows it, or its creation failed after this call). `write` False (a dry
    run): decided against the charges just the same, and nothing written."""
    view, req = prepared.pod, prepared.request
    for _ in range(MAX_TRIES):
        try:
            charges, version = store.read()
        except ChargeError as exc:
            return _unavailable(f"could not read them: {exc}")
        now = wall()
        result, kept = decide(charges, now)
        if result.placement is None or not write:  # refused, reaching several nodes (charged nowhere), or a dry run
            return result
        mine = Charge(view.namespace, view.name, result.placement.node, req.own_requests, now + ttl)
        if len(kept) >= MAX_CHARGES or record_bytes([*kept, mine]) > RECORD_BYTES:
            return _unavailable(
                f"{len(kept)} Pods that bypass placement or were released wait for gpupool's watch already"
            )
        try:
            if store.write([*kept, mine], version):
                return result
        except ChargeError as exc:
            return _unavailable(f"could not write them: {exc}")
    return _unavailable(f"they changed {MAX_TRIES} times while this Pod was decided")


def for_now(store: ChargeStore) -> list[Charge]:
    """The charges and releases a `now` Pod is decided against: one read; none when they cannot be read
    (the Pod is then decided on the index alone, as without a queue, and a warning logged: a `now` Pod is
    never refused for the queue's Lease)."""
    try:
        return store.read()[0]
    except ChargeError as exc:
        log.warning("a `now` Pod decided without the queue's charges and releases: %s", exc)
        return []


def _unavailable(why: str) -> Verdict:
    return verdict.deny(
        "gpupool could not charge this Pod, which names its node in a namespace whose GPU Pods are queued, "
        f"against its quotas: the charges of such Pods are kept in the Kubernetes API, and {why}; retry",
        code=verdict.CODE_UNAVAILABLE,
        reason="charges",
    )


class SharedReads:
    """The charges' store for `now` Pods' mutating calls (`for_now`), whose reads the calls of one worker
    waiting at the same time share, as a database shares one log flush among the commits waiting for it.

    Exact as a read of its own: each call is answered by a read of the API that *began after the call
    did*, so it sees every charge and release written before the call began, as its own read would (what
    is written while the read is under way, neither sees for sure). A call that arrives while a read is
    under way waits for it to end and then for the next one, which the first of the waiting calls starts
    and all of them share: with N calls at once a worker makes about two reads, not N. A call alone waits
    for its own read, as before; one that arrives during a read waits at most for two (each bounded by the
    store's timeout). A read that fails fails every call that shares it (each is placed without the
    charges, `for_now`). Writes are not shared: `write` is the store's."""

    def __init__(self, store: ChargeStore) -> None:
        self._store = store
        self._changed = threading.Condition()
        self._begun = 0  # reads begun so far
        self._reading = False
        self._last: tuple[int, tuple[list[Charge], str] | Exception] | None = None  # the last read's number, outcome

    def read(self) -> tuple[list[Charge], str]:
        with self._changed:
            wanted = self._begun + 1  # the first read to begin from now on: any later one serves as well
            while True:
                if self._last is not None and self._last[0] >= wanted:
                    return _answer(self._last[1])
                if not self._reading:
                    break
                self._changed.wait()
            self._reading = True
            self._begun = number = self._begun + 1
        outcome: tuple[list[Charge], str] | Exception
        try:
            outcome = self._store.read()
        except Exception as exc:  # the store's ChargeError, or a bug: every call sharing the read raises it
            outcome = exc
        with self._changed:
            self._reading = False
            self._last = (number, outcome)
            self._changed.notify_all()
        return _answer(outcome)

    def write(self, charges: list[Charge], version: str) -> bool:
        return self._store.write(charges, version)


def _answer(outcome: tuple[list[Charge], str] | Exception) -> tuple[list[Charge], str]:
    if isinstance(outcome, ChargeError):
        raise ChargeError(*outcome.args)  # one of its own per caller: a raised exception carries its traceback
    if isinstance(outcome, Exception):
        raise outcome
    charges, version = outcome
    return list(charges), version  # each caller's own list
