"""The queue at Kubernetes' supported scale: two `gpupool serve` replicas, one leader releasing as room appears.

The API simulator (`python -m webhook.testing`, its own process) serves 5,000 nodes and 150,000 Pods with
its scheduler and kubelet stand-in (`--schedule`: it binds what is released and finishes Pods), and keeps
an audit log of every write with the time it was stored (`--audit-log`). Two `gpupool serve` replicas as
the manifests ship them (1 worker x 8 threads, `POD_NAME` replica-a / replica-b) watch it and elect a
leader on the Lease `gpupool-system/gpupool`. Queued Pods are created as kube-apiserver creates them: the
AdmissionReview goes to one replica or the other, alternating, its patch is applied, and the Pod is POSTed
to the simulator. They go to queue namespaces with quotas of every form gpupool enforces (a tutorial
`nvidia.com/gpu` ResourceQuota, a `limits.nvidia.com/gpu` one, a `classQuota`, a `memoryQuota`) and
without, in classes medium and high, one GPU each.

1. Setup: every free GPU of every usable node is taken by a one-GPU "filler" Pod bound there (the fleet
   is saturated), then `--queued` Pods are queued (they wait: there is no room).
2. Steady (`--seconds`): the simulator finishes `--finish-rate` Pods a second (fillers and released queue
   Pods, at random); the benchmark keeps the queue at `--queued` Pods. Release latency: from the write
   that made room to the write that removed the gate (bench/queueaudit.py says exactly how room is
   attributed). Pods of the quota namespaces run 2 to 8 s, so their quotas fill and free all the time.
3. Failover: SIGKILL of the leading worker process (its pid is in the Lease's holderIdentity,
   `POD_NAME-pid`), as the steady phase goes on; time from the kill to the first release after another
   worker took the Lease.
4. Burst (releases/s): finishing stops, `--queued` medium Pods wait (in the namespaces without quotas),
   then nodes with room for every waiting Pod join at once (L4 nodes of 8 GPUs, created as fast as the
   API takes them); releases per second of those medium Pods, from the first node stored to the last of
   their releases.
5. Memory: `--memory-queued` more Pods queued with no room; RSS of the leading worker and of the other
   replica's (a follower, which keeps the same watch and the same queue but does not release) before and
   after, their CPU while nothing changes, and the admission latency of each (dry runs in a `placement:
   now` namespace, interleaved: the follower is the baseline).

GPUs overbooked and quotas exceeded are judged after every write of the run from the audit log alone
(bench/queueaudit.py), never from gpupool's view. The machine's load (others' CPU) is reported per phase.

    .venv/bin/python bench/bench_queue.py [--nodes 5000] [--pods 150000] [--queued 1000] [--seconds 60]
        [--finish-rate 100] [--memory-queued 10000] [--seed 0] [--profile] [--quick]

`--quick` is a short run (1,000 nodes, 300 queued, 20 s) to iterate with; the figures come from a full one.

Results: a table on stdout and JSON in bench/results/queue-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import http.client
import itertools
import json
import math
import multiprocessing
import os
import platform
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `python bench/bench_queue.py` finds the bench package too

from bench.bench_server import free_port, running  # noqa: E402
from bench.queueaudit import GPU, Auditor, QuotaRule, Release  # noqa: E402
from bench.soak import (  # noqa: E402
    DEADLINE_S,
    Connection,
    CpuMeter,
    SimApi,
    children,
    persisted,
    quantiles,
    read_answer,
    review_body,
    rss_mb,
    scrape,
    serve_argv,
    tls_context,
)
from webhook.queue.runner import WRITERS  # noqa: E402
from webhook.serving.certs import ensure_certificates  # noqa: E402
from webhook.testing.kubefit import pod_requests  # noqa: E402
from webhook.testing.synthetic import GPU_MODELS  # noqa: E402

RESULTS = REPO / "bench" / "results"
LEASE_NAMESPACE, LEASE = "gpupool-system", "gpupool"
FINISH_LABEL = "bench.gpupool.io/finish"
FILL_NAMESPACE = "bench-fill"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GOALS = {"p50_s": 0.1, "p99_s": 1.0, "releases_per_s": 200.0, "overbooked": 0, "quota_exceeded": 0, "failover_s": 20.0}

# Queue namespaces: (name, classes its Pods ask for, share of the queue). The quota namespaces' Pods run 2
# to 8 s, so each quota is at its limit most of the time and freed again and again.


class Space(NamedTuple):
    """A queue namespace: the classes its Pods ask for, and its share of the queue."""

    name: str
    classes: tuple[str, ...]
    share: float


OPEN = [
    Space("q-medium-0", ("medium",), 0.2),
    Space("q-medium-1", ("medium",), 0.2),
    Space("q-high-0", ("high",), 0.2),
    Space("q-high-1", ("high",), 0.2),
]
QUOTA = [Space(ns, ("medium", "high"), 0.05) for ns in ("q-tutorial", "q-limits", "q-class", "q-memory")]
NAMESPACES = OPEN + QUOTA
MEMORY_QUOTA_GI = 400
RULES = [
    QuotaRule("q-tutorial", "gpus", "nvidia.com/gpu", 16),
    QuotaRule("q-limits", "gpus", "limits.nvidia.com/gpu", 16),
    QuotaRule("q-class", "class", "medium", 12),
    QuotaRule("q-class", "class", "high", 6),
    QuotaRule("q-memory", "memory", "gpu-memory", MEMORY_QUOTA_GI * 1024),
]
POLICY = f"""
namespaces:
  q-medium-0: {{placement: queue}}
  q-medium-1: {{placement: queue}}
  q-high-0: {{placement: queue}}
  q-high-1: {{placement: queue}}
  q-tutorial: {{placement: queue}}
  q-limits: {{placement: queue}}
  q-class: {{placement: queue, classQuota: {{medium: 12, high: 6}}}}
  q-memory: {{placement: queue, memoryQuota: {MEMORY_QUOTA_GI}Gi}}
