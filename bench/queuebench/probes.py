"""Baselines timed in the same run, in processes of their own: the API's write round trip and a watcher's view
of it, both replicas' admissions, and the PATCHes/s the API takes from as many writers as the leader has."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import multiprocessing
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from bench.queuebench.cluster import PROBE_NAMESPACE, PROBE_POD_NAMESPACE, probe_pod
from bench.queuebench.replicas import Replica
from bench.soakbench.client import DEADLINE_S, Connection, read_answer, tls_context
from bench.soakbench.metrics import quantiles
from bench.soakbench.reviews import review_body
from bench.soakbench.sim import SimApi, Simulator
from webhook.queue.runner import WRITERS


class Probes:
    """While a phase runs, side by side and interleaved, in a process of its own (so that the benchmark's
    threads do not slow it):

    - the API's write round trip: a JSON Patch of one annotation of a probe Pod, sent by a bare HTTP client,
      and the same patch sent through gpupool's own writer (webhook.sources.writes.PodReleaser, the
      `kubernetes` client the leader releases with): the first is the simulator's time, the difference
      the client's;
    - admissions: a dry run of an ordinary Pod (`placement: now`) to the leader and to the follower."""

    def __init__(self, sim: Simulator, ca: Path, roles: dict[str, Replica], rate: float = 10.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop, started = ctx.Event(), ctx.Event()
        self._results: Any = ctx.Queue()
        ports = {role: rep.port for role, rep in roles.items()}
        target = (sim.port, sim.token, str(sim.kubeconfig), str(ca), ports, rate)
        self._proc = ctx.Process(target=probe_main, args=(target, self._stop, started, self._results), daemon=True)
        self._proc.start()
        started.wait(120)  # probing from the phase's first moment on

    def stop(self) -> dict[str, dict[str, float]]:
        self._stop.set()
        try:
            times: dict[str, list[float]] = self._results.get(timeout=120)
        finally:
            self._proc.join(30)
        return {name: quantiles(t) for name, t in times.items()}


def probe_main(target: tuple[Any, ...], stop: Any, started: Any, results: Any) -> None:
    from webhook.sources.live import api_client
    from webhook.sources.writes import PodReleaser

    port, token, kubeconfig, ca, ports, rate = target
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    api = SimApi(port, token)
    releaser = PodReleaser(api_client(kubeconfig))
    raw = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json-patch+json"}
    context = tls_context(Path(ca))
    conns = {role: Connection(p, context) for role, p in ports.items()}
    times: dict[str, list[float]] = {"write_raw": [], "write_gpupool": [], **{f"admission_{r}": [] for r in ports}}
    for name in ("write-raw", "write-gpupool"):
        if api.call("GET", f"/api/v1/namespaces/{PROBE_POD_NAMESPACE}/pods/{name}")[0] == 404:
            api.create(probe_pod(name))
    watch = WatchProbe(port, token, api.resource_version())
    sent: dict[str, float] = {}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "probe-",
            "namespace": PROBE_NAMESPACE,
            "annotations": {"gpupool.io/gpu-class": "medium"},
        },
        "spec": {"containers": [{"name": "main", "image": "registry.example.com/cuda:12"}]},
    }
    started.set()
    for i in itertools.count():
        if stop.wait(1 / rate):
            break
        patch = [{"op": "add", "path": "/metadata/annotations", "value": {"bench/tick": str(i)}}]
        began = time.perf_counter()
        sent[str(i)] = began
        raw.request("PATCH", f"/api/v1/namespaces/{PROBE_POD_NAMESPACE}/pods/write-raw", orjson.dumps(patch), headers)
        raw.getresponse().read()
        times["write_raw"].append(time.perf_counter() - began)
        began = time.perf_counter()
        releaser.release(PROBE_POD_NAMESPACE, "write-gpupool", patch)
        times["write_gpupool"].append(time.perf_counter() - began)
        for role, conn in conns.items():
            uid = str(uuid.uuid4())
            began = time.perf_counter()
            try:
                read_answer(*conn.post(review_body(pod, uid, dry_run=True), DEADLINE_S), uid)
            except (OSError, ValueError):
                conn.close()
                continue
            times[f"admission_{role}"].append(time.perf_counter() - began)
    seen = watch.stop()
    times["write_raw_then_watched"] = [seen[tick] - at for tick, at in sent.items() if tick in seen]
    results.put(times)


class WatchProbe:
    """A watcher of every Pod, as the leader is: when each PATCH of the write-raw probe Pod reached it. A
    write and a watcher learning of it is the least a release can take after the write that made room,
    before its own PATCH."""

    def __init__(self, port: int, token: str, after: int) -> None:
        self.seen: dict[str, float] = {}
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self._conn.request(
            "GET", f"/api/v1/pods?watch=true&resourceVersion={after}", headers={"Authorization": f"Bearer {token}"}
        )
        self._sock = self._conn.sock  # the stream's: shut down to end it
        self._response = self._conn.getresponse()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):  # a probe, not the benchmark: it ends when the stream does
            while line := self._response.readline():
                if b'"write-raw"' not in line:
                    continue
                at = time.perf_counter()
                meta = orjson.loads(line)["object"]["metadata"]
                tick = (meta.get("annotations") or {}).get("bench/tick")
                if tick is not None:
                    self.seen.setdefault(str(tick), at)

    def stop(self) -> dict[str, float]:
        time.sleep(0.5)  # the last events on their way
        with contextlib.suppress(OSError, AttributeError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        return dict(self.seen)


def timed_probes(sim: Simulator, ca: Path, roles: dict[str, Replica], seconds: float) -> dict[str, dict[str, float]]:
    """Admissions to each role (and the API's writes), interleaved, for `seconds`, 20 a second each."""
    probes = Probes(sim, ca, roles, rate=20.0)
    time.sleep(seconds)
    timed = probes.stop()
    return {name.removeprefix("admission_"): q for name, q in timed.items() if name.startswith("admission_")}


def write_capacity(sim: Simulator, seconds: float = 4.0) -> dict[str, dict[str, float]]:
    """What the API takes from one writer and from `WRITERS` at once (as many as the leader has in flight):
    PATCHes of probe Pods through gpupool's own writer (and one bare HTTP client), each for `seconds`, in a
    process of its own, nothing else writing: the ceiling of the leader's releases/s."""
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    proc = ctx.Process(target=capacity_main, args=((sim.port, sim.token, str(sim.kubeconfig), seconds), results))
    proc.start()
    try:
        out: dict[str, dict[str, float]] = results.get(timeout=300)
    finally:
        proc.join(30)
    return out


def capacity_main(target: tuple[Any, ...], results: Any) -> None:
    from webhook.sources.live import api_client
    from webhook.sources.writes import PodReleaser

    port, token, kubeconfig, seconds = target
    api = SimApi(port, token)
    for k in range(WRITERS):
        if api.call("GET", f"/api/v1/namespaces/{PROBE_POD_NAMESPACE}/pods/capacity-{k}")[0] == 404:
            api.create(probe_pod(f"capacity-{k}"))
    api.close()
    releaser = PodReleaser(api_client(kubeconfig))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json-patch+json"}

    def writer(k: int, raw: bool, until: float, times: list[float]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in itertools.count():
            if time.perf_counter() >= until:
                break
            patch = [{"op": "add", "path": "/metadata/annotations", "value": {"bench/tick": str(i)}}]
            began = time.perf_counter()
            if raw:
                path = f"/api/v1/namespaces/{PROBE_POD_NAMESPACE}/pods/capacity-{k}"
                conn.request("PATCH", path, orjson.dumps(patch), headers)
                conn.getresponse().read()
            else:
                releaser.release(PROBE_POD_NAMESPACE, f"capacity-{k}", patch)
            times.append(time.perf_counter() - began)
        conn.close()

    out: dict[str, dict[str, float]] = {}
    for name, raw, writers in (("raw x1", True, 1), ("gpupool x1", False, 1), (f"gpupool x{WRITERS}", False, WRITERS)):
        per: list[list[float]] = [[] for _ in range(writers)]
        until = time.perf_counter() + seconds
        pool = [threading.Thread(target=writer, args=(k, raw, until, per[k])) for k in range(writers)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        flat = [t for p in per for t in p]
        out[name] = {"patches_per_s": len(flat) / seconds, **quantiles(flat)}
    results.put(out)
