"""The waiting Pods by line: what lets a pass of the queue walk its shapes, not its Pods.

Within a pass (webhook.queue.release) a Pod of no workload group that waits makes every later Pod of its
shape wait too, with the same answer, and they leave nothing to the Pods behind them: room and quota only
get taken within a pass, and what the first one waits for stays blocked. So what a pass over the whole
queue decides is fixed by each shape's Pods up to its first that waits, and by the Pods of workload groups
(each decided by its own group's pools). A `Lines` holds the waiting Pods so: one line per shape of the
Pods of no workload group, and one line of the Pods of workload groups, each in release order; the pass
merges the lines by order and leaves a line once it waits, so it takes one step per release, per shape and
per group Pod, whatever the number of Pods behind them.

That a later Pod of the shape waits with the first's answer is the rule passes have always decided by
(they took the first's Wait for each later Pod of its shape, Pod by Pod), not a new one, and it never
releases more than deciding each Pod afresh would: within a pass room and quota only get taken, so a
later Pod of the shape could not go either. Deciding it afresh could still answer otherwise in two cases:
its namespace's quota filled meanwhile by Pods of other shapes released between the two (it would then
wait for the quota, which the Pods behind it must leave to it), or it has waited long where the first had
not (it would hold a node). The line leaves it waiting with the first's answer, as before; the next pass
in which it is its shape's first Pod decides it afresh.

A pass's `Waits` hold the rest of each line it left as a run: the Wait of its first Pod that waits and
the line from there, expanded to one Wait per Pod only when read (the leader's loop never reads them
whole: the pools' and namespaces' statuses count the runs, webhook.queue.status).
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, overload

from webhook.domain.model import PodKey, PoolKey

if TYPE_CHECKING:  # (webhook.queue.waiting keeps its lines; a Wait holds a Queued)
    from webhook.queue.outcomes import Wait
    from webhook.queue.waiting import Queued

Order = tuple[int, str, str, str]  # waiting.order_of
_ORDER = operator.attrgetter("order")


class Lines(NamedTuple):
    """The waiting Pods, in release order: per shape those of no workload group, and those of groups."""

    shapes: tuple[tuple[Queued, ...], ...]  # one line per shape object, none empty
    grouped: tuple[Queued, ...]  # the Pods of workload groups
    last: Order | None  # the order of the last Pod of all; None: no Pod

    def pods(self) -> list[Queued]:
        """Every Pod, in release order (a walk of them all: for the MIG planner and previews)."""
        return list(heapq.merge(*self.shapes, self.grouped, key=_ORDER))


class Line:
    """One line of waiting Pods, kept in release order as Pods come and go (webhook.queue.waiting keeps
    one per shape, and one of the Pods of workload groups). A Pod behind the last is appended; one that is
    not waits among the `pending` until there are more of them than an eighth of the line (or the line is
    read), then all are put in order by one sort of the line: so a list of a whole namespace, which comes
    in the order of names, costs a few sorts of each line, not a move of half of it per Pod. Its tuple is
    made again only once it changed. Not thread-safe: `Waiting` calls it under its lock."""

    __slots__ = ("_copy", "_pending", "_placed")

    def __init__(self) -> None:
        self._placed: list[Queued] = []
        self._pending: dict[PodKey, Queued] = {}
        self._copy: tuple[Queued, ...] | None = ()

    def __len__(self) -> int:
        return len(self._placed) + len(self._pending)

    def add(self, q: Queued) -> None:
        self._copy = None
        placed = self._placed
        if not placed or q.order > placed[-1].order:
            placed.append(q)
            return
        self._pending[q.key] = q
        if len(self._pending) > 64 + len(placed) // 8:
            self._place()

    def remove(self, q: Queued) -> None:
        """Take out the Pod as it was added (its order then)."""
        self._copy = None
        if self._pending.pop(q.key, None) is not None:
            return
        placed = self._placed
        i = bisect.bisect_left(placed, q.order, key=_ORDER)
        if i < len(placed) and placed[i].key == q.key:
            del placed[i]

    def pods(self) -> tuple[Queued, ...]:
        """The line's Pods in release order (one tuple while the line does not change)."""
        if self._copy is None:
            if self._pending:
                self._place()
            self._copy = tuple(self._placed)
        return self._copy

    def _place(self) -> None:
        self._placed.extend(self._pending.values())
        self._pending.clear()
        self._placed.sort(key=_ORDER)  # (a sorted run and a short one: timsort merges them)


def lines_of(queued: Iterable[Queued]) -> Lines:
    """The lines of `queued` (any order): by shape object, as the pass tells shapes apart."""
    shapes: dict[int, list[Queued]] = {}
    grouped = []
    for q in queued:
        if q.view.group:
            grouped.append(q)
        else:
            shapes.setdefault(id(q.view.shape), []).append(q)
    lines = tuple(tuple(sorted(line, key=_ORDER)) for line in shapes.values())
    grouped.sort(key=_ORDER)
    return Lines(lines, tuple(grouped), last_of(lines, grouped))


