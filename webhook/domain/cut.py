"""A large node affinity kept as what gpupool needs of it: which of the known nodes it matches.

A Pod within gpupool's input limits may require one term of 64 requirements of 256 values (about 325 KiB
of JSON); kept whole in every replica while it waits, 700 such Pods took a replica past its memory limit
(issue 26, finding 8). What a decision asks of a requirement is whether a node's label is among its
values, and the nodes it is asked of are the ones the pool index knows: an `In` value no known node
carries matches none of them, a `NotIn` value no known node carries excludes none of them. So once the
`In`/`NotIn` values of a Pod's matchExpressions exceed CUT_AT characters, each such list is cut to the
values some known node carries for its key (`FleetLabels`), and what is kept is bounded by the fleet's
label values, not by what the Pod sent:

- a list that keeps every value is left as it is;
- a list cut to some values keeps those, as `CutValues` (equal only to an equal cut: never to a pool's
  requirement, which lists values nodes carry, so a release appends what admission would);
- an `In` cut to none matches no known node: its term keeps one `NOTHING` for all of them;
- a `NotIn` cut to none excludes no known node: it is dropped (a term left with no requirement keeps one
  `ANYTHING`, since a term with none matches no node).

The cut is exact for the nodes known when it was made, and stays exact until a known node carries a value
for one of its cut keys that none carried then. `Cut` records when (`FleetLabels.version`) and which keys
(`Cut.keys`, a mask of BITS bits), and `FleetLabels.stale` says when that happened: a stale Pod is decided by
nothing until it is read again in full (webhook.sources.rereads, webhook.queue.waiting).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple, overload

from webhook.domain.affinity import IN, NOT_IN, AffinityView, NodeRequirements, Requirement, Term
from webhook.domain.packed import PackedValues, packed

CUT_AT = 4096  # characters of a Pod's In/NotIn values past which they are cut: no ordinary Pod comes near
BITS = 1024  # of Cut.keys: a Pod naming 64 keys shares a bit with 6 % of the others, which only costs a read
_NONE: frozenset[str] = frozenset()


class Cut(NamedTuple):
    """That a Pod's values were cut, against the fleet's labels at `at`, on the keys of the mask `keys`."""

    at: int
    keys: int


def key_bit(key: str) -> int:
    """The bit of `Cut.keys` that stands for a label key."""
    return 1 << (hash(key) % BITS)


class CutValues(Sequence[str]):
    """The values of a longer list that known nodes carry. Read as those values; equal only to an equal
    cut (the full list had values no node carries, so it is equal to no list of carried values)."""

    __slots__ = ("_values",)

    def __init__(self, values: tuple[str, ...] | PackedValues) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self._values[i]

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CutValues) and self._values == other._values

    def __hash__(self) -> int:
        return hash(("cut", self._values))

    def __repr__(self) -> str:
        return f"CutValues({self._values!r})"


CUT_KEY = "gpupool.io/cut"  # the key of the two stand-ins: what they match depends on no label
NOTHING = Requirement(CUT_KEY, IN, CutValues(()))  # matches no node
ANYTHING = Requirement(CUT_KEY, NOT_IN, CutValues(()))  # matches every node


class FleetLabels:
    """The label values the known nodes carry, per key, and when each key last gained one. Written under
    the inventory's lock; read without it (each key's values are replaced whole, never changed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}
        self._carried: dict[str, tuple[str, frozenset[str]]] = {}  # key -> (its one string, its values)
        self._bits = [0] * BITS  # per bit of Cut.keys: the version at which a key of it last gained a value
        self.version = 0  # moves when any key gains a value no known node carried

    def carried(self, key: str) -> tuple[str, frozenset[str]]:
        """The fleet's own string of `key` (or `key` when no node carries it) and the values carried."""
        return self._carried.get(key, (key, _NONE))

    def change(self, old: Mapping[str, str] | None, new: Mapping[str, str] | None) -> None:
        """A node's labels went from `old` to `new` (None: no node)."""
        old, new = old or {}, new or {}
        if old == new:
            return
        with self._lock:
            gained = [(k, v) for k, v in new.items() if old.get(k) != v]
            for k, v in old.items():
                if new.get(k) != v:
                    self._count(k, v, -1)
            appeared = [k for k, v in gained if self._count(k, v, 1)]
            if appeared:
                self.version += 1  # after the values: a cut that read the new version has them
                for k in appeared:
                    self._bits[hash(k) % BITS] = self.version

    def _count(self, key: str, value: str, by: int) -> bool:
        """Count one node more (or less) carrying `value` for `key`; True when no node carried it."""
        counts = self._counts.setdefault(key, {})
        was = counts.get(value, 0)
        if was + by > 0:
            counts[value] = was + by
        else:
            counts.pop(value, None)
        if (was == 0) != (was + by <= 0):
            if counts:
                self._carried[key] = (self._carried.get(key, (key, _NONE))[0], frozenset(counts))
            else:
                self._carried.pop(key, None)
                self._counts.pop(key, None)
        return was == 0 and by > 0

    def stale(self, cut: Cut) -> bool:
        """Has a key of the cut gained a value since it was made (so the cut may be missing it)?"""
        mask, at, bits = cut.keys, cut.at, self._bits
        while mask:
            low = mask & -mask
            if bits[low.bit_length() - 1] > at:
                return True
            mask ^= low
        return False


