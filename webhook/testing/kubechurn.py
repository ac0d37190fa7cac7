"""Churn: a cluster that keeps changing, for soak tests and benchmarks of a list+watch client.

A thread writes Pod changes into the simulator's store at a fixed rate, as a busy cluster's
controllers, scheduler and kubelets do:

- **add**: a new Pod cloned from one of the cluster's own (a GPU or a CPU Pod), Pending, on no node;
- **bind**: `bind_delay` seconds after a Pending Pod appears (one of its own, or one created by someone
  else through the API, e.g. a Pod a webhook admitted), it gets a node that matches its nodeSelector,
  whose taints it tolerates and that has its GPUs free, and turns Running; with no such node it stays
  Pending, as an unschedulable Pod does;
- **modify**: a status update (a container restart) or, for a Running Pod, its completion (Succeeded,
  its GPUs free again);
- **delete**: a Pod goes away.

Binds come first, then deletions that bring the number of GPU and of CPU Pods back to where they
were when the churn started (Pods created by others are deleted to match, so a steady stream of
creations does not grow the cluster), then a mix of adds, deletions and modifications. The share of
the mix that touches GPU Pods is `gpu_share`.

The churn follows the store's own event log, so its view includes every write, its own and others':
a bind never puts more GPUs on a node than it has. Only namespaces that held Pods when the churn
started are churned; Pods in namespaces created later are bound but never modified or deleted, so a
test can keep its own Pods still.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from webhook.testing.kubestore import Event, Expired, Store, kind_of

log = logging.getLogger(__name__)
Obj = dict[str, Any]
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910")
_NODES, _PODS = kind_of("nodes"), kind_of("pods")
_TEMPLATES = 64  # Pods of each kind kept as models for new ones
_BIND_TRIES = 30  # random nodes tried per bind, as a sampling scheduler would
_BIND_RETRIES = 3  # binds of an unschedulable Pod before it is left Pending
_TERMINAL = ("Succeeded", "Failed")

K = TypeVar("K")


class _Bag(Generic[K]):
    """A set with O(1) add, discard and uniform random choice."""

    def __init__(self) -> None:
        self._items: list[K] = []
        self._where: dict[K, int] = {}

    def add(self, item: K) -> None:
        if item not in self._where:
            self._where[item] = len(self._items)
            self._items.append(item)

    def discard(self, item: K) -> None:
        i = self._where.pop(item, None)
        if i is None:
            return
        last = self._items.pop()
        if i < len(self._items):
            self._items[i] = last
            self._where[last] = i

    def choice(self, rng: random.Random) -> K:
        return self._items[rng.randrange(len(self._items))]

    def clear(self) -> None:
        self._items.clear()
        self._where.clear()

    def __len__(self) -> int:
        return len(self._items)


@dataclass(slots=True)
class _Node:
    labels: dict[str, str]
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect) of NoSchedule/NoExecute taints
    gpus: int
    usable: bool  # Ready and schedulable
    used: int = 0  # GPUs held by Pods bound to it that have not finished


@dataclass(frozen=True, slots=True)
class _Pod:
    node: str
    gpus: int
    phase: str

    @property
    def holds(self) -> bool:
        return bool(self.node) and self.gpus > 0 and self.phase not in _TERMINAL


class Churn:
    """Writes Pod changes into `store` at `rate` writes per second from a thread; `start()`, `stop()`.

    `stats()` counts what was written by type. `resources` are the GPU resources counted against a
    node's allocatable.
    """

    def __init__(
        self,
        store: Store,
        rate: float,
        *,
        seed: int = 0,
        gpu_share: float = 0.25,
        bind_delay: float = 1.0,
        tick: float = 0.01,
        resources: Collection[str] = GPU_RESOURCES,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        if not 0 <= gpu_share <= 1:
            raise ValueError("gpu_share must be between 0 and 1")
        self._store = store
        self.rate = rate
        self._rng = random.Random(seed)
        self._gpu_share = gpu_share
        self._bind_delay = bind_delay
        self._tick = tick
        self._resources = tuple(resources)
        self._stop = threading.Event()
        self.errors: list[BaseException] = []  # what stopped the thread, if anything did
        self._thread: threading.Thread | None = None
        self._counts: Counter[str] = Counter()
        self._started = self._stopped = 0.0
        self._nodes: dict[str, _Node] = {}
        self._gpu_nodes: list[str] = []
        self._all_nodes: list[str] = []
        self._labelled: dict[tuple[str, str], list[str]] = {}  # node label -> nodes, for nodeSelectors
        self._pods: dict[str, _Pod] = {}  # "namespace/name" -> what it holds
        self._churned: dict[bool, _Bag[str]] = {True: _Bag(), False: _Bag()}  # GPU Pod? -> keys
        self._target = {True: 0, False: 0}
        self._namespaces: list[str] = []
        self._churned_namespaces: set[str] = set()
        self._templates: dict[bool, list[bytes]] = {True: [], False: []}
        self._pending: list[tuple[float, int, str, int]] = []  # heap of (due, serial, key, tries)
        self._unschedulable = 0
        self._position = 0
        self._serial = 0
        self._now = time.monotonic()
        with store.changed:
            self._resync(first=True)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Churn:
        if self._thread is not None:
            raise RuntimeError("the churn is already running")
        self._thread = threading.Thread(target=self._run, name="kubesim-churn", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._started and not self._stopped:
            self._stopped = time.monotonic()

    def stats(self) -> dict[str, float]:
        """Writes by type (add, bind, modify, complete, delete), their total, the seconds run, the
        Pods it churns (GPU and CPU), the Pods waiting to be bound and those it gave up binding."""
        with self._store.changed:
            seconds = (self._stopped or time.monotonic()) - self._started if self._started else 0.0
            return {
                **{k: float(v) for k, v in sorted(self._counts.items())},
                "events": float(sum(self._counts.values())),
                "seconds": seconds,
                "gpu_pods": float(len(self._churned[True])),
                "cpu_pods": float(len(self._churned[False])),
                "pending": float(len(self._pending)),
                "unschedulable": float(self._unschedulable),
            }

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        self._started = start = time.monotonic()
        done = 0
        try:
            while not self._stop.wait(self._tick):
                now = time.monotonic()
                due = int((now - start) * self.rate) - done
                if due > self.rate:  # more than a second behind (a stalled machine): skip, do not burst
                    done += due - int(self.rate)
                    due = int(self.rate)
                with self._store.changed:
                    self._step(due, now)
                done += due
        except Exception as exc:  # a bug here must not pass for a quiet cluster
            self.errors.append(exc)
            log.exception("kubesim churn failed")
            raise

    def step(self, writes: int, now: float | None = None) -> None:
        """Make `writes` changes now (what the thread does every tick; for tests)."""
        with self._store.changed:
            self._step(writes, time.monotonic() if now is None else now)

    def _step(self, budget: int, now: float) -> None:
        self._now = now
        self._follow()
        while budget > 0 and self._pending and self._pending[0][0] <= now:
            _, _, key, tries = heapq.heappop(self._pending)
            budget -= self._bind(key, tries)
        for gpu in (True, False):
            while budget > 0 and len(self._churned[gpu]) > self._target[gpu]:
                budget -= self._delete(gpu)
        while budget > 0:
            gpu = self._rng.random() < self._gpu_share
            if not self._churned[gpu] or not self._templates[gpu]:
                gpu = not gpu
                if not self._churned[gpu] or not self._templates[gpu]:
                    return
            roll = self._rng.random()
            if roll < 0.25 or (roll < 0.5 and len(self._churned[gpu]) < self._target[gpu]):
                budget -= self._add(gpu)
            elif roll < 0.5:
                budget -= self._delete(gpu)
            else:
                budget -= self._modify(self._churned[gpu].choice(self._rng), complete=roll < 0.6)

    # -- writes ---------------------------------------------------------------------------------

    def _add(self, gpu: bool) -> int:
        pod = orjson.loads(self._rng.choice(self._templates[gpu]))
        meta = pod["metadata"]
        self._serial += 1
        base = str(meta.get("name", "pod")).rsplit("-", 1)[0][:40]
        meta["name"] = f"{base}-{self._rng.getrandbits(24):06x}{self._serial % 1000:03d}"
        meta["namespace"] = self._rng.choice(self._namespaces)
        for field in ("uid", "resourceVersion", "creationTimestamp"):
            meta.pop(field, None)
        pod["spec"].pop("nodeName", None)
        pod["status"] = {"phase": "Pending", "qosClass": pod.get("status", {}).get("qosClass", "Burstable")}
        if self._store.get(_PODS, meta["namespace"], meta["name"]) is not None:
            return 0  # a name taken already: try something else
        return self._write(pod, "add", exists=False)

    def _delete(self, gpu: bool) -> int:
        key = self._churned[gpu].choice(self._rng)
        namespace, name = key.split("/", 1)
        event = self._store.remove(_PODS, namespace, name)
        self._counts["delete"] += 1
        self._seen(event, None)
        return 1

    def _modify(self, key: str, *, complete: bool) -> int:
        namespace, name = key.split("/", 1)
        body = self._store.get(_PODS, namespace, name)
        assert body is not None  # followed under the store's lock: what the churn holds exists
        pod = orjson.loads(body)
        status = pod.setdefault("status", {})
        containers = status.get("containerStatuses") or []
        if complete and status.get("phase") == "Running":
            status["phase"] = "Succeeded"
            for condition in status.get("conditions") or []:
                if condition.get("type") in ("Ready", "ContainersReady"):
                    condition["status"] = "False"
            for c in containers:
                started = (c.get("state") or {}).get("running", {}).get("startedAt", _now())
                c["state"] = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started}}
                c["ready"] = c["started"] = False
            return self._write(pod, "complete", exists=True)
        for c in containers:
            c["restartCount"] = int(c.get("restartCount", 0)) + 1
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations["kubesim.io/churn"] = str(self._serial)
        self._serial += 1
        return self._write(pod, "modify", exists=True)

    def _bind(self, key: str, tries: int) -> int:
        namespace, name = key.split("/", 1)
        body = self._store.get(_PODS, namespace, name)
        if body is None:
            return 0  # deleted before the scheduler got to it
        pod = orjson.loads(body)
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("nodeName") or status.get("phase", "Pending") != "Pending":
            return 0
        gpus = pod_gpus(spec, self._resources)
        node = self._pick_node(spec, gpus)
        if node is None:
            if tries + 1 < _BIND_RETRIES:
                self._schedule(key, self._bind_delay * 4 ** (tries + 1), tries + 1)
            else:
                self._unschedulable += 1
            return 0
        spec["nodeName"] = node
        started = _now()
        containers = spec.get("containers") or []
        pod["status"] = {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": started}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "startTime": started,
            "containerStatuses": [
                {
                    "name": c.get("name", ""),
                    "state": {"running": {"startedAt": started}},
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": c.get("image", ""),
                }
                for c in containers
            ],
            "qosClass": status.get("qosClass", "Burstable"),
        }
        return self._write(pod, "bind", exists=True)

    def _pick_node(self, spec: Mapping[str, Any], gpus: int) -> str | None:
        """A node that fits, tried at random among those carrying the rarest of the Pod's nodeSelector
        labels (a few of them: all, in random order)."""
        selector = spec.get("nodeSelector") or {}
        candidates = self._gpu_nodes if gpus else self._all_nodes
        for pair in selector.items():
            labelled = self._labelled.get(pair, [])
            if len(labelled) < len(candidates):
                candidates = labelled
        if not candidates:
            return None
        tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
        tries = (
            self._rng.sample(candidates, len(candidates))
            if len(candidates) <= _BIND_TRIES
            else (candidates[self._rng.randrange(len(candidates))] for _ in range(_BIND_TRIES))
        )
        for name in tries:
            node = self._nodes.get(name)
            if (
                node is not None
                and node.usable
                and node.gpus - node.used >= gpus
                and all(node.labels.get(k) == v for k, v in selector.items())
                and all(_tolerated(taint, tolerations) for taint in node.taints)
            ):
                return name
        return None

    def _write(self, pod: Obj, what: str, *, exists: bool) -> int:
        pod["kind"] = "Pod"  # stored bodies leave it out, as list items do
        event, _ = self._store.put(pod, exists=exists)
        self._counts[what] += 1
        self._seen(event, pod)
        return 1

    # -- following the store --------------------------------------------------------------------

    def _follow(self) -> None:
        """Catch up with writes made by others since the churn last looked."""
        while True:
            try:
                events, reached = self._store.events_after(self._position, 10_000)
            except Expired:
                self._resync(first=False)
                return
            for event in events:
                self._seen(event, None)
            if not events or reached == self._position:
                return

    def _seen(self, event: Event, obj: Obj | None) -> None:
        """Account for one write; `obj` is the written object when the churn made it (saves a decode)."""
        self._position = event.rv
        if event.kind is _NODES:
            if event.type == "DELETED":
                self._nodes.pop(event.key, None)
            else:
                self._add_node(event.key, obj if obj is not None else orjson.loads(event.body))
            return
        if event.kind is not _PODS:
            return
        key = event.key
        old = self._pods.pop(key, None)
        if old is not None and old.holds:
            self._use(old.node, -old.gpus)
        if event.type == "DELETED":
            for bag in self._churned.values():
                bag.discard(key)
            return
        pod = obj if obj is not None else orjson.loads(event.body)
        self._track(key, event.namespace, pod)
        if event.type == "ADDED" and not (pod.get("spec") or {}).get("nodeName"):
            self._schedule(key, self._bind_delay, 0)

    def _schedule(self, key: str, delay: float, tries: int) -> None:
        self._serial += 1
        heapq.heappush(self._pending, (self._now + delay, self._serial, key, tries))

    def _track(self, key: str, namespace: str, pod: Mapping[str, Any]) -> None:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        record = _Pod(str(spec.get("nodeName") or ""), pod_gpus(spec, self._resources), status.get("phase", "Pending"))
        self._pods[key] = record
        if record.holds:
            self._use(record.node, record.gpus)
        if namespace in self._churned_namespaces:
            self._churned[record.gpus > 0].add(key)

    def _use(self, node: str, gpus: int) -> None:
        slot = self._nodes.get(node)
        if slot is not None:
            slot.used += gpus

    def _add_node(self, name: str, obj: Mapping[str, Any]) -> None:
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        allocatable = status.get("allocatable") or {}
        gpus = sum(_count(allocatable.get(r)) for r in self._resources)
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        taints = tuple(
            (str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
            for t in spec.get("taints") or []
            if t.get("effect") in ("NoSchedule", "NoExecute")
        )
        old = self._nodes.get(name)
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        self._nodes[name] = _Node(
            labels=labels,
            taints=taints,
            gpus=gpus,
            usable=ready and not spec.get("unschedulable"),
            used=old.used if old is not None else 0,
        )
        for pair in labels.items():  # a label that changed leaves a stale entry: the fit check skips it
            if old is None or old.labels.get(pair[0]) != pair[1]:
                self._labelled.setdefault(pair, []).append(name)
        if old is None:
            self._all_nodes.append(name)
            if gpus:
                self._gpu_nodes.append(name)

    def _resync(self, *, first: bool) -> None:
        """Read the whole cluster (at the start, or when the churn fell behind the store's history)."""
        nodes, pods = self._store.snapshot(_NODES), self._store.snapshot(_PODS)
        self._nodes.clear()
        self._gpu_nodes.clear()
        self._all_nodes.clear()
        self._labelled.clear()
        for name, body in zip(nodes.keys, nodes.bodies, strict=True):
            self._add_node(name, orjson.loads(body))
        self._pods.clear()
        for bag in self._churned.values():
            bag.clear()
        if first:
            self._churned_namespaces = {key.split("/", 1)[0] for key in pods.keys}
            self._namespaces = sorted(self._churned_namespaces)
        seen = {True: 0, False: 0}
        for key, body in zip(pods.keys, pods.bodies, strict=True):
            pod = orjson.loads(body)
            self._track(key, key.split("/", 1)[0], pod)
            gpu = self._pods[key].gpus > 0
            if first:  # a uniform sample of each kind of Pod (reservoir sampling)
                seen[gpu] += 1
                if len(self._templates[gpu]) < _TEMPLATES:
                    self._templates[gpu].append(body)
                elif (j := self._rng.randrange(seen[gpu])) < _TEMPLATES:
                    self._templates[gpu][j] = body
        if first:
            self._target = {gpu: len(bag) for gpu, bag in self._churned.items()}
        self._position = pods.rv


def pod_gpus(spec: Mapping[str, Any], resources: Collection[str]) -> int:
    """The GPUs a Pod's containers request (limits where there is no request, as the API defaults)."""
    total = 0
    for container in spec.get("containers") or []:
        res = container.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        total += sum(_count(requests.get(r, limits.get(r))) for r in resources)
    return total


def _count(value: Any) -> int:
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def _tolerated(taint: tuple[str, str, str], tolerations: list[Obj]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t.get("effect") != effect:
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == key:
                return True
        elif t.get("key") == key and str(t.get("value", "")) == value:
            return True
    return False


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
