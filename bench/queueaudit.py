"""The queue benchmark's judge: the simulator's audit log replayed write by write, never gpupool's own view.

bench/bench_queue.py runs the simulator with `--audit-log` (webhook.testing.kubeaudit): every write with
the object stored and the store's monotonic time. `Auditor` starts from the cluster as listed at one
resourceVersion and applies each later write in order, so after every write it knows what the cluster
holds, and judges:

- **GPUs overbooked**, at every moment: the GPUs that bound, non-terminated Pods request beyond their
  node's allocatable, plus the GPUs of released Pods (gate `gpupool.io/queue` removed, not bound yet, not
  terminated) that cannot all be placed at once on the free GPUs of the usable nodes (Ready, not
  cordoned) of their pool (first-fit decreasing, per pool; exact for Pods of one GPU). Reported: the
  most at any moment, how many writes left some overbooked, and GPU-seconds.
- **Quotas exceeded**, at every moment: for each quota of a queue namespace, what its Pods that count
  (ungated, not terminated: released or bound) hold beyond the hard limit: GPUs for a ResourceQuota in
  the forms gpupool enforces, devices of the class for a `classQuota` (the class of the node a Pod is
  bound to, else of the pool in its `gpupool.io/pool`), GPU memory for a `memoryQuota` (GPUs times the
  memory of the node, else the least of the pool's nodes).
- **Release latency**: each release is the write that removed the gate. Room is kept as units (GPUs per
  pool, GPUs or MiB per quota) stamped with the write that freed them (a Pod finishing or deleted, a node
  joining), oldest first: a release takes its units from the oldest room, as the queue's order takes the
  oldest waiting Pod first, and Pods placed by others (bound at creation, bound by the scheduler without
  passing the queue) take theirs when bound. "Room appeared" for a release is the latest of: when the
  last capacity unit it took appeared, when the last unit of each quota it counts against appeared, and
  when the Pod itself was created (room that waited for a Pod to come is not the queue's delay). The
  latency is the release's store time minus that. A release that finds too few units is overbooked (its
  pool) or over a quota, and is counted there as well.

Pools are products (a pool is the class and product of its nodes, and gpupool's nodeSelector sends a
released Pod to exactly those nodes: `signatures_off_pool` counts the releases whose constraints reach
other nodes than their pool's, which would make these figures wrong).
"""

from __future__ import annotations

import math
import threading
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from webhook.testing.kubefit import TERMINAL, NodeFit, PodNeed, matches_node_affinity, pod_requests, tolerates

GPU = "nvidia.com/gpu"
QUEUE_GATE = "gpupool.io/queue"
POOL = "gpupool.io/pool"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
CLASS_LABEL = "gpu.accelerator/class"
BEFORE = -math.inf  # the stamp of room that was there before the run

Obj = Mapping[str, Any]


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


class Room:
    """Free units in the order they appeared; the oldest are taken first."""

    def __init__(self, initial: int = 0) -> None:
        self._chunks: deque[list[float]] = deque()
        self.total = 0
        self.add(BEFORE, initial)

    def add(self, at: float, amount: int) -> None:
        if amount > 0:
            self._chunks.append([at, float(amount)])
            self.total += amount

    def take(self, amount: int) -> tuple[float, int]:
        """Take `amount` units: (when the last one taken appeared, how many were missing)."""
        last = BEFORE
        while amount > 0 and self._chunks:
            chunk = self._chunks[0]
            n = min(int(chunk[1]), amount)
            chunk[1] -= n
            amount -= n
            self.total -= n
            last = chunk[0]
            if chunk[1] <= 0:
                self._chunks.popleft()
        return last, amount


@dataclass(slots=True)
class Node:
    fit: NodeFit
    product: str
    gpus: int
    memory_mib: int
    gpu_class: str
    usable: bool
    used: int = 0