"""
# --quick: a fifth of the cluster, still at 100 finishes/s, so a leader that falls behind shows it.
QUICK = ["--nodes", "1000", "--pods", "30000", "--queued", "300", "--seconds", "20", "--memory-queued", "1000"]
QUICK += ["--probe-seconds", "5"]
PROBE_NAMESPACE = "team-a"  # placement: now (the synthetic cluster's), to time ordinary admissions


def now() -> float:
    return time.monotonic()


# --- the simulator ------------------------------------------------------------------------------------


@dataclass
class Sim:
    proc: subprocess.Popen[str]
    kubeconfig: Path
    audit: Path
    port: int
    token: str
    exit_lines: list[str] = field(default_factory=list)

    def api(self) -> SimApi:
        return SimApi(self.port, self.token)

    def command(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer.startswith("kubesim: " + line.split(maxsplit=1)[0]):
            raise RuntimeError(f"the simulator answered {answer!r} to {line!r}")
        return answer


@contextmanager
def simulator(args: argparse.Namespace, tmp: Path) -> Iterator[Sim]:
    kubeconfig, audit = tmp / "kubeconfig", tmp / "audit.jsonl"
    argv = [
        sys.executable,
        "-m",
        "webhook.testing",
        "--nodes",
        str(args.nodes),
        "--pods",
        str(args.pods),
        "--seed",
        str(args.seed),
        "--kubeconfig",
        str(kubeconfig),
        "--schedule",
        "--control",
        "--finish-selector",
        f"{FINISH_LABEL}=true",
        "--audit-log",
        str(audit),
        "--audit-kinds",
        "pods,nodes,leases",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        print(line.strip(), flush=True)
        match = re.search(r"serving http://127\.0\.0\.1:(\d+)", line)
        if not match:
            raise SystemExit(f"the simulator did not start: {line!r}")
        token = json.loads(kubeconfig.read_text())["users"][0]["user"]["token"]
        sim = Sim(proc, kubeconfig, audit, int(match.group(1)), token)
        yield sim
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
        with contextlib.suppress(NameError):
            sim.exit_lines = rest.splitlines()


def list_all(api: SimApi, path: str, keep: Any = None) -> tuple[list[dict[str, Any]], int]:
    """The objects of a list that `keep` accepts (all when None), in pages of 500 (all at the first page's
    resourceVersion), and that version."""
    items: list[dict[str, Any]] = []
    token, rv = "", 0
    while True:
        status, page = api.call("GET", f"{path}?limit=500" + (f"&continue={token}" if token else ""))
        if status != 200:
            raise RuntimeError(f"GET {path}: {status}")
        items.extend(page["items"] if keep is None else filter(keep, page["items"]))
        rv = rv or int(page["metadata"]["resourceVersion"])
        token = page["metadata"].get("continue") or ""
        if not token:
            return items, rv


class Tail:
    """Feeds the audit log's writes after a resourceVersion to the auditor as the simulator writes them."""

    def __init__(self, path: Path, auditor: Auditor, after: int) -> None:
        self._path, self._auditor, self._after = path, auditor, after
        self._stop = threading.Event()
        self.position = 0  # resourceVersion of the last line read
        self.lines = 0
        self._thread = threading.Thread(target=self._loop, name="audit-tail", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with open(self._path, "rb") as f:
            partial = b""
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    if self._stop.is_set():
                        return
                    time.sleep(0.01)
                    continue
                data = partial + chunk
                *whole, partial = data.split(b"\n")
                for line in whole:
                    entry = orjson.loads(line)
                    rv = int(entry.get("rv", 0))
                    if rv > self._after or entry.get("gap"):
                        self._auditor.apply(entry)
                    self.position = max(self.position, rv)
                    self.lines += 1

    def wait_for(self, rv: int, timeout: float = 60.0) -> None:
        deadline = now() + timeout
        while self.position < rv:
            if now() > deadline:
                raise TimeoutError(f"the audit log did not reach resourceVersion {rv} (at {self.position})")
            time.sleep(0.02)

    def stop(self) -> None:
        """Read to the end of the file (the simulator has exited), then stop."""
        self._stop.set()
        self._thread.join(120)


def quiet(api: SimApi, seconds: float = 1.5, timeout: float = 300.0) -> int:
    """Wait until the simulator has made no write for `seconds` (its scheduler's first binds are done)."""
    deadline, last, since = now() + timeout, api.resource_version(), now()
    while now() < deadline:
        time.sleep(0.25)
        rv = api.resource_version()
        if rv != last:
            last, since = rv, now()
        elif now() - since >= seconds:
            return rv
    raise TimeoutError("the simulator never stopped writing")


# --- the cluster the benchmark adds -------------------------------------------------------------------


def filler(node: str, k: int) -> dict[str, Any]:
    """One GPU taken on `node`, by a Pod bound there (as a Pod of another scheduler would be)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"fill-{node}-{k}", "namespace": FILL_NAMESPACE, "labels": {FINISH_LABEL: "true"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/cuda:12",
                    "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
                }
            ],
            "tolerations": [GPU_TOLERATION],
        },
    }


def queued_pod(namespace: str, gpu_class: str, name: str, rng: random.Random, quota: bool) -> dict[str, Any]:
    """A Pod as its owner writes it for a queue namespace: a class and one GPU, nothing else gpupool sets."""
    annotations = {"gpupool.io/gpu-class": gpu_class, "gpupool.io/gpu-count": "1"}
    if quota:
        annotations["kubesim.io/run-seconds"] = f"{rng.uniform(2, 8):.1f}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": annotations,
            "labels": {FINISH_LABEL: "true", "app": "bench-queue"},
        },
        "spec": {
            "containers": [{"name": "main", "image": "registry.example.com/cuda:12"}],
            "priority": 100 if rng.random() < 0.1 else 0,
        },
    }


def resource_quota(namespace: str, key: str, hard: int) -> dict[str, Any]:
    spec = {"hard": {key: str(hard)}}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu-quota", "namespace": namespace},
        "spec": spec,
        "status": {"hard": spec["hard"], "used": {key: "0"}},
    }


def burst_node(template: dict[str, Any], k: int) -> dict[str, Any]:
    node = copy.deepcopy(template)
    name = f"gpu-l4-burst-{k:04d}"
    meta = node["metadata"]
    for drop in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(drop, None)
    meta["name"] = name
    meta["labels"]["kubernetes.io/hostname"] = name
    node["kind"], node["apiVersion"] = "Node", "v1"
    node["spec"].pop("providerID", None)
    return node


def post_all(sim: Sim, objects: list[dict[str, Any]], threads: int = 4) -> None:
    """Create objects through the API, `threads` at a time."""
    work: queue.Queue[dict[str, Any]] = queue.Queue()
    for obj in objects:
        work.put(obj)
    errors: list[str] = []

    def run() -> None:
        api = sim.api()
        while True:
            try:
                obj = work.get_nowait()
            except queue.Empty:
                break
            try:
                api.create(obj)
            except RuntimeError as exc:
                errors.append(str(exc))
        api.close()

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} creations failed, e.g. {errors[0]}")


# --- the replicas -------------------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    health_port: int
    log: Path

    def worker(self) -> int:
        kids = children(self.proc.pid)
        return kids[0] if kids else 0

    def queued(self) -> float:
        """Pods this replica's worker counts as waiting (gpupool_queue_pods summed over namespaces)."""
        text = scrape(self.health_port)
        return sum(float(m) for m in re.findall(r'^gpupool_queue_pods\{namespace="[^"]+"\} ([\d.e+]+)$', text, re.M))


def _readyz(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        response.read()
        return response.status == 200
    finally:
        conn.close()


@contextmanager
def replicas(tmp: Path, sim: Sim) -> Iterator[list[Replica]]:
    """replica-a and replica-b, started together, each waited for until its first full list."""
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY, "utf-8")
    with ExitStack() as stack:
        started = []
        began = now()
        for name in ("replica-a", "replica-b"):
            port, health = free_port(), free_port()
            argv = [*serve_argv(tmp, sim.kubeconfig, port, health), "--policy", str(policy)]
            env = {"POD_NAME": name, "POD_NAMESPACE": LEASE_NAMESPACE}
            log = tmp / f"{name}.log"
            proc = stack.enter_context(running(argv, health, log, 600, env=env))
            started.append(Replica(name, proc, port, health, log))
        print(f"replicas ready (live inventory synced) in {now() - began:.1f} s", flush=True)
        yield started


def roles_of(replicas: list[Replica], holder: str) -> dict[str, Replica]:
    """{"leader": the replica whose worker holds the Lease, "follower": the other}."""
    found = leader_of(replicas, holder)
    if found is None:
        raise RuntimeError(f"no replica's worker is the Lease's holder {holder!r}")
    return {"leader": found[0], "follower": next(rep for rep in replicas if rep is not found[0])}


def leader_of(replicas: list[Replica], holder: str) -> tuple[Replica, int] | None:
    """The replica and worker pid the Lease's holderIdentity (`POD_NAME-pid`) names."""
    name, _, pid = holder.rpartition("-")
    for replica in replicas:
        if replica.name == name and pid.isdigit() and int(pid) in children(replica.proc.pid):
            return replica, int(pid)
    return None


# --- creating queued Pods as kube-apiserver does -------------------------------------------------------


class Creator:
    """Queues Pods: each AdmissionReview to one replica or the other, alternating (the other when the first
    cannot answer, as a Service would route), the patch applied, the Pod POSTed to the simulator."""

    def __init__(self, replicas: list[Replica], context: Any, sim: Sim, seed: int, threads: int = 4) -> None:
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
        conns = [Connection(r.port, self._context) for r in self._replicas]
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

    def _create(self, conns: list[Connection], api: SimApi, pod: dict[str, Any]) -> None:
        uid = str(uuid.uuid4())
        body = review_body(pod, uid, dry_run=False)
        first = next(self._turn) % len(conns)
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
            api.create(persisted(pod, answer.patch))
            with self._lock:
                self.by_replica[self._replicas[i].name] += 1
            return
        raise RuntimeError("no replica answered")


def targets(queued: int, namespaces: list[Space]) -> dict[str, int]:
    total = sum(space.share for space in namespaces)
    return {space.name: round(queued * space.share / total) for space in namespaces}


def top_up(creator: Creator, auditor: Auditor, wanted: dict[str, int]) -> None:
    """Queue what each namespace lacks of its target (waiting, as the cluster says, plus on the way)."""
    waiting = auditor.snapshot()["waiting"]
    classes = {space.name: space.classes for space in NAMESPACES}
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


# --- measuring the replicas ---------------------------------------------------------------------------


class Profile:
    """`py-spy record` of one process for a while (when --profile is given and py-spy is installed): folded
    stacks in bench/results/, summarized by function (share of the samples whose stack holds it)."""

    def __init__(self, args: argparse.Namespace, pid: int, name: str, seconds: float) -> None:
        self.path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not args.profile or not Path(spy).exists():
            return
        RESULTS.mkdir(exist_ok=True)
        self.path = RESULTS / f"queue-profile-{name}-{time.strftime('%H%M%S')}.txt"
        argv = [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(int(seconds), 1)),
            "--rate",
            "100",
            "--format",
            "raw",
            "--output",
            str(self.path),
            "--nonblocking",
            "--threads",
        ]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def summary(self, top: int = 25) -> dict[str, Any]:
        if self._proc is None or self.path is None:
            return {}
        self._proc.wait(120)
        if not self.path.exists():
            return {"error": "py-spy wrote nothing"}
        return {"file": str(self.path), **summarize_stacks(self.path.read_text(), top)}