def _chars(terms: tuple[Term, ...]) -> int:
    total = 0
    for t in terms:
        for r in t.expressions:
            if r.operator in (IN, NOT_IN):
                values = r.values
                total += values.chars() if isinstance(values, PackedValues) else sum(map(len, values))
    return total


def _carried(values: Sequence[str], carried: frozenset[str]) -> tuple[str, ...]:
    """The `values` some node carries: by the fewer of the two (a membership in a long packed list is one
    substring search), in the list's order, or sorted when read from the fleet's set."""
    if not carried:
        return ()
    if len(carried) < len(values):
        return tuple(sorted(c for c in carried if c in values))
    return tuple(v for v in values if v in carried)


def cut_terms(terms: tuple[Term, ...] | None, fleet: FleetLabels) -> tuple[tuple[Term, ...] | None, Cut | None]:
    """The terms with their In/NotIn values cut to those the fleet carries, and the cut; the terms as
    they are (and None) when their values are within CUT_AT characters."""
    if terms is None or _chars(terms) <= CUT_AT:
        return terms, None
    at, mask = fleet.version, 0  # the version before the values: a value added meanwhile makes it stale
    out = []
    for term in terms:
        kept: list[Requirement] = []
        nothing = False
        for r in term.expressions:
            if r.operator not in (IN, NOT_IN):
                kept.append(r)
                continue
            key, carried = fleet.carried(r.key)
            have = _carried(r.values, carried)
            if len(have) == len(r.values):
                kept.append(r)
                continue
            mask |= key_bit(r.key)
            if have:
                kept.append(Requirement(key, r.operator, CutValues(packed(have))))
            elif r.operator == IN:
                nothing = True
        if nothing:
            kept.append(NOTHING)
        elif not kept and term.expressions and not term.fields:
            kept.append(ANYTHING)
        out.append(Term(tuple(kept), term.fields))
    return tuple(out), Cut(at, mask)


def cut_requirements(needs: NodeRequirements, fleet: FleetLabels) -> tuple[NodeRequirements, Cut | None]:
    terms, cut = cut_terms(needs.terms, fleet)
    return (needs if cut is None else needs._replace(terms=terms)), cut


def cut_affinity(view: AffinityView, fleet: FleetLabels) -> tuple[AffinityView, Cut | None]:
    terms, cut = cut_terms(view.required, fleet)
    return (view if cut is None or terms is None else view._replace(terms=terms)), cut