@dataclass(slots=True)
class Pod:
    namespace: str
    node: str
    phase: str
    gpus: int
    gated: bool
    pool: str  # gpupool.io/pool
    need: PodNeed | None
    created: float  # store time of its creation (BEFORE for Pods listed at the start)
    queued: bool  # in a queue namespace
    released_at: float | None = None
    counted: tuple[tuple[int, int], ...] = ()  # (quota rule index, amount) it holds
    room_taken: int = 0  # capacity units taken at its release, not yet bound

    @property
    def holds(self) -> bool:
        """Bound and not terminated: uses GPUs on its node."""
        return bool(self.node) and self.phase not in TERMINAL

    @property
    def counts(self) -> bool:
        """Holds quota: ungated and not terminated."""
        return self.queued and not self.gated and self.phase not in TERMINAL

    @property
    def pool_product(self) -> str:
        parts = self.pool.split("/")
        return parts[2] if len(parts) >= 3 else ""

    @property
    def pool_class(self) -> str:
        parts = self.pool.split("/")
        return parts[1] if len(parts) >= 3 else ""


class Release(NamedTuple):
    key: str
    at: float  # store time of the write that removed the gate
    namespace: str
    product: str
    gpus: int
    created: float
    room_at: float  # when room appeared (see the module's docstring)
    short_capacity: int
    short_quota: int

    @property
    def latency(self) -> float:
        return self.at - self.room_at


@dataclass
class Overbooking:
    peak: int = 0
    peak_at: float = 0.0
    writes_over: int = 0
    gpu_seconds: float = 0.0
    node_peak: int = 0  # of it, bound beyond a node's allocatable


@dataclass
class QuotaWatch:
    rule: QuotaRule
    used: int = 0
    peak: int = 0
    at_limit_writes: int = 0  # writes after which it was exactly at its limit
    excess_peak: int = 0
    writes_over: int = 0


def node_record(obj: Obj, class_of: Mapping[str, str]) -> Node:
    fit = NodeFit.of(obj)
    labels = fit.labels
    product = labels.get(PRODUCT_LABEL, "")
    memory = labels.get(MEMORY_LABEL, "0")
    gpu_class = labels.get(CLASS_LABEL) or class_of.get(product, "")
    ready_taints = {t.key for t in fit.taints if t.key.startswith("node.kubernetes.io/")}
    return Node(
        fit=fit,
        product=product,
        gpus=fit.allocatable.get(GPU, 0),
        memory_mib=int(memory) if memory.isdigit() else 0,
        gpu_class=gpu_class,
        usable=not fit.unschedulable and not ready_taints,
    )