def summarize_stacks(text: str, top: int) -> dict[str, Any]:
    """Samples per thread, and the functions most often on the stack (inclusive) and on top (self)."""
    threads: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        threads[frames[0]] += n
        for frame in set(frames[1:]):
            inclusive[_function(frame)] += n
        own[_function(frames[-1])] += n
    share = {k: round(v / max(total, 1), 4) for k, v in inclusive.most_common(top)}
    return {
        "samples": total,
        "threads": {k: round(v / max(total, 1), 4) for k, v in threads.most_common()},
        "inclusive": share,
        "self": {k: round(v / max(total, 1), 4) for k, v in own.most_common(top)},
    }


def _function(frame: str) -> str:
    """`plan (webhook/queue/release.py:89)` -> `plan (webhook/queue/release.py)`: a function, not a line."""
    return re.sub(r":\d+\)$", ")", frame.strip())


PROBE_POD_NAMESPACE = "bench-probe"


def probe_pod(name: str) -> dict[str, Any]:
    """A Pod no scheduler takes (its scheduler does not exist) and gpupool never counts (no GPU): something
    to PATCH, to time the API's writes under the run's load."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": PROBE_POD_NAMESPACE},
        "spec": {"schedulerName": "bench-none", "containers": [{"name": "main", "image": "busybox"}]},
    }


class Probes:
    """While a phase runs, side by side and interleaved, in a process of its own (so that the benchmark's
    threads do not slow it):

    - the API's write round trip: a JSON Patch of one annotation of a probe Pod, sent by a bare HTTP client,
      and the same patch sent through gpupool's own writer (webhook.sources.writes.PodReleaser, the
      `kubernetes` client the leader releases with): the first is the simulator's time, the difference
      the client's;
    - admissions: a dry run of an ordinary Pod (`placement: now`) to the leader and to the follower."""

    def __init__(self, sim: Sim, ca: Path, roles: dict[str, Replica], rate: float = 10.0) -> None:
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


def timed_probes(sim: Sim, ca: Path, roles: dict[str, Replica], seconds: float) -> dict[str, dict[str, float]]:
    """Admissions to each role (and the API's writes), interleaved, for `seconds`, 20 a second each."""
    probes = Probes(sim, ca, roles, rate=20.0)
    time.sleep(seconds)
    timed = probes.stop()
    return {name.removeprefix("admission_"): q for name, q in timed.items() if name.startswith("admission_")}


def write_capacity(sim: Sim, seconds: float = 4.0) -> dict[str, dict[str, float]]:
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


def cpu_percent(pids: dict[str, int], seconds: float) -> dict[str, float]:
    meter = CpuMeter(pids)
    meter.reset()
    time.sleep(seconds)
    return meter.read()


# --- the run ------------------------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    marks: dict[str, float] = field(default_factory=dict)
    load: dict[str, dict[str, float]] = field(default_factory=dict)  # CPU % per phase, by process
    notes: dict[str, Any] = field(default_factory=dict)
    ca: Path = Path()  # the replicas' CA certificate, for clients of their own


def meter(sim: Sim, reps: list[Replica]) -> CpuMeter:
    pids = {"simulator": sim.proc.pid, "benchmark": os.getpid()}
    for r in reps:
        pids[f"{r.name} worker"] = r.worker()
    cpu = CpuMeter(pids)
    cpu.reset()
    return cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args)
    r.notes["loadavg_start"] = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpupool-queue-") as tmp_name:
        tmp = Path(tmp_name)
        ensure_certificates(tmp, "gpupool-webhook", "gpupool-system", hosts=["127.0.0.1"])
        context = tls_context(tmp / "ca.crt")
        r.ca = tmp / "ca.crt"
        with simulator(args, tmp) as sim:
            api = sim.api()
            began = now()
            quiet(api)
            nodes, _ = list_all(api, "/api/v1/nodes")
            pods, listed_at = list_all(api, "/api/v1/pods", keep=lambda p: pod_requests(p.get("spec") or {}).get(GPU))
            class_of = {m.product: m.gpu_class for m in GPU_MODELS}
            auditor = Auditor(nodes, pods, RULES, [space.name for space in NAMESPACES], class_of)
            del pods
            tail = Tail(sim.audit, auditor, listed_at)
            print(f"listed {len(nodes):,} nodes and the Pods at {listed_at} in {now() - began:.1f} s", flush=True)
            try:
                result = phases(r, sim, api, auditor, tail=tail, nodes=nodes, tmp=tmp, context=context)
            finally:
                api.close()
        tail.stop()
    result["simulator"] = [line for line in sim.exit_lines if line.startswith("kubesim: ")]
    return result


