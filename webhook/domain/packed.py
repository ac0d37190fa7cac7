"""A long list of node-affinity values kept as one string, one copy per distinct list in the process.

A Pod within gpupool's input limits may list 256 values in each of 64 requirements of a term. Kept as a
tuple, each value is a string object of its own (about 49 bytes beside its characters) and a pointer,
and every copy of the requirements gpupool reads (the pool index's projection, the queue's view and its
`PodInfo`) would hold its own tuple and keep the decoded Pod's strings alive: 1.3 MiB kept for a Pod
that sent 309 KiB (bench/bench_pod_memory.py). `PackedValues` holds the values as one string, each value
between two newlines, and `packed` returns the one object already made for an equal list while any is
alive: what a replica keeps of a Pod's long value lists weighs about what the Pod sent of them, once,
however many of its copies and of the Pods of one workload hold them.

It is a `Sequence[str]` equal to (and hashing as) the tuple of its values, so a Requirement that holds
it compares, hashes and is read as one that holds the tuple. Only lists of more than PACK_AT values, none
of which contains a newline, are packed (label values never do): which form a list takes depends on its
values alone, so equal requirements always hold equal forms.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, overload

PACK_AT = 8  # lists of more values than this are packed: most Pods list one or two, a tuple reads fastest
_SEP = "\n"

_lock = threading.Lock()
_made: weakref.WeakValueDictionary[str, PackedValues] = weakref.WeakValueDictionary()


class PackedValues(Sequence[str]):
    """The values of a requirement, as one string; immutable. Membership is one substring search."""

    __slots__ = ("__weakref__", "_data", "_hash", "_len")

    def __init__(self, data: str, count: int, digest: int) -> None:
        """Made by `packed` only: `data` is the values, each between two newlines."""
        self._data, self._len, self._hash = data, count, digest

    def __len__(self) -> int:
        return self._len

    def chars(self) -> int:
        """The characters of its values, summed (without splitting them)."""
        return len(self._data) - self._len - 1

    def __iter__(self) -> Iterator[str]:
        return iter(self._data[1:-1].split(_SEP))

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return tuple(self)[i]

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and _SEP not in value and f"{_SEP}{value}{_SEP}" in self._data

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedValues):
            return self is other or self._data == other._data
        if isinstance(other, tuple):
            return len(other) == self._len and tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return self._hash  # the tuple's: equal to an equal tuple's

    def __repr__(self) -> str:
        return f"PackedValues({self._data!r})"  # one text per list: shape_digest reads the shape's repr

    def __reduce__(self) -> tuple[Any, tuple[tuple[str, ...]]]:
        return packed, (tuple(self),)


def packed(values: tuple[str, ...]) -> tuple[str, ...] | PackedValues:
    """`values` as a requirement keeps them: the tuple itself when short (or when a value holds a newline),
    else the one PackedValues of this list alive in the process."""
    if len(values) <= PACK_AT or any(_SEP in v for v in values):
        return values
    data = _SEP + _SEP.join(values) + _SEP
    with _lock:
        known = _made.get(data)
        if known is None:
            known = _made[data] = PackedValues(data, len(values), hash(values))
        return known