def last_of(lines: Iterable[Sequence[Queued]], grouped: Sequence[Queued]) -> Order | None:
    ends = [line[-1].order for line in lines if line]
    if grouped:
        ends.append(grouped[-1].order)
    return max(ends) if ends else None


class Turns:
    """The turns of a pass's lines, in release order: each line's first Pod, sorted once, merged with a heap
    of the lines that go on to their next Pod (after a release; the line of workload groups' Pods), so a
    line that waits costs its place in one sort, not a heap's push and pop. `take` hands the next turn
    over: a line takes another only when given one `again`."""

    __slots__ = ("_again", "_at", "_firsts")

    def __init__(self, firsts: list[tuple[Order, int]]) -> None:
        firsts.sort()  # (orders differ: the line numbers are never compared)
        self._firsts, self._at = firsts, 0
        self._again: list[tuple[Order, int, int]] = []

    def __bool__(self) -> bool:
        return self._at < len(self._firsts) or bool(self._again)

    def take(self) -> tuple[int, int]:
        """The next turn: a line's number and the index of its Pod whose turn it is."""
        firsts, at, again = self._firsts, self._at, self._again
        if again and (at >= len(firsts) or again[0][0] < firsts[at][0]):
            _, n, i = heapq.heappop(again)
            return n, i
        self._at = at + 1
        return firsts[at][1], 0

    def again(self, order: Order, n: int, i: int) -> None:
        """Line `n` takes a turn again, at its Pod `i` (of release order `order`)."""
        heapq.heappush(self._again, (order, n, i))


Run = tuple["Wait", Sequence["Queued"], int]  # a Wait, and the line's Pods from that index on, which wait with it


class _Segment:
    """One pass's Waits: those listed first (Pods whose request is invalid: a run each), those decided or
    passed over one by one (keyed by the order of the step that made them: a gang's members all by its
    first's), and the runs of the lines it left."""

    __slots__ = ("first", "one_by_one", "runs")

    def __init__(self) -> None:
        self.first: list[Run] = []
        self.one_by_one: list[tuple[Order, Wait]] = []
        self.runs: list[Run] = []

    def __iter__(self) -> Iterator[Wait]:
        for run in self.first:
            yield from _expand(run)
        inputs: list[Iterable[tuple[Order, Wait]]] = [self.one_by_one]
        inputs.extend(((w.queued.order, w) for w in _expand(run)) for run in self.runs)
        for _, wait in heapq.merge(*inputs, key=operator.itemgetter(0)):
            yield wait

    def count(self) -> int:
        return len(self.one_by_one) + sum(len(line) - start for _, line, start in (*self.first, *self.runs))


def _expand(run: Run) -> Iterator[Wait]:
    wait, line, start = run
    for i in range(start, len(line)):
        q = line[i]
        yield wait if q is wait.queued else wait._replace(queued=q)


def _held_in(line: Sequence[Queued], start: int, held: Mapping[PodKey, Order]) -> int:
    """How many of the line's Pods from `start` on are held back (a look-up each, not a walk of the line)."""
    n = 0
    for key, order in held.items():
        i = bisect.bisect_left(line, order, lo=start, key=_ORDER)
        n += i < len(line) and line[i].key == key
    return n