def fill(sim: Sim, api: SimApi, auditor: Auditor, tail: Tail) -> int:
    """Take every free GPU of every usable node with one-GPU Pods bound there; the fleet is then full."""
    for rule in RULES:
        if rule.kind == "gpus":
            api.call(
                "POST",
                f"/api/v1/namespaces/{rule.namespace}/resourcequotas",
                resource_quota(rule.namespace, rule.key, rule.hard),
            )
    fillers: list[dict[str, Any]] = []
    for name, node in auditor.nodes.items():
        if node.usable and node.gpus:
            fillers.extend(filler(name, k) for k in range(max(node.gpus - node.used, 0)))
    began = now()
    post_all(sim, fillers)
    tail.wait_for(quiet(api))
    free = sum(auditor.free.values())
    print(f"fleet saturated: {len(fillers):,} one-GPU Pods bound in {now() - began:.1f} s; free GPUs left {free}")
    if free:
        raise RuntimeError(f"{free} GPUs still free after the fill: {dict(auditor.free)}")
    return len(fillers)


def phases(
    r: Run, sim: Sim, api: SimApi, auditor: Auditor, *, tail: Tail, nodes: list[dict[str, Any]], tmp: Path, context: Any
) -> dict[str, Any]:
    args = r.args
    r.notes["fillers"] = fill(sim, api, auditor, tail)
    with replicas(tmp, sim) as reps:
        deadline = now() + 120
        while not auditor.snapshot()["holder"] and now() < deadline:
            time.sleep(0.2)
        r.notes["first_leader"] = auditor.snapshot()["holder"]
        creator = Creator(reps, context, sim, args.seed)
        try:
            steady_targets = targets(args.queued, NAMESPACES)
            began = now()
            wait_queued(auditor, steady_targets, 600, creator)
            print(f"{args.queued:,} Pods queued in {now() - began:.1f} s; the leader is {r.notes['first_leader']}")
            probes = Probes(sim, r.ca, roles_of(reps, auditor.snapshot()["holder"]))
            leading = leader_of(reps, auditor.snapshot()["holder"])
            spy = Profile(args, leading[1] if leading else 0, "steady", args.seconds - 5)
            cpu = meter(sim, reps)
            sim.command(f"finish-rate {args.finish_rate:g}")
            r.marks["steady"] = now()
            keep_topped_up(creator, auditor, steady_targets, now() + args.seconds)
            r.marks["steady_end"] = now()
            r.load["steady"] = cpu.read()
            r.notes["probes_steady"] = probes.stop()
            r.notes["profile_steady"] = spy.summary()
            print(f"steady: {args.seconds:g} s of {args.finish_rate:g} finishes/s", flush=True)
            cpu = meter(sim, [])  # the killed worker's pid goes: the replicas are left out
            failover(r, reps, auditor, creator, steady_targets)
            r.load["failover"] = cpu.read()
            sim.command("finish-rate 0")
            burst(r, sim, auditor, creator=creator, nodes=nodes, reps=reps)
            r.notes["write_capacity"] = write_capacity(sim)
            if args.memory_queued:
                memory(r, sim, reps, auditor, creator=creator)
        finally:
            creator.close()
        r.notes["created_by_replica"] = dict(creator.by_replica)
        r.notes["creation_failures"] = dict(creator.failures)
        r.notes["logs"] = {rep.name: log_summary(rep.log) for rep in reps}
    r.notes["loadavg_end"] = os.getloadavg()
    return report(r, auditor)


