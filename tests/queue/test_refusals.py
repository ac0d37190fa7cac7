"""Releases the API refuses (a 413 from a webhook's body limit, any 4xx; a 5xx) are backed off, bounded
and ended: the leader never sends them again in a tight loop, the refused Pod holds no place while it
backs off (the Pods behind it are released), and after the last refusal an Event on the Pod says why."""

from __future__ import annotations

import copy
from itertools import pairwise
from typing import Any

import jsonpatch

from tests.builders import gpu_node, index_of, policy
from tests.queue.fakes import Events, Inventory, Leading
from tests.queue.helpers import enqueue, queued_pod
from webhook.pools.index import PoolIndex
from webhook.queue.refusals import MAX_REFUSALS, REFUSED
from webhook.queue.runner import Runner
from webhook.queue.waiting import Waiting
from webhook.sources.writes import Refused, Released, ReleaseResult

POLICY = "namespaces:\n  q: {placement: queue}\n  v: {placement: queue}\n"
TOO_LARGE = "request entity too large: the body is over 3145728 bytes"


class RefusingApi:
    """Answers each PATCH of the Pods in `refuse` with `status`, applies the others; counts them all."""

    def __init__(self, pods: dict[tuple[str, str], dict[str, Any]], refuse: set[str], status: int = 413) -> None:
        self.pods, self.refuse, self.status = pods, refuse, status
        self.sent: list[tuple[str, float]] = []
        self.now = 0.0

    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        self.sent.append((name, self.now))
        if name in self.refuse:
            return Refused(self.status, TOO_LARGE)
        return Released(jsonpatch.apply_patch(copy.deepcopy(self.pods[(namespace, name)]), patch))

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))


def setup(gpus_per_node: int, status: int = 413) -> tuple[Runner, RefusingApi, Events, PoolIndex]:
    """A 4-GPU Pod of q first in line, whose releases the API refuses, and a later 1-GPU Pod of v."""
    pol = policy(POLICY)
    index = index_of([gpu_node("t4-a", "Tesla-T4", gpus_per_node)], pol)
    waiting = Waiting(pol)
    annotations = {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": "4"}
    big = queued_pod("big", "q", pol, index, annotations=annotations, created="2026-12-01T10:00:00Z")
    victim = queued_pod("victim", "v", pol, index, created="2026-12-01T10:01:00Z")
    enqueue([big, victim], index, waiting)
    api = RefusingApi({("q", "big"): big, ("v", "victim"): victim}, refuse={"big"}, status=status)
    events = Events()
    runner = Runner(Inventory(index), waiting, Leading(), api, events=events, clock=lambda: api.now)  # type: ignore[arg-type]
    return runner, api, events, index


def passes(runner: Runner, api: RefusingApi, seconds: float, every: float = 0.05) -> None:
    """The leader passing as fast as it can (each refusal wakes it at once) for `seconds`."""
    end = api.now + seconds
    while api.now < end:
        runner.run_pass()
        api.now += every


def test_a_refused_release_holds_no_place_and_the_pods_behind_it_are_released() -> None:
    """The 4-GPU Pod fills the only node when decided, so the 1-GPU Pod of another namespace waits behind
    it; its release is refused (413), and on the very next pass the 1-GPU Pod is released."""
    runner, api, events, _ = setup(gpus_per_node=4)
    runner.run_pass()
    assert [name for name, _ in api.sent] == ["big"]

    runner.run_pass()

    assert [name for name, _ in api.sent] == ["big", "victim"]
    assert [e.pod for e in events.recorded if e.reason == "Released"] == ["victim"]


def test_a_refused_release_is_backed_off_bounded_and_ended_with_an_event() -> None:
    """Ten minutes of a leader passing every 50 ms: the refused Pod's release is sent MAX_REFUSALS times,
    each wait longer than the last, then never again; a Warning Event on it says what the API answered."""
    runner, api, events, _ = setup(gpus_per_node=8)

    passes(runner, api, 600.0)

    tries = [at for name, at in api.sent if name == "big"]
    assert len(tries) == MAX_REFUSALS
    gaps = [b - a for a, b in pairwise(tries)]
    assert all(later > earlier for earlier, later in pairwise(gaps)) and gaps[0] >= 1.0
    ended = [e for e in events.recorded if e.reason == REFUSED]
    assert [(e.pod, e.kind) for e in ended] == [("big", "Warning")]
    assert "413" in ended[0].message and TOO_LARGE in ended[0].message
    assert [e.pod for e in events.recorded if e.reason == "Released"] == ["victim"]


def test_a_pod_given_up_on_is_tried_again_once_it_changes() -> None:
    """The tenant fixes the Pod (a new resourceVersion): its release is tried again, and goes through."""
    runner, api, events, index = setup(gpus_per_node=8)
    passes(runner, api, 120.0)
    assert len([n for n, _ in api.sent if n == "big"]) == MAX_REFUSALS
    fixed = copy.deepcopy(api.pods[("q", "big")])
    fixed["metadata"]["resourceVersion"] = "200"
    api.pods[("q", "big")] = fixed
    api.refuse = set()
    enqueue([fixed], index, runner.waiting)

    runner.run_pass()

    assert [e.pod for e in events.recorded if e.reason == "Released"] == ["victim", "big"]


def test_refusals_of_a_failing_api_or_webhook_back_off_and_never_end() -> None:
    """A 500 (kube-apiserver's answer when a webhook fails: down, or refusing the review) says nothing
    certain about the Pod: backed off, bounded in rate, never given up on, and told once on the Pod."""
    runner, api, events, _ = setup(gpus_per_node=8, status=500)

    passes(runner, api, 600.0)

    tries = len([n for n, _ in api.sent if n == "big"])
    assert MAX_REFUSALS < tries <= 20  # 1, 2, 4, ... 60 s apart: 600 s hold about 15
    told = [e for e in events.recorded if e.reason == REFUSED]
    assert [(e.pod, e.kind) for e in told] == [("big", "Warning")] and "500" in told[0].message
