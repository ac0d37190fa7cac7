"""A pass walks the queue's lines, not its Pods (webhook/queue/lines.py): it leaves a shape's line at its
first Pod that waits. Checked against deciding every Pod on its own (each given a shape object of its own,
equal in content, so no line holds more than one Pod): the same releases, in the same order, and the
same Waits, over random queues of Pods of a few shapes in two namespaces, Pods of a workload group and of
a gang, on fleets with random room, before and after Pods have waited long. (With a class quota that
Pods released between two Pods of a shape fill, the later one decided on its own would wait for the
quota rather than with the first's answer: lines.py says why the line keeps the first's answer, which
never releases more; the quota itself is exact either way, tests/queue/test_standing.py.) And a pass over
a long line takes a step, not one per Pod."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.builders import index_of, policy
from tests.queue.helpers import MIXED, QUEUE, busy, enqueue, fleet, queued_pod
from webhook.domain.model import PodKey
from webhook.queue.lines import Waits, lines_of
from webhook.queue.release import Plan, Wait, decide_batch, plan, read_batch
from webhook.queue.waiting import Queued, Waiting

START = 1000.0


def scenario(seed: int) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """A policy, a fleet with random room, and 6 to 40 queued Pods of a few shapes (some created at once)."""
    rng = random.Random(seed)
    text = QUEUE
    objects = fleet(t4_busy=rng.randint(0, 4), l4_busy=rng.randint(0, 4))
    pol = policy(text)
    index = index_of(objects, pol)
    pods = []
    for k in range(rng.randint(6, 40)):
        annotations = rng.choice(MIXED)
        gang = bool(annotations and "gpupool.io/group-size" in annotations)
        gpus, namespace = (1, "q") if gang else (rng.randint(1, 3), rng.choice(["q", "q2"]))
        minute = rng.randrange(60)
        kw: dict[str, Any] = {"annotations": annotations} if annotations else {}
        pods.append(
            queued_pod(
                f"p{k}",
                namespace,
                pol,
                index,
                gpus=gpus,
                priority=rng.choice([0, 0, 0, 5]),
                created=f"2026-12-01T10:{minute:02d}:00Z",
                **kw,
            )
        )
    return text, objects, pods


def one_by_one(queued: list[Queued]) -> list[Queued]:
    """Each Pod with a shape object of its own (equal to the others'): a line each."""
    return [q._replace(view=q.view._replace(shape=type(q.view.shape)(*q.view.shape))) for q in queued]


def decided(seed: int, now: float, *, alone: bool) -> tuple[Plan, list[tuple[PodKey, str]]]:
    text, objects, pods = scenario(seed)
    pol = policy(text)
    index = index_of(objects, pol)
    waiting = Waiting(pol, clock=lambda: START)
    enqueue(pods, index, waiting)
    queued = waiting.ordered()
    batch = read_batch(one_by_one(queued) if alone else waiting.lines(), pol)
    result = decide_batch(batch, index, pol, now=now)
    return result, [(r.queued.key, str(r.pool)) for r in result.releases]


def answers(result: Plan) -> list[tuple[PodKey, str, str, tuple[Any, ...]]]:
    return [(w.queued.key, w.code, w.reason, w.pools) for w in result.waits]


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("waited", [0.0, 3600.0])
def test_walking_the_lines_decides_as_deciding_every_pod(seed: int, waited: float) -> None:
    lines, lines_released = decided(seed, START + waited, alone=False)
    alone, alone_released = decided(seed, START + waited, alone=True)
    assert lines_released == alone_released
    assert sorted(answers(lines)) == sorted(answers(alone))
    assert len(lines.waits) == len(alone.waits)
    assert lines.walked <= alone.walked


def test_a_pass_over_a_long_line_takes_a_step_and_lists_every_pod() -> None:
    """2,000 Pods of one shape wait for a full T4 node; one more GPU frees: the pass takes a step for the
    line (its first Pod waits), and its Waits still list all 2,000, in order, each with the line's answer."""
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    waiting = Waiting(pol)
    pods = [
        queued_pod(
            f"p{k:04d}",
            "q",
            pol,
            index,
            gpus=2,
            created=f"2026-12-01T{10 + k // 3600:02d}:{k // 60 % 60:02d}:{k % 60:02d}Z",
        )
        for k in range(2000)
    ]
    enqueue(pods, index, waiting)
    enqueue([busy("t4-a", 3)], index, waiting)  # (3 of 4 busy: one free, not enough for 2)
    result = plan(waiting.lines(), index, pol)
    assert (result.releases, result.walked) == ([], 1)
    assert [w.queued.key[1] for w in result.waits] == [f"p{k:04d}" for k in range(2000)]
    assert {(w.code, w.pools) for w in result.waits} == {(result.waits[0].code, result.waits[0].pools)}
    assert lines_of(waiting.ordered()).shapes == waiting.lines().shapes


@pytest.mark.parametrize("seed", range(10))
def test_a_line_keeps_its_pods_in_release_order_whatever_order_they_come_and_go_in(seed: int) -> None:
    """Pods of one shape arrive in a random order (a list of a namespace comes in the order of names, not
    of creation), some leave and come back, and the line is read now and then: it always reads as the
    Pods that wait, in release order."""
    rng = random.Random(seed)
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    waiting = Waiting(pol)
    objs = [
        queued_pod(
            f"p{k:04d}", "q", pol, index, created=f"2026-12-01T10:{k // 60 % 60:02d}:{k % 60:02d}Z", priority=k % 3
        )
        for k in range(600)
    ]
    rng.shuffle(objs)
    present: dict[str, dict[str, Any]] = {}
    for step, obj in enumerate(objs):
        enqueue([obj], index, waiting)
        present[obj["metadata"]["name"]] = obj
        if present and rng.random() < 0.3:
            gone = present.pop(rng.choice(sorted(present)))
            waiting.apply("pods", "DELETED", gone)
        if not step % 97:
            assert [q for line in waiting.lines().shapes for q in line] == waiting.ordered()
    (line,) = waiting.lines().shapes
    assert [q.key[1] for q in line] == [q.key[1] for q in waiting.ordered()] and len(line) == len(present)


class Counted(tuple[Queued, ...]):
    """A line that counts the Pods read from it."""

    reads = 0

    def __getitem__(self, i: Any) -> Any:
        Counted.reads += 1
        return super().__getitem__(i)


def test_a_reader_of_some_waits_walks_only_the_runs_it_keeps() -> None:
    """The MIG planner reads the Pods that wait for capacity (webhook/queue/reshape_inputs.py): of 2,000 Pods
    waiting in one run for a quota and 3 in a run for room, it gets the 3, in order, and reads no Pod of
    the other run."""
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    waiting = Waiting(pol)
    pods = [
        queued_pod(f"p{k:04d}", "q", pol, index, created=f"2026-12-01T10:{k // 60 % 60:02d}:{k % 60:02d}Z")
        for k in range(2003)
    ]
    enqueue(pods, index, waiting)
    ordered = waiting.ordered()
    quota, room = Counted(ordered[:2000]), tuple(ordered[2000:])
    waits = Waits()
    waits.run(Wait(quota[0], "quota", "class quota"), quota, 0)
    waits.run(Wait(room[0], "capacity", "no room"), room, 0)
    Counted.reads = 0
    kept = list(waits.where(lambda w: w.code == "capacity"))
    assert [w.queued.key[1] for w in kept] == ["p2000", "p2001", "p2002"]
    assert Counted.reads == 0
    assert len(waits) == 2003