def _ready(rep: Replica) -> bool:
    try:
        return _readyz(rep.health_port)
    except OSError:
        return False


def failover(r: Run, reps: list[Replica], auditor: Auditor, creator: Creator, wanted: dict[str, int]) -> None:
    holder = auditor.snapshot()["holder"]
    found = leader_of(reps, holder)
    if found is None:
        raise RuntimeError(f"no replica's worker is the Lease's holder {holder!r}")
    victim, pid = found
    r.notes["killed"] = holder
    r.marks["kill"] = now()
    os.kill(pid, signal.SIGKILL)
    deadline = r.marks["kill"] + 90
    while now() < deadline:
        top_up(creator, auditor, wanted)
        snap = auditor.snapshot()
        if snap["holder"] not in ("", holder) and snap["last_release_at"] > r.marks["kill"]:
            break
        time.sleep(0.1)
    keep_topped_up(creator, auditor, wanted, now() + 5)
    r.marks["failover_end"] = now()
    respawned = now() + 600
    while now() < respawned and not _ready(victim):  # the killed worker's successor: ready once synced
        time.sleep(0.2)
    r.marks["victim_ready"] = now()
    print(f"failover: killed {holder} ({victim.name}); the Lease went to {auditor.snapshot()['holder']}", flush=True)


