"""The judge of quotas exceeded: what the Pods of a queue namespace that count (ungated, not terminated)
hold against each of its quotas, and the quota's room for release latency (freed units, oldest first)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from bench.queueaudit.capacity import Capacity
from bench.queueaudit.records import BEFORE, Pod
from bench.queueaudit.room import Room


class QuotaRule(NamedTuple):
    """One quota of a namespace, as the benchmark wrote it: `kind` gpus (a ResourceQuota form gpupool
    enforces), class (a classQuota entry, `key` the class) or memory (memoryQuota, in MiB)."""

    namespace: str
    kind: str
    key: str
    hard: int

    @property
    def name(self) -> str:
        return f"{self.namespace} {self.kind} {self.key}"


@dataclass
class QuotaWatch:
    rule: QuotaRule
    used: int = 0
    peak: int = 0
    at_limit_writes: int = 0  # writes after which it was exactly at its limit
    excess_peak: int = 0
    writes_over: int = 0


class Quotas:
    """Every quota's use; a Pod's class and memory are its node's once bound, else its pool's (`capacity`)."""

    def __init__(self, rules: Iterable[QuotaRule], capacity: Capacity) -> None:
        self._capacity = capacity
        self.rules = list(rules)
        self.watches = [QuotaWatch(r) for r in self.rules]
        self._rules_of: dict[str, list[int]] = {}
        for i, rule in enumerate(self.rules):
            self._rules_of.setdefault(rule.namespace, []).append(i)
        self._room = [Room(r.hard) for r in self.rules]

    def amount(self, rule: QuotaRule, pod: Pod) -> int:
        if rule.kind == "gpus":
            return pod.gpus
        node = self._capacity.nodes.get(pod.node) if pod.node else None
        if rule.kind == "class":
            gpu_class = node.gpu_class if node is not None else pod.pool_class
            return pod.gpus if gpu_class == rule.key else 0
        memory = node.memory_mib if node is not None else self._capacity.pool_memory(pod.pool_product)
        return pod.gpus * memory

    def charge(self, pod: Pod) -> tuple[tuple[int, int], ...]:
        """The Pod starts to count: what it holds of each quota, (rule index, amount)."""
        counted = []
        for index in self._rules_of.get(pod.namespace, []):
            amount = self.amount(self.rules[index], pod)
            if amount:
                self.watches[index].used += amount
                counted.append((index, amount))
        return tuple(counted)

    def refund(self, counted: tuple[tuple[int, int], ...], at: float) -> None:
        """A Pod no longer counts: what it held is room again, stamped `at`."""
        for index, amount in counted:
            self.watches[index].used -= amount
            self._room[index].add(at, amount)

    def take(self, pod: Pod) -> tuple[float, int]:
        """A release takes its units of each quota it counts against: (when the last of them appeared,
        how many were missing in all)."""
        room_at, short_quota = BEFORE, 0
        for index in self._rules_of.get(pod.namespace, []):
            amount = self.amount(self.rules[index], pod)
            if amount:
                stamp, short = self._room[index].take(amount)
                room_at = max(room_at, stamp)
                short_quota += short
        return room_at, short_quota

    def check(self) -> None:
        for watch in self.watches:
            watch.peak = max(watch.peak, watch.used)
            if watch.used == watch.rule.hard:
                watch.at_limit_writes += 1
            if watch.used > watch.rule.hard:
                watch.writes_over += 1
                watch.excess_peak = max(watch.excess_peak, watch.used - watch.rule.hard)
