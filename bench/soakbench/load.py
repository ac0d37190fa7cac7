"""The soak's load: admissions at a fixed rate (open loop) over keep-alive TLS connections, and the Pods admitted
for real created in the simulator by a process of their own."""

from __future__ import annotations

import argparse
import gc
import queue
import signal
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import jsonpatch
import orjson

from bench.soakbench.client import DEADLINE_S, Answer, Connection, persisted, read_answer
from bench.soakbench.reviews import Request, RequestMaker
from bench.soakbench.servers import Server
from bench.soakbench.sim import SimApi


@dataclass
class Outcome:
    due: float
    sent: float
    done: float
    shape: str
    result: str  # the answer's outcome, or what went wrong
    error: str  # empty when the answer is the expected one, in time


class Load:
    """Open-loop load: request i is due at start + i / rate. A dispatcher hands requests out at their
    due time to threads that each own one keep-alive TLS connection. `connections` are open from the
    start; when a request is due and none is idle, another is opened (up to `max_connections`) and
    kept, as kube-apiserver's HTTP/1.1 client does. A request that still finds every connection busy
    waits, and its latency (from its due time) says so."""

    def __init__(
        self, server: Server, context: ssl.SSLContext, maker: RequestMaker, args: argparse.Namespace, create: Any
    ) -> None:
        self._server, self._context, self._maker, self._create = server, context, maker, create
        self.rate, self.seconds = args.rate, args.minutes * 60
        self.connections, self.max_connections = args.connections, max(args.connections, args.max_connections)
        self.outcomes: list[Outcome] = []
        self.dispatch_lag: list[float] = []  # how late the dispatcher handed a request out: the client's own lag
        self.examples: list[str] = []
        self.opened = 0  # connections opened, including re-opened ones
        self._queue: queue.Queue[tuple[float, float, Request] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self.start = 0.0

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._send, daemon=True)
        self._threads.append(thread)
        thread.start()

    def run(self) -> None:
        for _ in range(self.connections):
            self._spawn()
        total = int(self.rate * self.seconds)
        # No garbage collection in the load generator while it runs: a full collection over the
        # outcomes piling up would stall the dispatcher (and show up as the server's latency).
        gc.collect()
        gc.freeze()
        gc.disable()
        self.start = time.perf_counter() + 0.05
        for i in range(total):
            request = self._maker.next()  # built before its due time
            due = self.start + i / self.rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            now = time.perf_counter()
            self.dispatch_lag.append(now - due)
            with self._lock:
                more = self._idle == 0 and len(self._threads) < self.max_connections
            if more:
                self._spawn()
            self._queue.put((due, now, request))
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(DEADLINE_S + 30)
        gc.enable()

    def _send(self) -> None:
        conn = Connection(self._server.port, self._context)
        while True:
            with self._lock:
                self._idle += 1
            item = self._queue.get()
            with self._lock:
                self._idle -= 1
            if item is None:
                break
            due, _, request = item
            sent = time.perf_counter()
            try:
                status, data = conn.post(request.body, due + DEADLINE_S - sent)
                answer = read_answer(status, data, request.uid)
            except TimeoutError:
                answer = Answer("timeout")
            except (OSError, ValueError) as exc:
                answer = Answer(f"connection: {type(exc).__name__}")
            done = time.perf_counter()
            error = ""
            if answer.outcome == request.expect:
                error = "missed deadline" if done - due > DEADLINE_S else ""
            elif answer.outcome.startswith(("http-", "connection", "timeout", "malformed")):
                error = answer.outcome.split(":")[0]
            else:
                error = "unexpected outcome"
            if error and len(self.examples) < 20:
                self.examples.append(
                    f"{request.shape}: expected {request.expect}, got {answer.outcome} {answer.warnings}"
                )
            self.outcomes.append(Outcome(due, sent, done, request.shape, answer.outcome, error))
            if answer.outcome == "mutated" and not request.dry_run:
                self._create.put((answer.patch_b64, request.body))
        with self._lock:
            self.opened += conn.opened
        conn.close()


def creator(port: int, token: str, work: Any, done: Any) -> None:
    """kube-apiserver's next step after an admission: persist the Pod, with the patch applied. In a
    process of its own, so that the load generator's threads keep their GIL to themselves."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    api, counts = SimApi(port, token), Counter[str]()
    while (item := work.get()) is not None:
        patch_b64, body = item
        pod = orjson.loads(body)["request"]["object"]
        try:
            api.create(persisted(pod, Answer("mutated", patch_b64).patch))
            counts["created"] += 1
        except (RuntimeError, OSError, jsonpatch.JsonPatchException) as exc:
            counts[f"create failed: {exc}"[:120]] += 1
    api.close()
    done.put(dict(counts))