def burst(
    r: Run,
    sim: Sim,
    auditor: Auditor,
    *,
    creator: Creator,
    nodes: list[dict[str, Any]],
    reps: list[Replica],
) -> None:
    """`--queued` medium Pods waiting, then room for all of them at once: L4 nodes of 8 GPUs join."""
    args = r.args
    medium = [space for space in OPEN if space.classes == ("medium",)]
    wanted = targets(args.queued, medium)
    medium_products = {m.product for m in GPU_MODELS if m.gpu_class == "medium"}
    deadline = now() + 900
    while True:  # the room left from the steady phase taken (a leader that fell behind still releases into it)
        wait_queued(auditor, wanted, 600, creator)
        snap = auditor.snapshot()
        if not any(snap["room"].get(p, 0) for p in medium_products) and now() - snap["last_release_at"] > 2:
            break
        if now() > deadline:
            raise TimeoutError(f"medium room never ran out before the burst: {snap['room']}")
        time.sleep(0.5)
    template = next(
        n
        for n in nodes
        if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-L4"
        and n["status"]["allocatable"].get(GPU) == "8"
        and not n["spec"].get("unschedulable")
    )
    # Room for every Pod waiting, not only the burst's: the quota namespaces' Pods (medium ones among them)
    # take room too as their quotas free, and a burst Pod left without room would wait for a finish, which
    # is not the release rate this phase measures.
    waiting_now = auditor.snapshot()["waiting"]
    count = math.ceil(sum(waiting_now.values()) / 8)
    new_nodes = [burst_node(template, k) for k in range(count)]
    cpu = meter(sim, reps)
    leading = leader_of(reps, auditor.snapshot()["holder"])
    spy = Profile(args, leading[1] if leading else 0, "burst", 12)
    probes = Probes(sim, r.ca, roles_of(reps, auditor.snapshot()["holder"]))
    r.marks["burst"] = now()
    post_all(sim, new_nodes)
    r.marks["burst_nodes_posted"] = now()
    deadline = now() + 120
    while now() < deadline:
        waiting = auditor.snapshot()["waiting"]
        if sum(waiting.get(ns, 0) for ns in wanted) == 0:
            break
        time.sleep(0.1)
    r.marks["burst_end"] = now()
    r.load["burst"] = cpu.read()
    r.notes["probes_burst"] = probes.stop()
    r.notes["profile_burst"] = spy.summary()
    r.notes["burst_namespaces"] = list(wanted)
    r.notes["burst_nodes"] = count
    r.notes["burst_pods"] = sum(waiting_now.get(ns, 0) for ns in wanted)
    print(f"burst: {count} nodes of 8 GPUs for {sum(waiting_now.values())} queued Pods", flush=True)


def memory(r: Run, sim: Sim, reps: list[Replica], auditor: Auditor, *, creator: Creator) -> None:
    """Many Pods queued with no room: the leader's RSS and CPU against a follower's, and their admissions."""
    args = r.args
    holder = auditor.snapshot()["holder"]
    roles = roles_of(reps, holder)
    leader = roles["leader"]
    r.marks["memory"] = now()
    before = {role: {"rss_mb": rss_mb(rep.worker()), "queued": rep.queued()} for role, rep in roles.items()}
    waiting_before = sum(auditor.snapshot()["waiting"].values())
    before_cpu = cpu_percent({role: rep.worker() for role, rep in roles.items()}, 10)
    before_probe = timed_probes(sim, r.ca, roles, args.probe_seconds)
    waiting = auditor.snapshot()["waiting"]
    high = [space for space in OPEN if space.classes == ("high",)]
    wanted = {ns: waiting.get(ns, 0) + n for ns, n in targets(args.memory_queued, high).items()}
    began = now()
    probes = Probes(sim, r.ca, roles)
    wait_queued(auditor, wanted, 1800, creator)
    during = probes.stop()
    total = sum(auditor.snapshot()["waiting"].values())
    deadline = now() + 120
    while now() < deadline and min(rep.queued() for rep in roles.values()) < total:
        time.sleep(0.5)
    r.marks["memory_queued"] = now()
    print(f"memory: {args.memory_queued:,} more Pods queued in {now() - began:.1f} s ({total:,} waiting)", flush=True)
    time.sleep(10)  # the leader has made passes over all of them
    after = {role: {"rss_mb": rss_mb(rep.worker()), "queued": rep.queued()} for role, rep in roles.items()}
    spy = Profile(args, leader.worker(), "memory", 10)
    after_cpu = cpu_percent({role: rep.worker() for role, rep in roles.items()}, 10)
    r.notes["profile_memory"] = spy.summary()
    after_probe = timed_probes(sim, r.ca, roles, args.probe_seconds)
    r.marks["memory_end"] = now()
    r.notes["memory"] = {
        "leader": f"{leader.name} ({holder})",
        "waiting_before": waiting_before,
        "waiting": total,
        "before": before,
        "after": after,
        "cpu_before": {k: v for k, v in before_cpu.items() if k in roles or k == "others"},
        "cpu_after": {k: v for k, v in after_cpu.items() if k in roles or k == "others"},
        "admission_before": before_probe,
        "probes_while_queueing": during,
        "queueing_s": r.marks.get("memory_queued", 0.0) - r.marks["memory"],
        "admission_after": after_probe,
    }


def log_summary(log: Path) -> dict[str, Any]:
    levels: Counter[str] = Counter()
    notable: list[str] = []
    with open(log, "rb") as f:
        for line in f:
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                levels["not JSON"] += 1
                continue
            levels[str(entry.get("level"))] += 1
            if entry.get("level") in ("warning", "error", "critical") and len(notable) < 20:
                notable.append(line.decode(errors="replace").rstrip()[:300])
    return {"levels": dict(levels), "notable": notable}


# --- the figures --------------------------------------------------------------------------------------


def between(releases: list[Release], start: float, end: float) -> list[Release]:
    return [x for x in releases if start <= x.at < end]


def gaps(releases: list[Release]) -> dict[str, float]:
    """Store time between consecutive releases: within a pass, what one release costs the leader (its
    writes are one at a time)."""
    times = sorted(x.at for x in releases)
    return quantiles([b - a for a, b in itertools.pairwise(times)])


