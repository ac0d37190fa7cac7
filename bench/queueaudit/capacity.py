"""The judge of GPUs overbooked: the nodes, what is bound on them, the room of each pool (a pool is a
product), and the released Pods not bound yet that the free GPUs of their pool cannot all take at once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from bench.queueaudit.records import BEFORE, Node, Obj, Pod, node_record
from bench.queueaudit.room import Room
from webhook.testing.kubefit import matches_node_affinity, tolerates


@dataclass
class Overbooking:
    peak: int = 0
    peak_at: float = 0.0
    writes_over: int = 0
    gpu_seconds: float = 0.0
    node_peak: int = 0  # of it, bound beyond a node's allocatable


class Capacity:
    """GPUs per node and per pool as the writes leave them. `pods` is the replay's own map of the Pods it
    follows (the released, unbound ones are looked up there by key)."""

    def __init__(self, pods: Mapping[str, Pod], class_of: Mapping[str, str]) -> None:
        self._pods = pods
        self._class_of = dict(class_of)
        self.nodes: dict[str, Node] = {}
        self.rooms: dict[str, Room] = {}
        self.free: Counter[str] = Counter()  # free GPUs on usable nodes, per product
        self.by_product: dict[str, list[str]] = {}
        self.unbound: dict[str, set[str]] = {}  # released, not bound, not terminated: keys per product
        self._short: Counter[str] = Counter()  # GPUs of those that cannot be placed, per product
        self._node_excess = 0
        self.overbooking = Overbooking()
        self.signatures_off_pool = 0
        self._signatures: dict[tuple[Any, ...], bool] = {}

    def open_rooms(self) -> None:
        """Once the listed cluster is loaded: what is free on each pool's usable nodes is room from before."""
        for product, nodes_of in self.by_product.items():
            self.rooms[product] = Room(sum(self.free_on(n) for n in nodes_of))

    def add_node(self, obj: Obj, at: float) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        node = node_record(obj, self._class_of)
        self.nodes[name] = node
        if not node.gpus:
            return
        self.by_product.setdefault(node.product, []).append(name)
        if node.usable:
            self.free[node.product] += node.gpus
            if at != BEFORE:
                self.room(node.product).add(at, node.gpus)
                self.reshort(node.product)

    def room(self, product: str) -> Room:
        room = self.rooms.get(product)
        if room is None:
            room = self.rooms[product] = Room()
        return room

    def free_on(self, name: str) -> int:
        node = self.nodes[name]
        return max(node.gpus - node.used, 0) if node.usable else 0

    def pool_memory(self, product: str) -> int:
        """The least GPU memory of the pool's nodes (MiB), what a Pod not bound yet is counted for."""
        memories = [self.nodes[n].memory_mib for n in self.by_product.get(product, [])]
        return min(memories) if memories else 0

    def use(self, name: str, gpus: int, at: float) -> None:
        """`gpus` more (or fewer) GPUs bound on a node; a release of GPUs is room for its pool."""
        node = self.nodes.get(name)
        if node is None or not gpus:
            return
        before_free, before_excess = self.free_on(name), max(node.used - node.gpus, 0)
        node.used += gpus
        self._node_excess += max(node.used - node.gpus, 0) - before_excess
        if node.usable and node.gpus:
            self.free[node.product] += self.free_on(name) - before_free
            if gpus < 0 and at != BEFORE:
                self.room(node.product).add(at, -gpus)
            self.reshort(node.product)

    def reshort(self, product: str) -> None:
        """GPUs of the released, unbound Pods of a pool that its free GPUs cannot take all at once."""
        keys = self.unbound.get(product) or set()
        pods = [self._pods[k] for k in keys if k in self._pods]
        if not pods:
            self._short.pop(product, None)
            return
        if all(p.gpus == 1 for p in pods):
            self._short[product] = max(len(pods) - self.free[product], 0)
            return
        free = sorted((self.free_on(n) for n in self.by_product.get(product, [])), reverse=True)
        short = 0
        for pod in sorted(pods, key=lambda p: -p.gpus):
            for i, room in enumerate(free):
                if room >= pod.gpus:
                    free[i] -= pod.gpus
                    break
            else:
                short += pod.gpus
        self._short[product] = short

    def signature(self, pod: Pod, product: str) -> None:
        """Whether the released Pod's constraints reach exactly its pool's usable nodes (worked out once per
        distinct set of constraints)."""
        need = pod.need
        if need is None:
            return
        signature = (
            product,
            tuple(sorted(need.node_selector.items())),
            orjson.dumps(need.terms, option=orjson.OPT_SORT_KEYS),
            orjson.dumps(need.tolerations, option=orjson.OPT_SORT_KEYS),
        )
        exact = self._signatures.get(signature)
        if exact is None:
            reached = {
                name
                for name, node in self.nodes.items()
                if node.usable
                and matches_node_affinity(need, node.fit)
                and all(any(tolerates(t, taint) for t in need.tolerations) for taint in node.fit.taints)
            }
            exact = reached == {n for n in self.by_product.get(product, []) if self.nodes[n].usable}
            self._signatures[signature] = exact
        if not exact:
            self.signatures_off_pool += 1

    # --- judging ----------------------------------------------------------------------------------------

    def overbooked(self) -> int:
        return self._node_excess + sum(self._short.values())

    def account(self, seconds: float) -> None:
        """GPU-seconds: what was overbooked since the last write, for the `seconds` until this one."""
        self.overbooking.gpu_seconds += self.overbooked() * seconds

    def check(self, at: float) -> None:
        over = self.overbooked()
        book = self.overbooking
        if over:
            book.writes_over += 1
            if over > book.peak:
                book.peak, book.peak_at = over, at
        book.node_peak = max(book.node_peak, self._node_excess)
