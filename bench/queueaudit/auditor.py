"""The replay: the cluster as listed at one resourceVersion, then each later write of the audit log in
order, handed to the judges (capacity.py: overbooking; quotas.py; room.py: release latency)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from bench.queueaudit.capacity import Capacity
from bench.queueaudit.quotas import QuotaRule, Quotas
from bench.queueaudit.records import BEFORE, Obj, Pod, key_of, pod_record
from bench.queueaudit.room import Release
from webhook.testing.kubefit import TERMINAL

# The queue's Lease (namespace/name, as the replicas are configured: bench/queuebench/cluster.py). The
# leader writes another Lease too, gpupool-charges, with each pass that releases (webhook.queue.records):
# it has no holder, and read as the queue's it would say nobody leads.
QUEUE_LEASE = "gpupool-system/gpupool"


class Auditor:
    """Follows the cluster from a listed state through the audit log's writes (see the package docstring).
    Thread-safe: the benchmark feeds it from a thread and reads its counts from another."""

    def __init__(
        self,
        nodes: Iterable[Obj],
        pods: Iterable[Obj],
        rules: Iterable[QuotaRule],
        queue_namespaces: Iterable[str],
        class_of: Mapping[str, str],
    ) -> None:
        self._lock = threading.Lock()
        self.queue_namespaces = frozenset(queue_namespaces)
        self.pods: dict[str, Pod] = {}
        self._capacity = Capacity(self.pods, class_of)
        self._quotas = Quotas(rules, self._capacity)
        # The judges' figures, read by the benchmark and the tests under the names they had.
        self.nodes = self._capacity.nodes
        self.capacity = self._capacity.rooms
        self.free = self._capacity.free
        self.overbooking = self._capacity.overbooking
        self.rules = self._quotas.rules
        self.quotas = self._quotas.watches
        self.releases: list[Release] = []
        self.binds: list[tuple[float, float]] = []  # (released at, bound at) of released Pods
        self.leases: list[tuple[float, str]] = []  # (store time, holderIdentity) of each QUEUE_LEASE write
        self.terms: list[tuple[float, int]] = []  # (store time, leaseTransitions) of each QUEUE_LEASE write
        self.nodes_added: list[tuple[float, str]] = []  # (store time, name) of each node created
        self.waiting: Counter[str] = Counter()  # gated Pods per namespace
        self.gaps = 0
        self.writes = 0
        self.last_at = BEFORE
        self.node_changes = 0  # node writes other than a new node (the benchmark makes none)
        self.bound_off_pool = 0  # released Pods bound to a node of another pool than theirs
        for obj in nodes:
            self._capacity.add_node(obj, BEFORE)
        for obj in pods:
            self._pod(key_of(obj), obj, BEFORE, listed=True)
        self._capacity.open_rooms()

    @property
    def signatures_off_pool(self) -> int:
        """Releases whose constraints reach other nodes than their pool's (which would make the figures wrong)."""
        return self._capacity.signatures_off_pool

    # --- feeding ----------------------------------------------------------------------------------------

    def apply_line(self, line: bytes) -> None:
        self.apply(orjson.loads(line))

    def apply(self, entry: Mapping[str, Any]) -> None:
        with self._lock:
            if entry.get("gap"):
                self.gaps += 1
                return
            at, kind, obj = float(entry["at"]), entry["kind"], entry["object"]
            deleted = entry["type"] == "DELETED"
            self.writes += 1
            self._account_time(at)
            if kind == "Pod":
                self._pod(entry["key"], None if deleted else obj, at, listed=False)
            elif kind == "Node":
                if entry["type"] == "ADDED":
                    self._capacity.add_node(obj, at)
                    self.nodes_added.append((at, str((obj.get("metadata") or {}).get("name") or "")))
                else:
                    self.node_changes += 1
            elif kind == "Lease" and entry["key"] == QUEUE_LEASE:
                spec = {} if deleted else (obj.get("spec") or {})
                self.leases.append((at, str(spec.get("holderIdentity") or "")))
                self.terms.append((at, int(spec.get("leaseTransitions") or 0)))
            self._capacity.check(at)
            self._quotas.check()

    def _account_time(self, at: float) -> None:
        if self.last_at != BEFORE:
            self._capacity.account(max(at - self.last_at, 0.0))
        self.last_at = at

    # --- Pods -------------------------------------------------------------------------------------------

    def _pod(self, key: str, obj: Obj | None, at: float, *, listed: bool) -> None:
        old = self.pods.get(key)
        created = old.created if old is not None else (BEFORE if listed else at)
        new = pod_record(obj, created, self.queue_namespaces) if obj is not None else None
        if old is None and new is None:
            return
        if old is not None and new is not None:
            new.released_at, new.counted, new.room_taken = old.released_at, old.counted, old.room_taken
        if old is not None:
            self._leave(key, old, new, at)
        if new is None:
            self.pods.pop(key, None)
            return
        self.pods[key] = new
        self._enter(key, old, new, at)

    def _leave(self, key: str, old: Pod, new: Pod | None, at: float) -> None:
        """Undo what `old` held that `new` (None: deleted) does not."""
        capacity = self._capacity
        if old.gated:
            self.waiting[old.namespace] -= 1
        if old.holds and not (new is not None and new.holds and new.node == old.node):
            capacity.use(old.node, -old.gpus, at)
        unbound = not old.node and old.released_at is not None and old.phase not in TERMINAL
        if unbound and (new is None or new.node or new.phase in TERMINAL):
            capacity.unbound.get(old.pool_product, set()).discard(key)
            if new is None or new.phase in TERMINAL:  # released, gone before binding: its room is free again
                room = capacity.rooms.get(old.pool_product)
                if room is not None:
                    room.add(at, old.room_taken)
            capacity.reshort(old.pool_product)
        if old.counts and not (new is not None and new.counts):
            self._quotas.refund(old.counted, at)
            if new is not None:
                new.counted = ()

    def _enter(self, key: str, old: Pod | None, new: Pod, at: float) -> None:
        capacity = self._capacity
        if new.gated:
            self.waiting[new.namespace] += 1
        bound_now = new.holds and not (old is not None and old.holds and old.node == new.node)
        if old is not None and old.gated and not new.gated:
            self._release(key, old, new, at)
        if bound_now:
            capacity.use(new.node, new.gpus, at)
            if new.released_at is not None:
                self.binds.append((new.released_at, at))
                new.room_taken = 0
                node = capacity.nodes.get(new.node)
                if node is None or node.product != new.pool_product:
                    self.bound_off_pool += 1
            else:  # placed by someone else than the queue: takes room as it binds
                node = capacity.nodes.get(new.node)
                if node is not None and node.usable and at != BEFORE:
                    capacity.room(node.product).take(new.gpus)
        if new.counts and not (old is not None and old.counts):
            new.counted = self._quotas.charge(new)

    def _release(self, key: str, old: Pod, new: Pod, at: float) -> None:
        capacity = self._capacity
        product = new.pool_product
        new.released_at = at
        capacity.signature(new, product)
        short_capacity = 0
        room_at = BEFORE
        if not new.node:
            room_at, short_capacity = capacity.room(product).take(new.gpus)
            new.room_taken = new.gpus - short_capacity
            capacity.unbound.setdefault(product, set()).add(key)
            capacity.reshort(product)
        quota_at, short_quota = self._quotas.take(new)
        self.releases.append(
            Release(
                key=key,
                at=at,
                namespace=new.namespace,
                product=product,
                gpus=new.gpus,
                created=old.created,
                room_at=max(room_at, quota_at, old.created),
                short_capacity=short_capacity,
                short_quota=short_quota,
            )
        )

    # --- reading ----------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Counts for the benchmark's pacing: Pods waiting per namespace, releases so far, the last one."""
        with self._lock:
            return {
                "waiting": dict(self.waiting),
                "releases": len(self.releases),
                "last_release_at": self.releases[-1].at if self.releases else BEFORE,
                "last_at": self.last_at,
                "holder": self.leases[-1][1] if self.leases else "",
                "term": self.terms[-1][1] if self.terms else 0,
                "room": {product: room.total for product, room in self.capacity.items()},
            }