def report(r: Run, auditor: Auditor) -> dict[str, Any]:
    marks = r.marks
    steady = between(auditor.releases, marks["steady"], marks["kill"])
    steady_s = marks["kill"] - marks["steady"]
    latency = quantiles([x.latency for x in steady])
    taken = [
        (at, holder) for at, holder in auditor.leases if at > marks["kill"] and holder not in ("", r.notes["killed"])
    ]
    takeover = taken[0][0] if taken else math.inf
    after = [x for x in auditor.releases if x.at > takeover]
    failover_release = after[0].at if after else math.inf
    burst_ns = set(r.notes.get("burst_namespaces", []))
    burst = [x for x in between(auditor.releases, marks["burst"], marks["burst_end"] + 1) if x.namespace in burst_ns]
    first_room = min((at for at, name in auditor.nodes_added if at >= marks["burst"]), default=marks["burst"])
    last = max((x.at for x in burst), default=first_room)
    burst_rate = len(burst) / (last - first_room) if burst and last > first_room else 0.0
    quota = [
        {
            "quota": w.rule.name,
            "hard": w.rule.hard,
            "peak": w.peak,
            "excess_peak": w.excess_peak,
            "writes_over": w.writes_over,
            "writes_at_limit": w.at_limit_writes,
        }
        for w in auditor.quotas
    ]
    binds = quantiles([b - a for a, b in auditor.binds])
    book = auditor.overbooking
    result: dict[str, Any] = {
        "args": vars(r.args),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "load": r.load,
        "notes": r.notes,
        "steady": {
            "seconds": steady_s,
            "releases": len(steady),
            "releases_per_s": len(steady) / steady_s if steady_s else 0.0,
            "latency_s": latency,
            "latency_by_class": {
                cls: quantiles([x.latency for x in steady if x.product in products])
                for cls, products in _products_by_class().items()
            },
            "short_capacity": sum(x.short_capacity for x in steady),
            "gaps_s": gaps(steady),
        },
        "failover": {
            "killed": r.notes["killed"],
            "took_over": taken[0][1] if taken else "",
            "lease_taken_s": takeover - marks["kill"],
            "first_release_s": failover_release - marks["kill"],
            "releases_before_takeover": sum(1 for x in auditor.releases if marks["kill"] < x.at <= takeover),
            "killed_replica_ready_again_s": marks["victim_ready"] - marks["kill"],
        },
        "burst": {
            "releases": len(burst),
            "nodes": r.notes.get("burst_nodes", 0),
            "nodes_posted_s": marks["burst_nodes_posted"] - marks["burst"],
            "first_room_to_last_release_s": last - first_room,
            "releases_per_s": burst_rate,
            "latency_s": quantiles([x.latency for x in burst]),
            "gaps_s": gaps(burst),
        },
        "overbooked": {
            "peak_gpus": book.peak,
            "writes_over": book.writes_over,
            "gpu_seconds": book.gpu_seconds,
            "node_peak_gpus": book.node_peak,
        },
        "quotas": quota,
        "release_to_bind_s": binds,
        "audit": {
            "writes": auditor.writes,
            "gaps": auditor.gaps,
            "signatures_off_pool": auditor.signatures_off_pool,
            "bound_off_pool": auditor.bound_off_pool,
            "node_changes": auditor.node_changes,
            "releases": len(auditor.releases),
        },
        "memory": r.notes.get("memory"),
    }
    result["baselines"] = baselines(result)
    result["goals"] = judge(result)
    return result


def baselines(result: dict[str, Any]) -> dict[str, float]:
    """The figures as ratios of what the API allows in the same run: releases/s against the PATCHes/s the
    simulator takes from as many writers as the leader has (gpupool's own client, nothing else writing),
    and release latency against one bare PATCH round trip measured during the steady phase."""
    capacity = (result["notes"].get("write_capacity") or {}).get(f"gpupool x{WRITERS}") or {}
    probes = result["notes"].get("probes_steady") or {}
    probe, watched = probes.get("write_raw") or {}, probes.get("write_raw_then_watched") or {}
    latency = result["steady"]["latency_s"]
    out: dict[str, float] = {}
    if capacity.get("patches_per_s"):
        out["burst_releases_per_api_patch"] = result["burst"]["releases_per_s"] / capacity["patches_per_s"]
    if probe.get("p50") and latency:
        out["latency_p50_in_round_trips"] = latency["p50"] / probe["p50"]
        out["latency_p99_in_round_trips"] = latency["p99"] / probe["p99"]
    if probe.get("p50") and watched.get("p50") and latency:
        # The least a release can take: the write that made room reaching a watcher, then one PATCH.
        out["floor_p50_s"] = watched["p50"] + probe["p50"]
        out["latency_p50_over_floor"] = latency["p50"] / out["floor_p50_s"]
    return out


def _products_by_class() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m in GPU_MODELS:
        out.setdefault(m.gpu_class, set()).add(m.product)
    return out


