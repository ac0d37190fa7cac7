"""Queued Pods created as kube-apiserver creates them (each admission to one replica or the other, the patch
applied, the Pod POSTed), and the queue kept at its target per namespace."""

from __future__ import annotations

import itertools
import queue
import random
import threading
import time
import uuid
from collections import Counter
from typing import Any

import orjson

from bench.queueaudit import Auditor
from bench.queuebench.cluster import BACKLOG, NAMESPACES, QUOTA, Space, now, queued_pod
from bench.queuebench.replicas import Replica
from bench.soakbench.client import DEADLINE_S, Connection, persisted, read_answer
from bench.soakbench.reviews import review_body
from bench.soakbench.sim import SimApi, Simulator


class Creator:
    """Queues Pods: each AdmissionReview to one replica or the other, alternating (the other when the first
    cannot answer, as a Service would route), the patch applied, the Pod POSTed to the simulator."""

    def __init__(self, replicas: list[Replica], context: Any, sim: Simulator, seed: int, threads: int = 4) -> None:
        self._replicas, self._context, self._sim = replicas, context, sim
        self._rng = random.Random(seed)
        self._work: queue.Queue[tuple[str, str, bool] | None] = queue.Queue()
        self._turn = itertools.count()
        self._names = itertools.count()
        self._lock = threading.Lock()
        self.submitted: Counter[str] = Counter()
        self.done: Counter[str] = Counter()
        self.by_replica: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, namespace: str, classes: tuple[str, ...], n: int) -> None:
        quota = namespace in {space.name for space in QUOTA}
        with self._lock:
            self.submitted[namespace] += n
            for _ in range(n):
                self._work.put((namespace, self._rng.choice(classes), quota))

    def in_flight(self, namespace: str) -> int:
        with self._lock:
            return self.submitted[namespace] - self.done[namespace]

    def close(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join(60)

    def _run(self) -> None:
        conns = self.connections()
        api = self._sim.api()
        rng = random.Random(threading.get_ident())
        while (item := self._work.get()) is not None:
            namespace, gpu_class, quota = item
            name = f"{namespace}-{next(self._names):06d}"
            try:
                self._create(conns, api, queued_pod(namespace, gpu_class, name, rng, quota))
            except Exception as exc:  # counted and shown: a failure here must not stop the benchmark
                with self._lock:
                    self.failures[f"{type(exc).__name__}: {exc}"[:160]] += 1
            with self._lock:
                self.done[namespace] += 1
        for conn in conns:
            conn.close()
        api.close()

    def connections(self) -> list[Connection]:
        """One connection to each replica, in the order of `replicas`."""
        return [Connection(r.port, self._context) for r in self._replicas]

    def admit(self, conns: list[Connection], pod: dict[str, Any], first: int) -> tuple[int, list[dict[str, Any]]]:
        """The replica that answered (conns[first], else the other) and the patch of its admission."""
        uid = str(uuid.uuid4())
        body = review_body(pod, uid, dry_run=False)
        for i in (first, 1 - first):
            try:
                status, data = conns[i].post(body, DEADLINE_S)
            except (OSError, ValueError):
                conns[i].close()
                continue
            answer = read_answer(status, data, uid)
            if answer.outcome.startswith("http-"):  # a replica not ready: the Service routes to the other
                continue
            if answer.outcome != "mutated":
                message = (orjson.loads(data).get("response", {}).get("status") or {}).get("message", "")
                raise RuntimeError(f"admission answered {answer.outcome}: {message}")
            return i, answer.patch
        raise RuntimeError("no replica answered")

    def _create(self, conns: list[Connection], api: SimApi, pod: dict[str, Any]) -> None:
        i, patch = self.admit(conns, pod, next(self._turn) % len(conns))
        api.create(persisted(pod, patch))
        with self._lock:
            self.by_replica[self._replicas[i].name] += 1


def targets(queued: int, namespaces: list[Space]) -> dict[str, int]:
    total = sum(space.share for space in namespaces)
    return {space.name: round(queued * space.share / total) for space in namespaces}


def top_up(creator: Creator, auditor: Auditor, wanted: dict[str, int]) -> None:
    """Queue what each namespace lacks of its target (waiting, as the cluster says, plus on the way)."""
    waiting = auditor.snapshot()["waiting"]
    classes = {space.name: space.classes for space in [*NAMESPACES, BACKLOG]}
    for namespace, target in wanted.items():
        lacking = target - waiting.get(namespace, 0) - creator.in_flight(namespace)
        if lacking > 0:
            creator.submit(namespace, classes[namespace], lacking)


def keep_topped_up(creator: Creator, auditor: Auditor, wanted: dict[str, int], until: float) -> None:
    while now() < until:
        top_up(creator, auditor, wanted)
        time.sleep(0.1)


def wait_queued(auditor: Auditor, wanted: dict[str, int], timeout: float, creator: Creator) -> None:
    """Until every namespace has its target waiting (topping up as Pods are released meanwhile)."""
    deadline = now() + timeout
    while now() < deadline:
        top_up(creator, auditor, wanted)
        waiting = auditor.snapshot()["waiting"]
        if all(waiting.get(ns, 0) >= n for ns, n in wanted.items()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the queue did not fill: {auditor.snapshot()['waiting']} of {wanted}")