def pod_record(obj: Obj, created: float, queue_namespaces: frozenset[str]) -> Pod | None:
    """The Pod as the judge follows it; None for one that requests no GPU and is not gated (never counts)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    gated = any((g or {}).get("name") == QUEUE_GATE for g in spec.get("schedulingGates") or [])
    gpus = pod_requests(spec).get(GPU, 0)
    if not gpus and not gated:
        return None
    namespace = str(meta.get("namespace") or "")
    pool = str((meta.get("annotations") or {}).get(POOL) or "")
    released = namespace in queue_namespaces and not gated and not spec.get("nodeName")
    return Pod(
        namespace=namespace,
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        gpus=gpus,
        gated=gated,
        pool=pool,
        need=PodNeed.of(obj) if released else None,
        created=created,
        queued=namespace in queue_namespaces,
    )


class Auditor:
    """Follows the cluster from a listed state through the audit log's writes (see the module docstring).
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
        self._class_of = dict(class_of)
        self.queue_namespaces = frozenset(queue_namespaces)
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, Pod] = {}
        self.rules = list(rules)
        self.quotas = [QuotaWatch(r) for r in self.rules]
        self._rules_of: dict[str, list[int]] = {}
        for i, rule in enumerate(self.rules):
            self._rules_of.setdefault(rule.namespace, []).append(i)
        self._quota_room = [Room(r.hard) for r in self.rules]
        self.capacity: dict[str, Room] = {}
        self.free: Counter[str] = Counter()  # free GPUs on usable nodes, per product
        self._by_product: dict[str, list[str]] = {}
        self._unbound: dict[str, set[str]] = {}  # released, not bound, not terminated: keys per product
        self._short: Counter[str] = Counter()  # GPUs of those that cannot be placed, per product
        self._node_excess = 0
        self.overbooking = Overbooking()
        self.releases: list[Release] = []
        self.binds: list[tuple[float, float]] = []  # (released at, bound at) of released Pods
        self.leases: list[tuple[float, str]] = []  # (store time, holderIdentity) of each Lease write
        self.nodes_added: list[tuple[float, str]] = []  # (store time, name) of each node created
        self.waiting: Counter[str] = Counter()  # gated Pods per namespace
        self.gaps = 0
        self.writes = 0
        self.last_at = BEFORE
        self.node_changes = 0  # node writes other than a new node (the benchmark makes none)
        self.signatures_off_pool = 0
        self.bound_off_pool = 0  # released Pods bound to a node of another pool than theirs
        self._signatures: dict[tuple[Any, ...], bool] = {}
        for obj in nodes:
            self._add_node(obj, BEFORE)
        for obj in pods:
            self._pod(_key(obj), obj, BEFORE, listed=True)
        for product, nodes_of in self._by_product.items():
            self.capacity[product] = Room(sum(self._free_on(n) for n in nodes_of))

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
                    self._add_node(obj, at)
                    self.nodes_added.append((at, str((obj.get("metadata") or {}).get("name") or "")))
                else:
                    self.node_changes += 1
            elif kind == "Lease":
                self.leases.append((at, "" if deleted else str((obj.get("spec") or {}).get("holderIdentity") or "")))
            self._check(at)

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
        if old.gated:
            self.waiting[old.namespace] -= 1
        if old.holds and not (new is not None and new.holds and new.node == old.node):
            self._use(old.node, -old.gpus, at)
        unbound = not old.node and old.released_at is not None and old.phase not in TERMINAL
        if unbound and (new is None or new.node or new.phase in TERMINAL):
            self._unbound.get(old.pool_product, set()).discard(key)
            if new is None or new.phase in TERMINAL:  # released, gone before binding: its room is free again
                room = self.capacity.get(old.pool_product)
                if room is not None:
                    room.add(at, old.room_taken)
            self._reshort(old.pool_product)
        if old.counts and not (new is not None and new.counts):
            for index, amount in old.counted:
                self.quotas[index].used -= amount
                self._quota_room[index].add(at, amount)
            if new is not None:
                new.counted = ()

    def _enter(self, key: str, old: Pod | None, new: Pod, at: float) -> None:
        if new.gated:
            self.waiting[new.namespace] += 1
        bound_now = new.holds and not (old is not None and old.holds and old.node == new.node)
        if old is not None and old.gated and not new.gated:
            self._release(key, old, new, at)
        if bound_now:
            self._use(new.node, new.gpus, at)
            if new.released_at is not None:
                self.binds.append((new.released_at, at))
                new.room_taken = 0
                node = self.nodes.get(new.node)
                if node is None or node.product != new.pool_product:
                    self.bound_off_pool += 1
            else:  # placed by someone else than the queue: takes room as it binds
                node = self.nodes.get(new.node)
                if node is not None and node.usable and at != BEFORE:
                    self._room(node.product).take(new.gpus)
        if new.counts and not (old is not None and old.counts):
            new.counted = self._charge(new)

    def _release(self, key: str, old: Pod, new: Pod, at: float) -> None:
        product = new.pool_product
        new.released_at = at
        self._signature(new, product)
        short_capacity = 0
        room_at = BEFORE
        if not new.node:
            room_at, short_capacity = self._room(product).take(new.gpus)
            new.room_taken = new.gpus - short_capacity
            self._unbound.setdefault(product, set()).add(key)
            self._reshort(product)
        short_quota = 0
        for index in self._rules_of.get(new.namespace, []):
            amount = self._amount(self.rules[index], new)
            if amount:
                stamp, short = self._quota_room[index].take(amount)
                room_at = max(room_at, stamp)
                short_quota += short
        self.releases.append(
            Release(
                key=key,
                at=at,
                namespace=new.namespace,
                product=product,
                gpus=new.gpus,
                created=old.created,
                room_at=max(room_at, old.created),
                short_capacity=short_capacity,
                short_quota=short_quota,
            )
        )

    def _signature(self, pod: Pod, product: str) -> None:
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
            exact = reached == {n for n in self._by_product.get(product, []) if self.nodes[n].usable}
            self._signatures[signature] = exact
        if not exact:
            self.signatures_off_pool += 1

    # --- quotas -----------------------------------------------------------------------------------------

    def _amount(self, rule: QuotaRule, pod: Pod) -> int:
        if rule.kind == "gpus":
            return pod.gpus
        node = self.nodes.get(pod.node) if pod.node else None
        if rule.kind == "class":
            gpu_class = node.gpu_class if node is not None else pod.pool_class
            return pod.gpus if gpu_class == rule.key else 0
        memory = node.memory_mib if node is not None else self._pool_memory(pod.pool_product)
        return pod.gpus * memory

    def _pool_memory(self, product: str) -> int:
        memories = [self.nodes[n].memory_mib for n in self._by_product.get(product, [])]
        return min(memories) if memories else 0

    def _charge(self, pod: Pod) -> tuple[tuple[int, int], ...]:
        counted = []
        for index in self._rules_of.get(pod.namespace, []):
            amount = self._amount(self.rules[index], pod)
            if amount:
                self.quotas[index].used += amount
                counted.append((index, amount))
        return tuple(counted)

    # --- capacity ---------------------------------------------------------------------------------------

    def _add_node(self, obj: Obj, at: float) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        node = node_record(obj, self._class_of)
        self.nodes[name] = node
        if not node.gpus:
            return
        self._by_product.setdefault(node.product, []).append(name)
        if node.usable:
            self.free[node.product] += node.gpus
            if at != BEFORE:
                self._room(node.product).add(at, node.gpus)
                self._reshort(node.product)

    def _room(self, product: str) -> Room:
        room = self.capacity.get(product)
        if room is None:
            room = self.capacity[product] = Room()
        return room

    def _free_on(self, name: str) -> int:
        node = self.nodes[name]
        return max(node.gpus - node.used, 0) if node.usable else 0

    def _use(self, name: str, gpus: int, at: float) -> None:
        """`gpus` more (or fewer) GPUs bound on a node; a release of GPUs is room for its pool."""
        node = self.nodes.get(name)
        if node is None or not gpus:
            return
        before_free, before_excess = self._free_on(name), max(node.used - node.gpus, 0)
        node.used += gpus
        self._node_excess += max(node.used - node.gpus, 0) - before_excess
        if node.usable and node.gpus:
            self.free[node.product] += self._free_on(name) - before_free
            if gpus < 0 and at != BEFORE:
                self._room(node.product).add(at, -gpus)
            self._reshort(node.product)

    def _reshort(self, product: str) -> None:
        """GPUs of the released, unbound Pods of a pool that its free GPUs cannot take all at once."""
        keys = self._unbound.get(product) or set()
        pods = [self.pods[k] for k in keys if k in self.pods]
        if not pods:
            self._short.pop(product, None)
            return
        if all(p.gpus == 1 for p in pods):
            self._short[product] = max(len(pods) - self.free[product], 0)
            return
        free = sorted((self._free_on(n) for n in self._by_product.get(product, [])), reverse=True)
        short = 0
        for pod in sorted(pods, key=lambda p: -p.gpus):
            for i, room in enumerate(free):
                if room >= pod.gpus:
                    free[i] -= pod.gpus
                    break
            else:
                short += pod.gpus
        self._short[product] = short

    # --- judging ----------------------------------------------------------------------------------------

    def _account_time(self, at: float) -> None:
        """GPU-seconds: what was overbooked since the last write, for the time until this one."""
        if self.last_at != BEFORE:
            self.overbooking.gpu_seconds += self._overbooked() * max(at - self.last_at, 0.0)
        self.last_at = at

    def _overbooked(self) -> int:
        return self._node_excess + sum(self._short.values())

    def _check(self, at: float) -> None:
        over = self._overbooked()
        book = self.overbooking
        if over:
            book.writes_over += 1
            if over > book.peak:
                book.peak, book.peak_at = over, at
        book.node_peak = max(book.node_peak, self._node_excess)
        for watch in self.quotas:
            watch.peak = max(watch.peak, watch.used)
            if watch.used == watch.rule.hard:
                watch.at_limit_writes += 1
            if watch.used > watch.rule.hard:
                watch.writes_over += 1
                watch.excess_peak = max(watch.excess_peak, watch.used - watch.rule.hard)

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
                "room": {product: room.total for product, room in self.capacity.items()},
            }


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
