"""A `now` Pod's read of the charges, shared by the calls of one worker waiting at once
(webhook.admission.charging.SharedReads): each call is answered by a read that began after it arrived
(what a read of its own would see), and calls arriving during a read share the next one."""

from __future__ import annotations

import threading
import time

from tests.conftest import wait_until
from webhook.admission.charging import SharedReads
from webhook.pools.charges import Charge, ChargeError


class GatedStore:
    """Charges whose every read waits for its gate to open, and answers with its own number as the version."""

    def __init__(self) -> None:
        self.gates: list[threading.Event] = []
        self.begun = 0
        self.fail = False
        self._lock = threading.Lock()

    def read(self) -> tuple[list[Charge], str]:
        with self._lock:
            self.begun += 1
            number = self.begun
            gate = self.gate(number)
        gate.wait(10)
        if self.fail:
            raise ChargeError(f"read {number} failed")
        return [Charge("q", f"read-{number}", "node-a", (("nvidia.com/gpu", 1),), 1e12)], str(number)

    def gate(self, number: int) -> threading.Event:
        while len(self.gates) < number:
            self.gates.append(threading.Event())
        return self.gates[number - 1]

    def write(self, charges: list[Charge], version: str) -> bool:
        return True


def calls(shared: SharedReads, n: int) -> tuple[list[threading.Thread], list[object]]:
    answers: list[object] = [None] * n

    def call(i: int) -> None:
        try:
            answers[i] = shared.read()[1]
        except ChargeError as exc:
            answers[i] = exc

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    return threads, answers


def test_calls_that_arrive_during_a_read_share_the_next_one_never_the_one_under_way() -> None:
    store = GatedStore()
    shared = SharedReads(store)
    first, first_answer = calls(shared, 1)
    wait_until(lambda: store.begun == 1, 5, "the first read under way")
    later, answers = calls(shared, 6)  # arrive while read 1 is under way: it began before them
    time.sleep(0.3)  # let them reach their wait
    store.gate(1).set()
    first[0].join(5)
    assert first_answer == ["1"]
    wait_until(lambda: store.begun == 2, 5, "the next read begun")
    store.gate(2).set()
    for thread in later:
        thread.join(5)
    assert answers == ["2"] * 6  # one read for six calls, begun after each of them arrived
    assert store.begun == 2


def test_a_call_alone_makes_a_read_of_its_own_each_time() -> None:
    store = GatedStore()
    for number in (1, 2, 3):
        store.gate(number).set()
    shared = SharedReads(store)
    assert [shared.read()[1] for _ in range(3)] == ["1", "2", "3"]  # never the last read's answer again


def test_a_failed_read_fails_every_call_sharing_it_and_the_next_call_reads_again() -> None:
    store = GatedStore()
    shared = SharedReads(store)
    first, _ = calls(shared, 1)
    wait_until(lambda: store.begun == 1, 5, "the first read under way")
    later, answers = calls(shared, 3)
    time.sleep(0.3)
    store.fail = True
    for number in (1, 2):
        store.gate(number).set()
    for thread in [*first, *later]:
        thread.join(5)
    assert all(isinstance(a, ChargeError) and "read 2 failed" in str(a) for a in answers)
    store.fail = False
    store.gate(3).set()
    assert shared.read()[1] == "3"
