"""A kube-scheduler and kubelet stand-in: binds Pods that may be scheduled, runs them, finishes them.

A thread follows the store's event log (webhook.testing.kubefit.ClusterView) and, as kube-scheduler and
the kubelets would:

- **binds** every Pod that is Pending, on no node, without scheduling gates, not being deleted and for
  the default scheduler (`spec.schedulerName` unset or `default-scheduler`), highest `spec.priority`
  first, then oldest: to a node that passes kube-scheduler's filters (kubefit.why_unfit), among the
  first 100 feasible nodes found from a rotating start (kube-scheduler's minFeasibleNodesToFind) the
  one with the most cpu and memory left (its default LeastAllocated score); or, with
  `scoring="MostAllocated"` and the resources it scores (`scored`), the one with the most of those in
  use, as NodeResourcesFit's MostAllocated strategy bin-packs (weight 1 each; resources a node lacks
  are not scored). The bind starts the Pod at
  once: `spec.nodeName`, phase Running, the PodScheduled/Ready conditions, one write and one watch
  event. A Pod that fits nowhere waits, and is tried again when room appears (a Pod finishes or goes, a
  node changes);
- **starts** a Pod created already bound (`spec.nodeName` set, Pending): Running;
- **finishes** a running Pod (phase Succeeded, its containers terminated; one write) after its run time:
  the Pod's `kubesim.io/run-seconds` annotation, else `run_seconds` if given, else never; and, with
  `finish_rate`, that many running Pods a second chosen at random (those `finish_filter` accepts).

Each bind, start and finish counts in `stats()`. `step(now)` does one round without the thread, for
tests that want no timing at all.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.testing.kubefit import TERMINAL, ClusterView, PodNeed
from webhook.testing.kubestore import Store, kind_of

log = logging.getLogger(__name__)
Obj = dict[str, Any]
RUN_SECONDS = "kubesim.io/run-seconds"
DEFAULT_SCHEDULER = "default-scheduler"
_PODS = kind_of("pods")
# kube-scheduler stops searching once it has found this many feasible nodes when percentageOfNodesToScore
# is at its floor (minFeasibleNodesToFind); its adaptive default scores more in large clusters, which
# only refines the choice among nodes that all fit, at a cost Python cannot afford per bind.
_FEASIBLE = 100


def now_stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def running_on(pod: Obj, node: str) -> Obj:
    """The Pod bound to `node` and started there, as the scheduler and the kubelet leave it."""
    spec, status = pod.setdefault("spec", {}), pod.get("status") or {}
    spec["nodeName"] = node
    started = now_stamp()
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
                "imageID": f"{c.get('image', '')}@sha256:{'0' * 64}",
                "containerID": f"containerd://{random.getrandbits(256):064x}",
            }
            for c in spec.get("containers") or []
            if isinstance(c, Mapping)
        ],
        "qosClass": status.get("qosClass", "Burstable"),
    }
    return pod


def succeeded(pod: Obj) -> Obj:
    """The Pod after its containers exited 0: phase Succeeded, not ready (its resources free again)."""
    status = pod.setdefault("status", {})
    status["phase"] = "Succeeded"
    for condition in status.get("conditions") or []:
        if condition.get("type") in ("Ready", "ContainersReady"):
            condition["status"] = "False"
    for c in status.get("containerStatuses") or []:
        started = (c.get("state") or {}).get("running", {}).get("startedAt", now_stamp())
        c["state"] = {
            "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": now_stamp()}
        }
        c["ready"] = c["started"] = False
    return pod


def schedulable(pod: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler would try to place the Pod now."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return (
        not spec.get("nodeName")
        and (status.get("phase") or "Pending") == "Pending"
        and not spec.get("schedulingGates")
        and not meta.get("deletionTimestamp")
        and (spec.get("schedulerName") or DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER
    )


def _run_seconds(pod: Mapping[str, Any], default: float | None) -> float | None:
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(RUN_SECONDS)
    try:
        return float(text) if text is not None else default
    except ValueError:
        return default


@dataclass(slots=True)
class _Waiting:
    """A Pod waiting for a node: its place in the queue, and when it may be tried again."""

    order: tuple[int, str, str]  # (-priority, creationTimestamp, key)
    attempts: int = 0
    not_before: float = 0.0
    room: bool = True  # tried since room last appeared? (False: wait for room)


class Scheduler:
    """Binds, starts and finishes Pods in `store` from a thread (see the module's docstring).

    A Pod that fits nowhere is tried again once room appears (a Pod finished or went, a node changed), no
    sooner than kube-scheduler's backoff allows (1 s, doubling up to 10 s), so Pods that fit nowhere
    cost little however busy the cluster is.
    """

    def __init__(  # noqa: PLR0913 (the store, then kube-scheduler's and the kubelet's knobs, by keyword)
        self,
        store: Store,
        *,
        run_seconds: float | None = None,
        finish_rate: float = 0.0,
        finish_filter: Callable[[Obj], bool] | None = None,
        tick: float = 0.005,
        seed: int = 0,
        scoring: str = "LeastAllocated",
        scored: tuple[str, ...] = ("cpu", "memory"),
    ) -> None:
        if finish_rate < 0:
            raise ValueError("finish_rate must not be negative")
        if scoring not in ("LeastAllocated", "MostAllocated"):
            raise ValueError(f"scoring must be LeastAllocated or MostAllocated, not {scoring!r}")
        self._most, self._scored = scoring == "MostAllocated", scored
        if run_seconds is not None and run_seconds < 0:
            raise ValueError("run_seconds must not be negative")
        self._store = store
        self._run_seconds = run_seconds
        self.finish_rate = finish_rate
        self._finish_filter = finish_filter
        self._tick = tick
        self._rng = random.Random(seed)
        self._view = ClusterView(store)
        self._waiting: dict[str, _Waiting] = {}
        self._holding: set[str] = set()  # bound, not terminated: their going makes room
        self._to_start: set[str] = set()
        self._finishing: list[tuple[float, str]] = []  # heap of (due, key)
        self._running: list[str] = []  # Running Pods the finish rate may pick (a bag: O(1) add and remove)
        self._running_at: dict[str, int] = {}
        self._node_writes = 0
        self._start_index = 0
        self._counts: Counter[str] = Counter()
        self._finish_debt = 0.0
        self._last: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[BaseException] = []
        with store.changed:
            now = time.monotonic()
            for key, pod in self._view.resync():
                self._note(key, pod, now)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Scheduler:
        if self._thread is not None:
            raise RuntimeError("the scheduler is already running")
        self._thread = threading.Thread(target=self._loop, name="kubesim-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def stats(self) -> dict[str, float]:
        """Writes by type (bind, start, finish), and the Pods waiting for a node now."""
        with self._store.changed:
            return {**{k: float(v) for k, v in sorted(self._counts.items())}, "pending": float(len(self._waiting))}

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self._tick):
                self.step()
        except Exception as exc:  # a bug here must not pass for a cluster where nothing schedules
            self.errors.append(exc)
            log.exception("kubesim scheduler failed")
            raise

    # -- one round ------------------------------------------------------------------------------

    def step(self, now: float | None = None) -> None:
        """Catch up with the store, then finish, start and bind what is due (under the store's lock, so
        no write of anyone else's comes between what the view says and what is written)."""
        with self._store.changed:
            now = time.monotonic() if now is None else now
            seen: Iterable[tuple[str, Obj | None]] | None = self._view.follow()
            if seen is None:  # fell behind the history: start over from the whole cluster
                self._forget()
                seen = self._view.resync()
                self._room()
            for key, pod in seen:
                self._note(key, pod, now)
            if self._view.node_writes != self._node_writes:
                self._node_writes = self._view.node_writes
                self._room()
            self._finish_due(now)
            for key in sorted(self._to_start):
                self._start(key, now)
            self._to_start.clear()
            self._bind_waiting(now)

    def _forget(self) -> None:
        for collection in (self._waiting, self._holding, self._to_start, self._running_at):
            collection.clear()
        self._finishing.clear()
        self._running.clear()

    def _room(self) -> None:
        for waiting in self._waiting.values():
            waiting.room = True

    def _note(self, key: str, pod: Obj | None, now: float) -> None:
        """Track one Pod's new state (None: it was deleted)."""
        self._waiting.pop(key, None)
        self._to_start.discard(key)
        self._unrun(key)
        held = key in self._holding
        self._holding.discard(key)
        spec = (pod or {}).get("spec") or {}
        phase = ((pod or {}).get("status") or {}).get("phase") or "Pending"
        if pod is not None and spec.get("nodeName") and phase not in TERMINAL:
            self._holding.add(key)
        elif held:
            self._room()  # it held resources, and holds them no more
        if pod is None:
            return
        if schedulable(pod):
            priority = spec.get("priority")
            created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
            self._waiting[key] = _Waiting((-(priority if isinstance(priority, int) else 0), created, key))
        elif spec.get("nodeName") and phase == "Pending":
            self._to_start.add(key)
        elif spec.get("nodeName") and phase == "Running":
            self._run(key, pod, now)

    def _run(self, key: str, pod: Obj, now: float) -> None:
        seconds = _run_seconds(pod, self._run_seconds)
        if seconds is not None:
            heapq.heappush(self._finishing, (now + seconds, key))
        if self._finish_filter is None or self._finish_filter(pod):
            self._running_at[key] = len(self._running)
            self._running.append(key)

    def _unrun(self, key: str) -> None:
        i = self._running_at.pop(key, None)
        if i is None:
            return
        last = self._running.pop()
        if i < len(self._running):
            self._running[i] = last
            self._running_at[last] = i

    # -- writes ---------------------------------------------------------------------------------

    def _write(self, pod: Obj, what: str, now: float) -> None:
        pod["kind"] = "Pod"
        event, _ = self._store.put(pod, exists=True)
        self._counts[what] += 1
        self._view.apply(event, pod)
        self._note(event.key, pod, now)

    def _load(self, key: str) -> Obj | None:
        namespace, name = key.split("/", 1)
        body = self._store.get(_PODS, namespace, name)
        return None if body is None else orjson.loads(body)

    def _start(self, key: str, now: float) -> None:
        pod = self._load(key)
        if pod is not None and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            self._write(running_on(pod, str((pod.get("spec") or {}).get("nodeName"))), "start", now)

    def _finish(self, key: str, now: float) -> None:
        pod = self._load(key)
        if pod is not None and (pod.get("status") or {}).get("phase") == "Running":
            self._write(succeeded(pod), "finish", now)

    def _finish_due(self, now: float) -> None:
        while self._finishing and self._finishing[0][0] <= now:
            _, key = heapq.heappop(self._finishing)
            placed = self._view.pods.get(key)
            if placed is not None and placed.phase == "Running":
                self._finish(key, now)
        if self.finish_rate > 0 and self._last is not None:
            # At most a second's worth at once: a stalled machine skips, it does not burst.
            self._finish_debt = min(
                self._finish_debt + (now - self._last) * self.finish_rate, max(1.0, self.finish_rate)
            )
            while self._finish_debt >= 1 - 1e-9 and self._running:  # (the slack: float sums of ticks)
                self._finish_debt -= 1
                self._finish(self._running[self._rng.randrange(len(self._running))], now)
        self._last = now

    def _bind_waiting(self, now: float) -> None:
        due = [(w.order, k) for k, w in self._waiting.items() if w.room and now >= w.not_before]
        for _, key in sorted(due):
            waiting = self._waiting.get(key)
            if waiting is not None:
                self._bind(key, waiting, now)

    def _bind(self, key: str, waiting: _Waiting, now: float) -> None:
        pod = self._load(key)
        if pod is None or not schedulable(pod):
            self._waiting.pop(key, None)
            return
        node = self._choose(PodNeed.of(pod))
        if node is None:
            waiting.attempts += 1
            waiting.not_before = now + min(2.0 ** (waiting.attempts - 1), 10.0)
            waiting.room = False
            return
        self._write(running_on(pod, node), "bind", now)

    def _choose(self, need: PodNeed) -> str | None:
        """kube-scheduler's search: from a rotating start, collect feasible nodes until 100 are found (or
        all were tried), then take the one with the most cpu and memory left (ties: the first found)."""
        view = self._view
        candidates = view.candidates(need)
        total = len(candidates)
        if total == 0:
            return None
        wanted = min(total, _FEASIBLE)
        start = self._start_index % total
        best: tuple[float, str] | None = None
        found = processed = 0
        for i in range(total):
            processed += 1
            name = candidates[(start + i) % total]
            if view.unfit(need, name) is not None:
                continue
            found += 1
            score = self._score(need, name)
            if best is None or score > best[0]:
                best = (score, name)
            if found >= wanted:
                break
        self._start_index = start + processed  # the next search starts where this one stopped
        return None if best is None else best[1]

    def _score(self, need: PodNeed, node: str) -> float:
        """The share of each scored resource left once the Pod is bound (LeastAllocated), or in use
        (MostAllocated), averaged over the scored resources the node has."""
        fit = self._view.nodes[node]
        used: Mapping[str, int] = self._view.used.get(node) or {}
        scores = []
        for resource in self._scored:
            capacity = fit.allocatable.get(resource, 0)
            if capacity > 0:
                taken = min(used.get(resource, 0) + need.requests.get(resource, 0), capacity)
                scores.append((taken if self._most else capacity - taken) / capacity)
        return sum(scores) / len(scores) if scores else 0.0