def judge(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    latency = result["steady"]["latency_s"]
    quota_peak = max((q["excess_peak"] for q in result["quotas"]), default=0)
    measured = {
        "p50_s": latency.get("p50", math.inf),
        "p99_s": latency.get("p99", math.inf),
        "releases_per_s": result["burst"]["releases_per_s"],
        "overbooked": result["overbooked"]["peak_gpus"],
        "quota_exceeded": quota_peak,
        "failover_s": result["failover"]["first_release_s"],
    }
    at_least = {"releases_per_s"}
    return {
        name: {
            "goal": goal,
            "measured": measured[name],
            "met": measured[name] >= goal if name in at_least else measured[name] <= goal,
        }
        for name, goal in GOALS.items()
    }


def print_report(result: dict[str, Any]) -> None:
    s, f, b = result["steady"], result["failover"], result["burst"]
    lat = s["latency_s"]
    print(
        f"\nsteady ({s['seconds']:.0f} s, {result['args']['finish_rate']:g} finishes/s, "
        f"{result['args']['queued']:,} queued): {s['releases']:,} releases, {s['releases_per_s']:.0f}/s"
    )
    if lat:
        print(
            f"  release latency room -> gate removed: p50 {lat['p50'] * 1e3:.0f} ms, p90 {lat['p90'] * 1e3:.0f} ms, "
            f"p99 {lat['p99'] * 1e3:.0f} ms, max {lat['max'] * 1e3:.0f} ms"
        )
    print(
        f"failover: Lease taken {f['lease_taken_s']:.1f} s after the SIGKILL (by {f['took_over']}), "
        f"first release {f['first_release_s']:.1f} s; the killed replica ready again after "
        f"{f['killed_replica_ready_again_s']:.1f} s"
    )
    print(
        f"burst: {b['releases']:,} released in {b['first_room_to_last_release_s']:.2f} s from the first node: "
        f"{b['releases_per_s']:.0f}/s (nodes created in {b['nodes_posted_s']:.2f} s)"
    )
    for phase in ("steady", "burst"):
        probes = result["notes"].get(f"probes_{phase}") or {}
        print(
            f"  {phase} probes (p50/p99 ms): "
            + ", ".join(f"{name} {q['p50'] * 1e3:.1f}/{q['p99'] * 1e3:.1f}" for name, q in probes.items() if q)
        )
        g = result[phase]["gaps_s"]
        if g:
            print(f"  {phase}: between consecutive releases p50 {g['p50'] * 1e3:.1f} ms")
    for name, c in (result["notes"].get("write_capacity") or {}).items():
        print(f"  API write capacity, {name}: {c['patches_per_s']:.0f} PATCH/s, p50 {c['p50'] * 1e3:.1f} ms")
    base = result.get("baselines") or {}
    if "burst_releases_per_api_patch" in base:
        ratio = base["burst_releases_per_api_patch"]
        print(f"  burst releases/s = {ratio:.2f}x the API's PATCH/s from {WRITERS} writers")
    if "floor_p50_s" in base:
        print(
            f"  the API's floor (a write reaching a watcher of every Pod, then one PATCH): p50 "
            f"{base['floor_p50_s'] * 1e3:.0f} ms; the release latency is {base['latency_p50_over_floor']:.1f}x it"
        )
    if "latency_p50_in_round_trips" in base:
        print(
            f"  steady release latency = {base['latency_p50_in_round_trips']:.1f}x (p50), "
            f"{base['latency_p99_in_round_trips']:.1f}x (p99) a bare PATCH's round trip in the same phase"
        )
    o = result["overbooked"]
    print(f"overbooked: peak {o['peak_gpus']} GPUs, {o['writes_over']} writes, {o['gpu_seconds']:.2f} GPU-seconds")
    for q in result["quotas"]:
        print(
            f"quota {q['quota']}: hard {q['hard']}, peak {q['peak']}, exceeded by {q['excess_peak']} "
            f"(at its limit after {q['writes_at_limit']:,} writes)"
        )
    m = result.get("memory")
    if m:
        for role in ("leader", "follower"):
            print(
                f"memory {role}: RSS {m['before'][role]['rss_mb']:.0f} -> {m['after'][role]['rss_mb']:.0f} MB "
                f"with {m['before'][role]['queued']:.0f} -> {m['after'][role]['queued']:.0f} queued; "
                f"CPU {m['cpu_after'][role]:.0f} % of a core; admission p50/p99 "
                f"{m['admission_after'][role]['p50'] * 1e3:.2f}/{m['admission_after'][role]['p99'] * 1e3:.2f} ms "
                f"(before {m['admission_before'][role]['p50'] * 1e3:.2f}/"
                f"{m['admission_before'][role]['p99'] * 1e3:.2f}; while queueing "
                f"{m['probes_while_queueing'][f'admission_{role}']['p50'] * 1e3:.0f}/"
                f"{m['probes_while_queueing'][f'admission_{role}']['p99'] * 1e3:.0f})"
            )
    print(
        "load (CPU % of one core): "
        + json.dumps({k: {n: round(v) for n, v in d.items()} for k, d in result["load"].items()})
    )
    print(
        "goals: "
        + ", ".join(f"{k} {'met' if v['met'] else 'MISSED'} ({v['measured']:.3g})" for k, v in result["goals"].items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--queued", type=int, default=1000, help="Pods kept queued while room appears")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the steady phase")
    parser.add_argument("--finish-rate", type=float, default=100.0, help="Pods finishing per second")
    parser.add_argument("--memory-queued", type=int, default=10_000, help="Pods queued for the memory phase (0: none)")
    parser.add_argument(
        "--probe-seconds", type=float, default=15.0, help="memory phase: how long admissions are timed, idle"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the leader in the steady, burst and memory phases (pip install py-spy)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run to iterate with: {' '.join(QUICK)} (flags given after it still win)",
    )
    args = parser.parse_args()
    if args.quick:
        args = parser.parse_args([*QUICK, *sys.argv[1:]])
    result = run(args)
    print_report(result)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"queue-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