class Waits(Sequence["Wait"]):
    """The Waits of the passes the leader stands on (one, or one over the whole queue and those that went on
    from its end), one per waiting Pod when read: in the order the passes found them."""

    def __init__(self) -> None:
        self._segments: list[_Segment] = [_Segment()]
        self._held_back: Mapping[PodKey, Order] = {}  # Pods a run holds that hold no place (backing off)
        self._list: list[Wait] | None = None
        self._index: tuple[dict[PodKey, Wait], dict[int, list[Run]]] | None = None  # for `wait_of`, when asked

    @classmethod
    def of(cls, waits: Iterable[Wait]) -> Waits:
        """These Waits, one by one, in their order."""
        made = cls()
        for wait in waits:
            made.one(wait.queued.order, wait)
        return made

    # --- made by a pass ---------------------------------------------------------------------------------

    def first(self, wait: Wait, line: Sequence[Queued] | None = None) -> None:
        """A Wait listed before the others (a request the policy now refuses), or with `line` a run of them."""
        self._segments[-1].first.append((wait, line if line is not None else (wait.queued,), 0))
        self._list = self._index = None

    def one(self, at: Order, wait: Wait) -> None:
        """A Wait decided (or taken parked) at the step of order `at`."""
        self._segments[-1].one_by_one.append((at, wait))
        self._list = self._index = None

    def run(self, wait: Wait, line: Sequence[Queued], start: int) -> None:
        """The line's Pods from `start` on wait with `wait` (its Pod is the line's at `start`, or before)."""
        if start < len(line):
            self._segments[-1].runs.append((wait, line, start))
            self._list = self._index = None

    def hold_back(self, held: Mapping[PodKey, Order]) -> None:
        """These Pods (by key, with their order) are not listed, though a run holds them (they back off:
        webhook.queue.refusals)."""
        self._held_back = held
        self._list = self._index = None

    def extend(self, other: Waits) -> None:
        """The Waits of a pass that went on from these ones' end, after them."""
        self._segments.extend(s for s in other._segments if s.first or s.one_by_one or s.runs)
        self._held_back = {**self._held_back, **other._held_back}
        self._list = self._index = None

    # --- read -------------------------------------------------------------------------------------------

    def one_by_one(self) -> Iterator[Wait]:
        """The Waits decided or passed over one by one (the Pods of workload groups, each line's first that
        waits, those listed first alone), without the runs: what a pass's own bookkeeping reads."""
        for segment in self._segments:
            yield from (w for w, line, _ in segment.first if len(line) == 1)
            yield from (w for _, w in segment.one_by_one)

    def runs(self) -> Iterator[Run]:
        """The runs (invalid lines included): a Wait, a line, and where in it the Pods that wait with it begin."""
        for segment in self._segments:
            yield from segment.first
            yield from segment.runs

    def where(self, keep: Callable[[Wait], bool]) -> Iterator[Wait]:
        """The Waits `keep` keeps, in their order, a run's Pods only when it keeps the run's Wait (they share
        it, and their shape): the runs it leaves out are not walked."""
        held = self._held_back
        for segment in self._segments:
            kept = _Segment()
            kept.first = [run for run in segment.first if keep(run[0])]
            kept.one_by_one = [(at, w) for at, w in segment.one_by_one if keep(w)]
            kept.runs = [run for run in segment.runs if keep(run[0])]
            yield from (w for w in kept if w.queued.key not in held)

    def wait_of(self, q: Queued) -> Wait | None:
        """The Wait of the Pod (as `q`'s key and order), if these Waits list it: a look-up, not a walk."""
        if q.key in self._held_back:
            return None
        if self._index is None:
            self._index = ({w.queued.key: w for w in self.one_by_one()}, {})
            for run in self.runs():
                self._index[1].setdefault(id(run[0].queued.view.shape), []).append(run)
        one = self._index[0].get(q.key)
        if one is not None:
            return one
        for wait, line, start in self._index[1].get(id(q.view.shape), ()):
            i = bisect.bisect_left(line, q.order, lo=start, key=_ORDER)
            if i < len(line) and line[i].key == q.key:
                return wait._replace(queued=line[i])
        return None

    def run_heads(self) -> Iterator[tuple[Wait, int]]:
        """Each run's Wait and how many Pods wait with it (those backing off counted): the statuses' counts."""
        for segment in self._segments:
            yield from ((w, len(line)) for w, line, _ in segment.first if len(line) != 1)
            yield from ((w, len(line) - start) for w, line, start in segment.runs)

    def pool_counts(self) -> dict[PoolKey, int]:
        """Per pool, the Pods that wait for it first (`Wait.pools[0]`), without walking the runs."""
        counts: dict[PoolKey, int] = {}
        for wait in self.one_by_one():
            if wait.pools:
                counts[wait.pools[0]] = counts.get(wait.pools[0], 0) + 1
        for wait, n in self.run_heads():
            if wait.pools:
                counts[wait.pools[0]] = counts.get(wait.pools[0], 0) + n
        return counts

    def firsts(self, most: int) -> tuple[dict[str, int], list[Wait]]:
        """Per namespace, how many Pods wait; and the Waits of its first `most` in release order (of each
        run, its first `most` only are read)."""
        held = self._held_back
        counts: dict[str, int] = {}
        found: dict[str, list[Wait]] = {}
        for wait in self.one_by_one():
            if wait.queued.key not in held:
                counts[wait.queued.key[0]] = counts.get(wait.queued.key[0], 0) + 1
                found.setdefault(wait.queued.key[0], []).append(wait)
        for run in self.runs():
            wait, line, start = run
            namespace = wait.queued.key[0]  # a shape's Pods are all of its namespace
            listed = [w for w in _expand((wait, line[start : start + most + len(held)], 0)) if w.queued.key not in held]
            counts[namespace] = (
                counts.get(namespace, 0) + len(line) - start - (_held_in(line, start, held) if held else 0)
            )
            found.setdefault(namespace, []).extend(listed[:most])
        firsts = [w for waits in found.values() for w in heapq.nsmallest(most, waits, key=lambda w: w.queued.order)]
        return counts, firsts

    def _all(self) -> list[Wait]:
        if self._list is None:
            held = self._held_back
            waits = (w for s in self._segments for w in s)
            self._list = [w for w in waits if w.queued.key not in held] if held else list(waits)
        return self._list

    def __iter__(self) -> Iterator[Wait]:
        if self._list is not None or self._held_back:
            return iter(self._all())
        return (w for s in self._segments for w in s)

    def __len__(self) -> int:
        if self._held_back:
            return len(self._all())
        return sum(s.count() for s in self._segments)

    @overload
    def __getitem__(self, i: int) -> Wait: ...

    @overload
    def __getitem__(self, i: slice) -> list[Wait]: ...

    def __getitem__(self, i: int | slice) -> Wait | list[Wait]:
        return self._all()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Waits | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Waits({self._all()!r})"
