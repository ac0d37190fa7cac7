"""Churn: a cluster that keeps changing, for soak tests and benchmarks of a list+watch client.

A thread writes Pod changes into the simulator's store at a fixed rate, as a busy cluster's
controllers, scheduler and kubelets do:

- **add**: a new Pod cloned from one of the cluster's own (a GPU or a CPU Pod), Pending, on no node;
- **bind**: `bind_delay` seconds after a Pending Pod appears (one of its own, or one created by someone
  else through the API, e.g. a Pod a webhook admitted), it gets a node that fits it by kube-scheduler's
  filters (webhook.testing.kubefit: taints, nodeSelector and node affinity, cpu, memory, GPUs and every
  other requested resource within allocatable) and turns Running; with no such node it stays Pending, as
  an unschedulable Pod does. A Pod that still has scheduling gates, or names another scheduler, is left
  alone; when the simulator's scheduler runs (`KubeSim.scheduler`), it binds instead of the churn;
- **modify**: a status update (a container restart) or, for a Running Pod, its completion (Succeeded,
  its GPUs free again);
- **delete**: a Pod goes away.

Binds come first, then deletions that bring the number of GPU and of CPU Pods back to where they
were when the churn started (Pods created by others are deleted to match, so a steady stream of
creations does not grow the cluster), then a mix of adds, deletions and modifications. The share of
the mix that touches GPU Pods is `gpu_share`.

The churn follows the store's own event log (a webhook.testing.kubefit.ClusterView), so its view
includes every write, its own and others': a bind never puts more on a node than it has. Only
namespaces that held Pods when the churn started are churned; Pods in namespaces created later are
bound but never modified or deleted, so a test can keep its own Pods still.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any, Generic, TypeVar

import orjson

from webhook.testing.kubefit import ClusterView, PodNeed, pod_requests
from webhook.testing.kubescheduler import running_on, schedulable, succeeded
from webhook.testing.kubestore import Event, Store, kind_of

log = logging.getLogger(__name__)
Obj = dict[str, Any]
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910")
_PODS = kind_of("pods")
_TEMPLATES = 64  # Pods of each kind kept as models for new ones
_BIND_TRIES = 30  # random nodes tried per bind, as a sampling scheduler would
_BIND_RETRIES = 3  # binds of an unschedulable Pod before it is left Pending

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


class Churn:
    """Writes Pod changes into `store` at `rate` writes per second from a thread; `start()`, `stop()`.

    `stats()` counts what was written by type. A Pod requesting any of `resources` is a GPU Pod (the
    `gpu_share` of the mix). Set `binds` False to leave binding to someone else (the simulator's
    scheduler).
    """

    def __init__(  # noqa: PLR0913 (the simulator's churn settings, by keyword)
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
        self.binds = True
        self._view = ClusterView(store)
        self._churned: dict[bool, _Bag[str]] = {True: _Bag(), False: _Bag()}  # GPU Pod? -> keys
        self._target = {True: 0, False: 0}
        self._namespaces: list[str] = []
        self._churned_namespaces: set[str] = set()
        self._templates: dict[bool, list[bytes]] = {True: [], False: []}
        self._pending: list[tuple[float, int, str, int]] = []  # heap of (due, serial, key, tries)
        self._queued: set[str] = set()  # Pods in the bind queue, or given up on
        self._unschedulable = 0
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
        while budget > 0 and self.binds and self._pending and self._pending[0][0] <= now:
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
        if complete and status.get("phase") == "Running":
            return self._write(succeeded(pod), "complete", exists=True)
        for c in status.get("containerStatuses") or []:
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
        if not schedulable(pod):
            return 0  # bound already, gated, another scheduler's, or done
        node = self._pick_node(PodNeed.of(pod))
        if node is None:
            if tries + 1 < _BIND_RETRIES:
                self._schedule(key, self._bind_delay * 4 ** (tries + 1), tries + 1)
            else:
                self._unschedulable += 1
            return 0
        return self._write(running_on(pod, node), "bind", exists=True)

    def _pick_node(self, need: PodNeed) -> str | None:
        """A node that fits, tried at random among those carrying the rarest of the Pod's nodeSelector
        labels (a few of them: all, in random order), as a sampling scheduler would."""
        candidates = self._view.candidates(need)
        if not candidates:
            return None
        tries = (
            self._rng.sample(candidates, len(candidates))
            if len(candidates) <= _BIND_TRIES
            else (candidates[self._rng.randrange(len(candidates))] for _ in range(_BIND_TRIES))
        )
        return next((name for name in tries if self._view.unfit(need, name) is None), None)

    def _write(self, pod: Obj, what: str, *, exists: bool) -> int:
        pod["kind"] = "Pod"  # stored bodies leave it out, as list items do
        event, _ = self._store.put(pod, exists=exists)
        self._counts[what] += 1
        self._seen(event, pod)
        return 1

    # -- following the store --------------------------------------------------------------------

    def _follow(self) -> None:
        """Catch up with writes made by others since the churn last looked."""
        seen = self._view.follow()
        if seen is None:  # fell behind the store's history: start over from the whole cluster
            self._resync(first=False)
            return
        for key, pod in seen:
            self._track(key, pod)

    def _seen(self, event: Event, obj: Obj | None) -> None:
        """Account for one of the churn's own writes (`obj`: the written object, saves a decode)."""
        pod = self._view.apply(event, obj)
        self._track(event.key, pod if event.type != "DELETED" else None)

    def _schedule(self, key: str, delay: float, tries: int) -> None:
        self._serial += 1
        heapq.heappush(self._pending, (self._now + delay, self._serial, key, tries))

    def _track(self, key: str, pod: Mapping[str, Any] | None) -> None:
        """Keep the churned bags and the bind queue in step with one Pod (None: it was deleted). A Pod
        that may be scheduled is queued for a bind `bind_delay` from now, once."""
        for bag in self._churned.values():
            bag.discard(key)
        if pod is None or not schedulable(pod):
            self._queued.discard(key)
        if pod is None:
            return
        if key.split("/", 1)[0] in self._churned_namespaces:
            self._churned[self._is_gpu(self._view.pods[key].requests)].add(key)
        if key not in self._queued and schedulable(pod):
            self._queued.add(key)
            self._schedule(key, self._bind_delay, 0)

    def _is_gpu(self, requests: Mapping[str, int]) -> bool:
        return any(requests.get(r, 0) > 0 for r in self._resources)

    def _resync(self, *, first: bool) -> None:
        """Read the whole cluster (at the start, or when the churn fell behind the store's history)."""
        for bag in self._churned.values():
            bag.clear()
        if first:
            snap = self._store.snapshot(_PODS)
            self._churned_namespaces = {key.split("/", 1)[0] for key in snap.keys}
            self._namespaces = sorted(self._churned_namespaces)
        seen = {True: 0, False: 0}
        for key, pod in self._view.resync():
            namespace = key.split("/", 1)[0]
            gpu = self._is_gpu(self._view.pods[key].requests)
            if namespace in self._churned_namespaces:
                self._churned[gpu].add(key)
            if first:  # a uniform sample of each kind of Pod (reservoir sampling)
                if schedulable(pod):
                    self._queued.add(key)  # the cluster's own Pending Pods stay as they are
                seen[gpu] += 1
                if len(self._templates[gpu]) < _TEMPLATES:
                    self._templates[gpu].append(orjson.dumps(pod))
                elif (j := self._rng.randrange(seen[gpu])) < _TEMPLATES:
                    self._templates[gpu][j] = orjson.dumps(pod)
            elif schedulable(pod) and key not in self._queued:
                self._queued.add(key)
                self._schedule(key, self._bind_delay, 0)
        if first:
            self._target = {gpu: len(bag) for gpu, bag in self._churned.items()}


def pod_gpus(spec: Mapping[str, Any], resources: Collection[str]) -> int:
    """The GPUs a Pod requests (limits where there is no request, as the API defaults), as the scheduler
    counts them (webhook.testing.kubefit.pod_requests)."""
    requests = pod_requests(spec)
    return sum(requests.get(r, 0) for r in resources)
