"""Soak: `gpupool serve` on the live inventory at 5,000 nodes and 150,000 Pods, under load, for a while.

Default mode (issue 12, part 1). The API simulator (`python -m webhook.testing`, its own process)
serves a synthetic cluster and changes its Pods at `--events` writes/s (adds, binds, status updates,
completions, deletions of GPU and CPU Pods; webhook.testing.kubechurn). One `gpupool serve`, as the
manifests ship it (1 worker x 8 threads, log level info), lists and watches it. The load generator
sends AdmissionReviews at a fixed rate (`--rate`, open loop: request i is due at start + i/rate and its
latency is measured from then, so a stall shows up in the latency of every request it delays) over a
few keep-alive TLS connections, as kube-apiserver does (it opens another when all are busy, up to
`--max-connections`). The Pods are GPU Pods of a mix of shapes, 10 %
dry runs, about 6 % that must be denied (a malformed annotation, a product the cluster lacks, a
namespace quota). Every Pod admitted for real is then created in the simulator with the patch applied
(what kube-apiserver does next), so the watch settles its reservation and the churn binds it.

An error is an answer that is not HTTP 200, not a well-formed AdmissionReview for the request's uid, a
different outcome than the shape's (mutated, denied 400, denied 403), or one that comes later than the
webhook's timeout (5 s) after it was due. The server's RSS (master + worker, /proc) is read once it
is ready and at the end. Every 20 s a probe measures how far the server's watch lags the cluster: a
Pod is created for a one-GPU pool and dry runs ask the server until it counts that Pod. The CPU use
of every process (and of the machine's other users) is read from /proc. `--lock-stats` also times,
inside the server, each admission's wait for the inventory lock (bench/lockstats/sitecustomize.py).

`--replicas-burst` (part 2): two `gpupool serve` processes, the two replicas of the manifests, watch
the same simulator. A burst of 100 one-GPU Pods for a pool with exactly 50 free GPUs is split evenly
and interleaved between them, sent as fast as possible, each admitted Pod created in the simulator
at once. Counted: admissions that claimed capacity (no "will wait" warning) beyond the 50. Then the
window in which that can happen is measured directly: an admission on one replica takes the last GPU
of a one-GPU pool, the Pod is created, and dry runs ask the other replica until it counts it.

    .venv/bin/python bench/soak.py [--minutes 10] [--rate 300] [--events 1000] [--connections 4] [--lock-stats]
    .venv/bin/python bench/soak.py --replicas-burst [--bursts 5] [--probes 40]

Results: a table on stdout and JSON in bench/results/soak-<time>.json (or burst-<time>.json).
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import gc
import http.client
import json
import multiprocessing
import os
import platform
import queue
import random
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import jsonpatch
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `python bench/soak.py` finds the bench package too

from bench.bench_server import admissions_by_outcome, free_port, running  # noqa: E402
from webhook.serving.certs import ensure_certificates  # noqa: E402
from webhook.testing.synthetic import namespaces as synthetic_namespaces  # noqa: E402
from webhook.testing.synthetic import pod_spec_defaults  # noqa: E402

RESULTS = REPO / "bench" / "results"
SERVICE_DNS = "gpupool-webhook.gpupool-system.svc"  # the name kube-apiserver verifies
DEADLINE_S = 5.0  # the webhook's timeoutSeconds (manifests/base/webhook.yaml)
MUTATE_PATH = f"/mutate?timeout={DEADLINE_S:g}s"
WILL_WAIT = "the Pod will wait"  # gpupool's warning when the chosen pool has no room now
GOALS = {"p99_ms": 5.0, "errors": 0, "rss_growth": 0.10}

# Pools the benchmark adds to the synthetic cluster. Their nodes carry a taint that only the
# benchmark's own Pods tolerate, so neither the churn nor the soak's other Pods ever use them.
BENCH_TAINT = {"key": "gpupool.io/bench", "value": "reserved", "effect": "NoSchedule"}
BENCH_TOLERATION = {"key": "gpupool.io/bench", "operator": "Exists", "effect": "NoSchedule"}
PROBE_PRODUCT, PROBE_NS = "NVIDIA-A2", "bench-probe"  # one node, one GPU: counts show at once
BURST_PRODUCT, BURST_NS = "NVIDIA-A10", "bench-burst"  # 8 nodes x 8 GPUs, 14 in use: 50 free
BURST_NODES, BURST_GPUS_PER_NODE, BURST_USED = 8, 8, 14
BURST_FREE = BURST_NODES * BURST_GPUS_PER_NODE - BURST_USED


# --- /proc ------------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine, for how busy it was around us."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@dataclass
class CpuMeter:
    """CPU use of a few processes (and of the whole machine) between two readings, in % of one core."""

    pids: dict[str, int]
    _last: dict[str, float] = field(default_factory=dict)
    _machine: tuple[int, int] = (0, 0)
    _at: float = 0.0

    def reset(self) -> None:
        self._last = {name: self._cpu(name, pid) for name, pid in self.pids.items()}
        self._machine, self._at = machine_jiffies(), time.monotonic()

    def read(self) -> dict[str, float]:
        now, machine = time.monotonic(), machine_jiffies()
        seconds = max(now - self._at, 1e-9)
        usage = {}
        for name, pid in self.pids.items():
            cpu = self._cpu(name, pid)
            usage[name] = 100 * (cpu - self._last.get(name, cpu)) / seconds
            self._last[name] = cpu
        busy, total = machine[0] - self._machine[0], machine[1] - self._machine[1]
        # The machine's busy time in % of one core, less this benchmark's: other users of the machine.
        usage["others"] = max(0.0, 100 * (os.cpu_count() or 1) * busy / max(total, 1) - sum(usage.values()))
        self._machine, self._at = machine, now
        return usage

    @staticmethod
    def _cpu(name: str, pid: int) -> float:
        if pid == os.getpid():
            return time.process_time()
        try:
            return cpu_seconds(pid)
        except OSError:
            return 0.0


# --- the simulator ------------------------------------------------------------------------------------


class SimApi:
    """A keep-alive client for the simulator's REST API (one per thread)."""

    def __init__(self, port: int, token: str) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        data = orjson.dumps(body) if body is not None else None
        self._conn.request(method, path, body=data, headers=self._headers)
        response = self._conn.getresponse()
        return response.status, orjson.loads(response.read())

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        namespace = obj["metadata"].get("namespace")
        plural = {"Pod": "pods", "Node": "nodes"}[obj["kind"]]
        path = f"/api/v1/namespaces/{namespace}/{plural}" if namespace else f"/api/v1/{plural}"
        status, created = self.call("POST", path, obj)
        if status != 201:
            raise RuntimeError(f"create {obj['kind']} failed: {status} {created.get('message')}")
        return created

    def delete_pod(self, namespace: str, name: str) -> None:
        status, answer = self.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        if status not in (200, 404):
            raise RuntimeError(f"delete failed: {status} {answer.get('message')}")

    def items(self, path: str) -> list[dict[str, Any]]:
        status, answer = self.call("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status}")
        items: list[dict[str, Any]] = answer["items"]
        return items

    def resource_version(self) -> int:
        """The newest resourceVersion: one more per write of any kind (a list of the few quotas is cheap)."""
        return int(self.call("GET", "/api/v1/resourcequotas?limit=1")[1]["metadata"]["resourceVersion"])

    def close(self) -> None:
        self._conn.close()


@dataclass
class Simulator:
    proc: subprocess.Popen[str]
    kubeconfig: Path
    port: int
    token: str
    exit_lines: list[str] = field(default_factory=list)  # what it printed as it stopped

    def api(self) -> SimApi:
        return SimApi(self.port, self.token)

    @property
    def churn(self) -> dict[str, float]:
        """Its churn's counts, printed when it stopped."""
        for out in reversed(self.exit_lines):
            if out.startswith("kubesim: churn "):
                counts: dict[str, float] = json.loads(out.removeprefix("kubesim: churn "))
                return counts
        return {}

    def command(self, line: str) -> str:
        """One command on its stdin (`--control`), and its answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer.startswith("kubesim: " + line.split(maxsplit=1)[0]):
            raise RuntimeError(f"the simulator answered {answer!r} to {line!r}")
        return answer


@contextmanager
def launch_simulator(
    argv: list[str], kubeconfig: Path, *, control: bool = False, stop_timeout: float = 60.0
) -> Iterator[Simulator]:
    """The simulator `argv` starts, once it serves (its first line says where; `kubeconfig` holds its
    token); `control`: its stdin is a pipe, for `Simulator.command`. SIGTERM at the end, and what it printed
    then kept in `exit_lines`."""
    stdin = subprocess.PIPE if control else None
    proc = subprocess.Popen(argv, cwd=REPO, stdin=stdin, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        print(line.strip(), flush=True)
        match = re.search(r"serving http://127\.0\.0\.1:(\d+)", line)
        if not match:
            raise SystemExit(f"the simulator did not start: {line!r}")
        token = json.loads(kubeconfig.read_text())["users"][0]["user"]["token"]
        sim = Simulator(proc, kubeconfig, int(match.group(1)), token)
        yield sim
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=stop_timeout)
        with contextlib.suppress(NameError):  # it did not start: nothing to keep
            sim.exit_lines = rest.splitlines()


@contextmanager
def simulator(args: argparse.Namespace, tmp: Path) -> Iterator[Simulator]:
    """`python -m webhook.testing` with the churn on, in its own process (its CPU is not the client's)."""
    kubeconfig = tmp / "kubeconfig"
    options = {
        "nodes": args.nodes,
        "pods": args.pods,
        "seed": args.seed,
        "churn": args.events,
        "kubeconfig": kubeconfig,
    }
    argv = [sys.executable, "-m", "webhook.testing", *(f"--{k}={v}" for k, v in options.items())]  # fmt: skip
    with launch_simulator(argv, kubeconfig) as sim:
        yield sim


def gpu_node(name: str, product: str, gpus: int, memory_mib: int) -> dict[str, Any]:
    """A GPU node as GPU Feature Discovery labels it, tainted for the benchmark's Pods only."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(memory_mib),
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/cuda.driver-version.full": "550.90.07",
                "gpu.accelerator/class": "medium",
            },
        },
        "spec": {"taints": [BENCH_TAINT]},
        "status": {
            "capacity": {"cpu": "32", "memory": "131072000Ki", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": "31850m", "memory": "127000000Ki", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def add_bench_pools(api: SimApi) -> None:
    """The probe pool (1 node, 1 GPU) and the burst pool (64 GPUs, 14 held by Running Pods: 50 free)."""
    api.create(gpu_node("gpu-bench-a2-0", PROBE_PRODUCT, 1, 15356))
    for i in range(BURST_NODES):
        api.create(gpu_node(f"gpu-bench-a10-{i}", BURST_PRODUCT, BURST_GPUS_PER_NODE, 23028))
    for i in range(BURST_USED // 2):
        pod = bench_pod(BURST_NS, f"running-{i}", BURST_PRODUCT, gpus=2)
        pod["spec"]["nodeName"] = f"gpu-bench-a10-{i}"
        pod["status"] = {"phase": "Running"}
        api.create(pod)


# --- admission requests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A kind of Pod the load sends, and the answer it must get."""

    name: str
    weight: int
    annotations: dict[str, str]
    expect: str  # "mutated", "denied-400" or "denied-403"
    gpu_limit: int = 0  # nvidia.com/gpu in the container's limits
    node_selector: dict[str, str] = field(default_factory=dict)
    quota_namespace: bool = False  # sent to a namespace with a GPU ResourceQuota


SHAPES = (
    Shape("class medium, 1 GPU", 28, {"gpupool.io/gpu-class": "medium"}, "mutated"),
    Shape("GPU limit only, 1 GPU", 14, {}, "mutated", gpu_limit=1),
    Shape("min-memory 40Gi, 2 GPUs", 10, {"gpupool.io/min-memory": "40Gi", "gpupool.io/gpu-count": "2"}, "mutated"),
    Shape("product L4, 4 GPUs", 8, {"gpupool.io/gpu-product": "L4", "gpupool.io/gpu-count": "4"}, "mutated"),
    Shape("product H100, 8 GPUs", 5, {"gpupool.io/gpu-product": "H100", "gpupool.io/gpu-count": "8"}, "mutated"),
    Shape("class high, 4 GPUs", 6, {"gpupool.io/gpu-class": "high", "gpupool.io/gpu-count": "4"}, "mutated"),
    Shape(
        "medium,high with fallback, 2 GPUs",
        6,
        {"gpupool.io/gpu-class": "medium,high", "gpupool.io/gpu-count": "2", "gpupool.io/fallback": "true"},
        "mutated",
    ),
    Shape(
        "class medium, pinned to T4",
        7,
        {"gpupool.io/gpu-class": "medium"},
        "mutated",
        node_selector={"nvidia.com/gpu.product": "Tesla-T4"},
    ),
    Shape("min-memory 20Gi, 1 GPU", 10, {"gpupool.io/min-memory": "20Gi"}, "mutated"),
    Shape("malformed gpu-count (400)", 3, {"gpupool.io/gpu-count": "two"}, "denied-400"),
    Shape("product the cluster lacks (403)", 2, {"gpupool.io/gpu-product": "H20"}, "denied-403"),
    Shape(
        "64 GPUs over a namespace quota (403)", 1, {"gpupool.io/gpu-count": "64"}, "denied-403", quota_namespace=True
    ),
)
DRY_RUN_SHARE = 0.10


def pod_object(shape: Shape, namespace: str, rng: random.Random) -> dict[str, Any]:
    """A Pod as a ReplicaSet creates it (generateName, owner, defaults filled in by the API server's
    own admission plugins), about 1.5 KB of JSON."""
    app = re.sub(r"[^a-z0-9]+", "-", shape.name.lower()).strip("-")[:30]
    resources: dict[str, Any] = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
    if shape.gpu_limit:
        resources["limits"]["nvidia.com/gpu"] = str(shape.gpu_limit)
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": f"registry.example.com/{namespace}/{app}:v1.{rng.randrange(20)}.0",
                "command": ["python", "-m", "train"],
                "args": ["--config", "/etc/train/config.yaml"],
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "OMP_NUM_THREADS", "value": "8"}],
                "resources": resources,
                "volumeMounts": [{"name": "config", "mountPath": "/etc/train"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            },
            {
                "name": "log-shipper",
                "image": "registry.example.com/infra/fluent-bit:3.0",
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
            },
        ],
        "volumes": [{"name": "config", "configMap": {"name": f"{app}-config"}}],
        "restartPolicy": "Always",
        **pod_spec_defaults(),
    }
    if shape.node_selector:
        spec["nodeSelector"] = dict(shape.node_selector)
    template_hash = f"{rng.getrandbits(36):09x}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{app}-{template_hash}-",
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": template_hash},
            "annotations": dict(shape.annotations),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-{template_hash}",
                    "uid": str(uuid.UUID(int=rng.getrandbits(128))),
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
            ],
        },
        "spec": spec,
    }


def bench_pod(namespace: str, name: str, product: str, gpus: int = 1, generate: bool = False) -> dict[str, Any]:
    """A Pod for one of the benchmark's own pools (it tolerates their taint)."""
    token = product.rsplit("-", maxsplit=1)[-1]  # NVIDIA-A10 -> A10: only that pool matches
    meta: dict[str, Any] = {"namespace": namespace, "annotations": {"gpupool.io/gpu-product": token}}
    meta["generateName" if generate else "name"] = name
    container = {"name": "main", "image": "registry.example.com/cuda:12", "resources": {}}
    if gpus != 1 or not generate:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [container], "tolerations": [BENCH_TOLERATION]},
    }


def review_body(pod: dict[str, Any], uid: str, dry_run: bool) -> bytes:
    """The AdmissionReview kube-apiserver sends for a Pod creation."""
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": pod["metadata"]["namespace"],
                "userInfo": {
                    "username": "system:serviceaccount:kube-system:replicaset-controller",
                    "uid": "5b7c9a1e-0000-4000-8000-000000000001",
                    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
                },
                "object": pod,
                "oldObject": None,
                "dryRun": dry_run,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
    )


@dataclass(frozen=True)
class Request:
    uid: str
    body: bytes
    pod: dict[str, Any]
    shape: str
    expect: str
    dry_run: bool


class RequestMaker:
    """Requests of the shape mix, each with its own uid, in namespaces without (or, for the quota shape,
    with) a GPU ResourceQuota."""

    def __init__(self, quotas: list[dict[str, Any]], namespaces: list[str], seed: int) -> None:
        self._rng = random.Random(seed)
        # Every form of a GPU quota gpupool enforces: `requests.`, and the bare and `limits.` forms that
        # Kubernetes stores but only gpupool enforces. A namespace under any of them fills up and denies.
        forms = {f"{prefix}nvidia.com/gpu" for prefix in ("requests.", "", "limits.")}
        limited = {q["metadata"]["namespace"] for q in quotas if forms & set(q.get("spec", {}).get("hard") or {})}
        self.free = sorted(ns for ns in namespaces if ns not in limited and ns.startswith(("team-", "ml-")))
        self.limited = sorted(limited)
        self._weights = [s.weight for s in SHAPES]

    def next(self) -> Request:
        rng = self._rng
        shape = rng.choices(SHAPES, self._weights)[0]
        namespace = rng.choice(self.limited if shape.quota_namespace else self.free)
        pod = pod_object(shape, namespace, rng)
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        dry_run = rng.random() < DRY_RUN_SHARE
        return Request(uid, review_body(pod, uid, dry_run), pod, shape.name, shape.expect, dry_run)


# --- the client ---------------------------------------------------------------------------------------


class Connection:
    """One keep-alive TLS connection, speaking just the HTTP/1.1 that kube-apiserver's webhook client
    speaks: POST with Content-Length, answers with Content-Length. Little Python per request, so the
    client's own CPU stays small."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self._port, self._context = port, context
        self._sock: ssl.SSLSocket | None = None
        self._file: Any = None
        self.opened = 0

    def connect(self, timeout: float = DEADLINE_S) -> ssl.SSLSocket:
        """Open the connection (TCP and the TLS handshake) unless it is open."""
        if self._sock is None:
            raw = socket.create_connection(("127.0.0.1", self._port), timeout=timeout)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = self._context.wrap_socket(raw, server_hostname=SERVICE_DNS)
            self._file = self._sock.makefile("rb")
            self.opened += 1
        return self._sock

    def post(self, body: bytes, timeout: float) -> tuple[int, bytes]:
        self.connect(timeout)
        assert self._sock is not None
        self._sock.settimeout(max(timeout, 0.001))
        head = (
            f"POST {MUTATE_PATH} HTTP/1.1\r\nHost: {SERVICE_DNS}:443\r\nUser-Agent: kube-apiserver-admission\r\n"
            f"Accept: application/json, */*\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        try:
            self._sock.sendall(head.encode() + body)
            status_line = self._file.readline(65537)
            if not status_line:
                raise ConnectionError("the server closed the connection")
            status = int(status_line.split()[1])
            length, close = 0, False
            while (line := self._file.readline(65537)) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection":
                    close = value.strip().lower() == b"close"
            data = self._file.read(length)
        except (OSError, ValueError):
            self.close()
            raise
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._file.close()
                self._sock.close()
            except OSError:
                pass
        self._sock = self._file = None


def tls_context(ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


@dataclass(frozen=True)
class Answer:
    outcome: str  # mutated, unchanged, denied-<code>, or what went wrong: http-<status>, malformed, ...
    patch_b64: str | None = None  # as it came: decoded only where the Pod is created
    warnings: tuple[str, ...] = ()

    @property
    def patch(self) -> list[dict[str, Any]]:
        return orjson.loads(base64.b64decode(self.patch_b64 or "W10="))  # type: ignore[no-any-return]

    @property
    def claimed(self) -> bool:
        """Admitted with capacity: placed, and not with the warning that the Pod will wait."""
        return self.outcome == "mutated" and not any(WILL_WAIT in w for w in self.warnings)


def read_answer(status: int, data: bytes, uid: str) -> Answer:
    if status != 200:
        return Answer(f"http-{status}")
    try:
        response = orjson.loads(data)["response"]
        allowed = response["allowed"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return Answer("malformed")
    if response.get("uid") != uid or not isinstance(allowed, bool):
        return Answer("malformed")
    warnings = tuple(response.get("warnings") or ())
    if not allowed:
        return Answer(f"denied-{(response.get('status') or {}).get('code')}", None, warnings)
    if not response.get("patch"):
        return Answer("unchanged", None, warnings)
    if response.get("patchType") != "JSONPatch" or not isinstance(response["patch"], str):
        return Answer("malformed")
    return Answer("mutated", response["patch"], warnings)


def persisted(pod: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The Pod kube-apiserver stores after the webhook: the patch applied (to `pod` itself), Pending,
    on no node."""
    created: dict[str, Any] = jsonpatch.apply_patch(pod, patch, in_place=True)
    created["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return created


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "n": len(ordered),
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "p999": at(0.999),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


# --- the server's own view ----------------------------------------------------------------------------


def scrape(health_port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", health_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def histogram(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts {upper bound: count} of a Prometheus histogram."""
    buckets = {}
    for match in re.finditer(rf'^{name}_bucket\{{le="([^"]+)"\}} ([\d.e+]+)$', text, re.M):
        buckets[float(match.group(1))] = float(match.group(2))
    return buckets


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The bucket bound under which a fraction q of the observations between two scrapes fell."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if total and count >= q * total:
            return bound
    return float("inf")


def gauge(text: str, name: str, pool: str | None = None) -> float | None:
    label = rf'\{{pool="{re.escape(pool)}"\}}' if pool else ""
    match = re.search(rf"^{name}{label} ([\d.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else None


def serve_argv(cert_dir: Path, kubeconfig: Path, port: int, health_port: int) -> list[str]:
    """`gpupool serve` as the manifests configure it: live inventory, 1 worker x 8 threads, log info."""
    return [
        sys.executable, "-m", "webhook", "serve",
        "--cert", str(cert_dir / "tls.crt"), "--key", str(cert_dir / "tls.key"), "--kubeconfig", str(kubeconfig),
        "--host", "127.0.0.1", "--port", str(port), "--health-port", str(health_port),
        "--workers", "1", "--threads", "8", "--log-level", "info",
    ]  # fmt: skip


ServerT = TypeVar("ServerT", bound="Server")


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    health_port: int
    log: Path

    def pids(self) -> dict[str, int]:
        return {f"{self.name} master": self.proc.pid, f"{self.name} worker": children(self.proc.pid)[0]}

    def rss(self) -> dict[str, float]:
        return {name: rss_mb(pid) for name, pid in self.pids().items()}


@contextmanager
def bench_cluster(args: argparse.Namespace, name: str) -> Iterator[tuple[Path, ssl.SSLContext, Simulator, SimApi]]:
    """What both modes stand on: a scratch directory with certificates (and a client TLS context for
    them), the simulator with its churn and the benchmark's own pools, and a client for its API."""
    with tempfile.TemporaryDirectory(prefix=f"gpupool-{name}-") as tmp_name:
        tmp = Path(tmp_name)
        ensure_certificates(tmp, "gpupool-webhook", "gpupool-system", hosts=["127.0.0.1"])
        with simulator(args, tmp) as sim:
            api = sim.api()
            try:
                add_bench_pools(api)
                yield tmp, tls_context(tmp / "ca.crt"), sim, api
            finally:
                api.close()


@contextmanager
def servers(
    kind: type[ServerT],
    names: list[str],
    tmp: Path,
    sim: Simulator,
    *,
    options: list[str] | None = None,
    env: dict[str, dict[str, str]] | None = None,
    ready_timeout: float = 300.0,
    announce: bool = True,
) -> Iterator[list[ServerT]]:
    """Start one `gpupool serve` per name, one after the other (each waits for its first full list), each
    a `kind` (Server or a subclass); certificates and logs in `tmp`, `options` added to each command line,
    `env[name]` to its environment; `announce`: say when each is ready."""
    with ExitStack() as stack:
        started = []
        for name in names:
            port, health = free_port(), free_port()
            log = tmp / f"{name}.log"
            began = time.monotonic()
            argv = [*serve_argv(tmp, sim.kubeconfig, port, health), *(options or [])]
            proc = stack.enter_context(running(argv, health, log, ready_timeout, env=(env or {}).get(name)))
            if announce:
                print(f"{name}: ready (live inventory synced) in {time.monotonic() - began:.1f} s", flush=True)
            started.append(kind(name, proc, port, health, log))
        yield started


def read_log(
    log: Path, keep: int = 30, *, notable: Callable[[bytes, str], bool] | None = None, width: int = 400
) -> dict[str, Any]:
    """Lines per level of a server's log, and the first `keep` lines that are `notable` (given the line and
    its level; by default, those that are not admission lines), cut at `width` characters."""
    levels: Counter[str] = Counter()
    kept: list[str] = []
    with open(log, "rb") as f:
        for line in f:
            try:
                level = str(orjson.loads(line).get("level"))
            except orjson.JSONDecodeError:
                level = "not JSON"
            levels[level] += 1
            chosen = notable(line, level) if notable else b'"message":"admission"' not in line
            if chosen and len(kept) < keep:
                kept.append(line.decode(errors="replace").rstrip()[:width])
    return {"levels": dict(levels), "notable": kept}


# --- watch lag: how long until a server counts a Pod that was just created ----------------------------


class Prober:
    """Dry runs for the one-GPU probe pool on one server: does it still see the GPU free?"""

    def __init__(self, server: Server, context: ssl.SSLContext) -> None:
        self._conn = Connection(server.port, context)
        self.requests = 0

    def sees_taken(self) -> bool:
        uid = str(uuid.uuid4())
        pod = bench_pod(PROBE_NS, "probe-", PROBE_PRODUCT, generate=True)
        answer = read_answer(*self._conn.post(review_body(pod, uid, dry_run=True), DEADLINE_S), uid)
        self.requests += 1
        if answer.outcome != "mutated":
            raise RuntimeError(f"probe answered {answer.outcome}")
        return not answer.claimed

    def wait_until(self, taken: bool, timeout: float = 30.0) -> tuple[float, float]:
        """Ask until the answer flips; (send time of the last answer still unchanged, time of the
        first changed answer): the server counted the change in between."""
        last_unchanged = time.perf_counter()
        deadline = last_unchanged + timeout
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            if self.sees_taken() == taken:
                return last_unchanged, time.perf_counter()
            last_unchanged = sent
        raise TimeoutError(f"the server did not see the probe GPU {'taken' if taken else 'free'} in {timeout:g} s")

    def close(self) -> None:
        self._conn.close()


def watch_lag(prober: Prober, api: SimApi) -> dict[str, float]:
    """Create a Pod holding the probe pool's GPU (as kube-apiserver persists an admitted Pod) and time
    until the server counts it; then delete it and wait until the server sees the GPU free again."""
    prober.wait_until(taken=False)
    pod = bench_pod(PROBE_NS, "lag-", PROBE_PRODUCT, generate=True)
    pod["metadata"]["annotations"]["gpupool.io/pool"] = f"nvidia/medium/{PROBE_PRODUCT}"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": PROBE_PRODUCT}
    pod["status"] = {"phase": "Pending"}
    sent = time.perf_counter()
    created = api.create(pod)
    acked = time.perf_counter()
    low, high = prober.wait_until(taken=True)
    api.delete_pod(PROBE_NS, created["metadata"]["name"])
    prober.wait_until(taken=False)
    return {
        "create_ms": (acked - sent) * 1e3,
        "lag_ms": (high - acked) * 1e3,
        "lag_low_ms": max(0.0, low - acked) * 1e3,
    }


# --- part 1: the soak ---------------------------------------------------------------------------------


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


def soak(args: argparse.Namespace) -> int:
    env_note = f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    print(
        f"soak: {args.minutes:g} min at {args.rate:g} admissions/s over {args.connections} connections, "
        f"{args.events:g} Pod events/s, {args.nodes:,} nodes, {args.pods:,} Pods; {env_note}",
        flush=True,
    )
    with bench_cluster(args, "soak") as (tmp, context, sim, api):
        maker = RequestMaker(api.items("/api/v1/resourcequotas"), synthetic_namespaces(), args.seed)
        lock_stats = tmp / "lock-stats.json"
        if args.lock_stats:  # only the server started next imports bench/lockstats/sitecustomize.py
            hook = [str(REPO / "bench" / "lockstats"), *filter(None, [os.environ.get("PYTHONPATH")])]
            os.environ.update(PYTHONPATH=os.pathsep.join(hook), GPUPOOL_BENCH_LOCKSTATS=str(lock_stats))
        with servers(Server, ["server"], tmp, sim) as (server,):
            result = soak_run(args, server, sim=sim, api=api, maker=maker, context=context)
            result["server_log"] = read_log(server.log)
            if args.lock_stats:
                time.sleep(6)  # the worker writes them every 5 s
                result["lock_stats"] = json.loads(lock_stats.read_text())
            if args.keep_logs:
                RESULTS.mkdir(parents=True, exist_ok=True)
                shutil.copy(server.log, RESULTS / f"soak-{time.strftime('%Y%m%dT%H%M%S')}-server.log")
    result["churn"] = sim.churn  # its counts, printed when it stopped
    result["environment"] = env_note
    result["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    report_soak(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"soak-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out.relative_to(REPO)}")
    return 0 if result["goals_met"] else 1


def soak_run(
    args: argparse.Namespace,
    server: Server,
    *,
    sim: Simulator,
    api: SimApi,
    maker: RequestMaker,
    context: ssl.SSLContext,
) -> dict[str, Any]:
    create_queue: Any = multiprocessing.Queue()
    create_done: Any = multiprocessing.Queue()
    create_proc = multiprocessing.Process(target=creator, args=(sim.port, sim.token, create_queue, create_done))
    create_proc.start()
    assert create_proc.pid is not None
    meter = CpuMeter(
        {**server.pids(), "simulator": sim.proc.pid, "load generator": os.getpid(), "Pod creator": create_proc.pid}
    )
    rss_start = server.rss()
    metrics_start = scrape(server.health_port)
    rv_start, t_start = api.resource_version(), time.perf_counter()
    load = Load(server, context, maker, args, create_queue)
    lags: list[dict[str, float]] = []
    timeline: list[dict[str, Any]] = []
    stop = threading.Event()

    def observe() -> None:
        """Every 10 s: RSS, CPU, and (every 20 s) the watch lag; never on the load's connections."""
        prober, lag_api = Prober(server, context), sim.api()
        tick = 0
        while not stop.wait(10.0):
            tick += 1
            sample: dict[str, Any] = {"t_s": round(time.perf_counter() - t_start, 1), "rss_mb": server.rss()}
            sample["cpu_pct"] = {k: round(v, 1) for k, v in meter.read().items()}
            if tick % 2 == 0:
                try:
                    lags.append(watch_lag(prober, lag_api))
                    sample["watch_lag_ms"] = round(lags[-1]["lag_ms"], 2)
                except (TimeoutError, RuntimeError, OSError) as exc:
                    sample["watch_lag_error"] = str(exc)
            timeline.append(sample)
            print(
                f"  {sample['t_s']:>6.0f} s  done {len(load.outcomes):>7,}  RSS {sample['rss_mb']}  "
                f"CPU % {sample['cpu_pct']}  lag {sample.get('watch_lag_ms', '-')} ms",
                flush=True,
            )
        prober.close()
        lag_api.close()

    meter.reset()
    cpu_meter_total = CpuMeter(dict(meter.pids))
    cpu_meter_total.reset()
    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    load.run()
    elapsed = time.perf_counter() - load.start
    cpu_total = cpu_meter_total.read()
    stop.set()
    observer.join(60)
    create_queue.put(None)
    created: Counter[str] = Counter(create_done.get(timeout=300))
    create_proc.join(60)
    rv_end = api.resource_version()
    events_seconds = time.perf_counter() - t_start
    rss_end = server.rss()
    metrics_end = scrape(server.health_port)

    latencies = [(o.done - o.due) * 1e3 for o in load.outcomes]
    service = [(o.done - o.sent) * 1e3 for o in load.outcomes]
    queued = [(o.sent - o.due) * 1e3 for o in load.outcomes]
    errors = Counter(o.error for o in load.outcomes if o.error)
    per_shape: dict[str, dict[str, Any]] = {}
    for o in load.outcomes:
        entry = per_shape.setdefault(o.shape, {"n": 0, "outcomes": Counter()})
        entry["n"] += 1
        entry["outcomes"][o.result] += 1
    windows = []
    ordered = sorted(load.outcomes, key=lambda o: o.due)
    dues = [o.due for o in ordered]
    for w in range(int(args.minutes * 6)):
        lo = bisect.bisect_left(dues, load.start + w * 10)
        hi = bisect.bisect_left(dues, load.start + (w + 1) * 10)
        q = quantiles([(o.done - o.due) * 1e3 for o in ordered[lo:hi]])
        windows.append({"from_s": w * 10, **{k: round(v, 3) for k, v in q.items()}})
    rss_total_start, rss_total_end = sum(rss_start.values()), sum(rss_end.values())
    growth = rss_total_end / rss_total_start - 1
    lat = quantiles(latencies)
    writes = rv_end - rv_start
    churn_writes = writes - created["created"]
    hist_a = histogram(metrics_start, "gpupool_admission_duration_seconds")
    hist_b = histogram(metrics_end, "gpupool_admission_duration_seconds")
    result: dict[str, Any] = {
        "settings": {
            "minutes": args.minutes,
            "rate": args.rate,
            "events": args.events,
            "connections": args.connections,
            "max_connections": args.max_connections,
            "nodes": args.nodes,
            "pods": args.pods,
            "seed": args.seed,
            "deadline_s": DEADLINE_S,
            "server": "1 worker x 8 threads, log level info, live inventory",
        },
        "requests": len(load.outcomes),
        "admissions_per_s": len(load.outcomes) / elapsed,
        "latency_ms": lat,
        "service_ms": quantiles(service),
        "queued_ms": quantiles(queued),
        "client_dispatch_lag_ms": quantiles([x * 1e3 for x in load.dispatch_lag]),
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
        "error_examples": load.examples,
        "connections_opened": load.opened,
        "outcomes": dict(Counter(o.result for o in load.outcomes)),
        "per_shape": {k: {"n": v["n"], "outcomes": dict(v["outcomes"])} for k, v in per_shape.items()},
        "pods_created": dict(created),
        "pod_writes": writes,
        "pod_writes_per_s": writes / events_seconds,
        "churn_writes_per_s": churn_writes / events_seconds,
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
        "rss_growth": growth,
        "cpu_pct_average": {k: round(v, 1) for k, v in cpu_total.items()},
        "watch_lag_ms": quantiles([x["lag_ms"] for x in lags]),
        "watch_lag_samples": lags,
        "server_histogram": {
            f"p{int(q * 100)}_le_s": histogram_quantile(hist_a, hist_b, q) for q in (0.5, 0.99, 0.999)
        },
        "server_admissions": admissions_by_outcome(server.health_port),
        "server_reservations_end": gauge(metrics_end, "gpupool_reservations"),
        "per_10s": windows,
        "timeline": timeline,
    }
    result["goals"] = GOALS
    result["goals_met"] = lat["p99"] < GOALS["p99_ms"] and not errors and growth < GOALS["rss_growth"]
    return result


def report_soak(r: dict[str, Any]) -> None:
    lat, s = r["latency_ms"], r["settings"]
    worst = max(r["per_10s"], key=lambda w: w.get("p99", 0.0)) if r["per_10s"] else {}
    rows = [
        ("duration", f"{s['minutes']:g} min, {r['requests']:,} admissions"),
        ("admissions/s achieved (target)", f"{r['admissions_per_s']:.1f} ({s['rate']:g})"),
        (
            "Pod writes/s achieved: churn (target) / all",
            f"{r['churn_writes_per_s']:.0f} ({s['events']:g}) / {r['pod_writes_per_s']:.0f}",
        ),
        (
            "latency from due time p50 / p99 / p99.9 / max",
            f"{lat['p50']:.2f} / {lat['p99']:.2f} / {lat['p999']:.2f} / {lat['max']:.1f} ms",
        ),
        (
            "worst 10 s window p99 / max",
            f"{worst.get('p99', 0):.2f} / {worst.get('max', 0):.1f} ms at {worst.get('from_s')} s",
        ),
        (
            "server's own histogram p50 / p99 (bucket bound)",
            f"<= {r['server_histogram']['p50_le_s'] * 1e3:g} / <= {r['server_histogram']['p99_le_s'] * 1e3:g} ms",
        ),
        ("errors (non-200, malformed, wrong outcome, late)", f"{r['errors']} {r['errors_by_kind'] or ''}"),
        ("outcomes", ", ".join(f"{k} {v:,}" for k, v in sorted(r["outcomes"].items()))),
        ("admitted Pods created in the simulator", f"{r['pods_created'].get('created', 0):,}"),
        ("RSS master + worker, start (after sync)", _rss(r["rss_mb_start"])),
        ("RSS master + worker, end", _rss(r["rss_mb_end"])),
        ("RSS growth", f"{r['rss_growth'] * 100:+.1f} %"),
        (
            "watch lag p50 / max (probe)",
            f"{r['watch_lag_ms'].get('p50', float('nan')):.1f} / {r['watch_lag_ms'].get('max', float('nan')):.1f} ms",
        ),
        (
            "client: dispatch lag p99 / max",
            f"{r['client_dispatch_lag_ms']['p99']:.2f} / {r['client_dispatch_lag_ms']['max']:.1f} ms",
        ),
        ("CPU % of one core (average)", ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_pct_average"].items())),
    ]
    if "lock_stats" in r:
        wait, admit = r["lock_stats"]["lock_wait"], r["lock_stats"]["admit"]
        rows.append(
            (
                "inside the server: wait for the inventory lock / whole admit, p99 / max",
                f"{wait['p99_ms']:.2f} / {wait['max_ms']:.1f} ms, {admit['p99_ms']:.2f} / {admit['max_ms']:.1f} ms",
            )
        )
    print()
    print("| measure | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    met = r["goals_met"]
    print(
        f"\ngoals: p99 < {GOALS['p99_ms']:g} ms, 0 errors, RSS growth < {GOALS['rss_growth'] * 100:g} %: "
        f"{'met' if met else 'NOT MET'}"
    )


def _rss(rss: dict[str, float]) -> str:
    return " + ".join(f"{v:.0f}" for v in rss.values()) + f" = {sum(rss.values()):.0f} MB"


# --- part 2: two replicas, one burst ------------------------------------------------------------------


def burst_once(
    replicas: list[Server], context: ssl.SSLContext, sim: Simulator, number: int, per_replica_connections: int
) -> dict[str, Any]:
    """100 one-GPU Pods, interleaved between the replicas, each replica's share over its own
    connections, all started together; every admitted Pod created at once."""
    pods = [bench_pod(BURST_NS, f"burst-{number}-", BURST_PRODUCT, generate=True) for _ in range(2 * BURST_FREE)]
    lanes: list[list[int]] = [[] for _ in range(len(replicas) * per_replica_connections)]
    for i in range(len(pods)):
        replica = i % len(replicas)
        lanes[replica * per_replica_connections + (i // len(replicas)) % per_replica_connections].append(i)
    answers: dict[int, tuple[str, Answer, float, float]] = {}
    start = threading.Barrier(len(lanes) + 1)

    def lane(index: int, items: list[int]) -> None:
        server = replicas[index // per_replica_connections]
        conn, api = Connection(server.port, context), sim.api()
        conn.connect()  # and the TLS handshake, before the burst
        start.wait()
        for i in items:
            uid = str(uuid.uuid4())
            sent = time.perf_counter()
            answer = read_answer(*conn.post(review_body(pods[i], uid, dry_run=False), DEADLINE_S), uid)
            answered = time.perf_counter()
            answers[i] = (server.name, answer, sent, answered)
            if answer.outcome == "mutated":
                api.create(persisted(pods[i], answer.patch))
        conn.close()
        api.close()

    threads = [threading.Thread(target=lane, args=(n, items)) for n, items in enumerate(lanes)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join(120)
    took = time.perf_counter() - began
    claimed = Counter(name for name, a, _, _ in answers.values() if a.claimed)
    outcomes = Counter(a.outcome for _, a, _, _ in answers.values())
    return {
        "burst_ms": took * 1e3,
        "answered": len(answers),
        "outcomes": dict(outcomes),
        "claimed_by_replica": dict(claimed),
        "claimed": sum(claimed.values()),
        "beyond_capacity": max(0, sum(claimed.values()) - BURST_FREE),
        "warned_will_wait": sum(1 for _, a, _, _ in answers.values() if a.outcome == "mutated" and not a.claimed),
    }


def reset_burst_pool(replicas: list[Server], api: SimApi, timeout: float = 60.0) -> None:
    """Delete the burst's Pods; wait until both replicas report the 50 GPUs free and nothing reserved."""
    for pod in api.items(f"/api/v1/namespaces/{BURST_NS}/pods"):
        if pod["metadata"]["name"].startswith("burst-"):
            api.delete_pod(BURST_NS, pod["metadata"]["name"])
    pool = f"nvidia/medium/{BURST_PRODUCT}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        texts = [scrape(r.health_port) for r in replicas]
        if all(
            gauge(t, "gpupool_pool_gpus_free", pool) == BURST_FREE and gauge(t, "gpupool_reservations") == 0
            for t in texts
        ):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the replicas do not report {BURST_FREE} free GPUs in {pool}")


def window_once(
    replicas: list[Server], probers: list[Prober], context: ssl.SSLContext, api: SimApi, first: int
) -> dict[str, float]:
    """A real admission on one replica takes the probe pool's only GPU; the Pod is created; time until
    the other replica counts it."""
    admitting, other = replicas[first], probers[1 - first]
    for p in probers:
        p.wait_until(taken=False)
    conn = Connection(admitting.port, context)
    conn.connect()  # beforehand, as kube-apiserver's connections are
    pod = bench_pod(PROBE_NS, "window-", PROBE_PRODUCT, generate=True)
    uid = str(uuid.uuid4())
    sent = time.perf_counter()
    answer = read_answer(*conn.post(review_body(pod, uid, dry_run=False), DEADLINE_S), uid)
    answered = time.perf_counter()
    conn.close()
    if not answer.claimed:
        raise RuntimeError(f"the admission did not claim the probe GPU: {answer}")
    created = api.create(persisted(pod, answer.patch))
    acked = time.perf_counter()
    low, high = other.wait_until(taken=True)
    api.delete_pod(PROBE_NS, created["metadata"]["name"])
    return {
        "from": admitting.name,
        "admission_ms": (answered - sent) * 1e3,
        "create_ms": (acked - answered) * 1e3,
        "window_ms": (high - answered) * 1e3,  # admission answered -> the other replica counts the Pod
        "window_low_ms": max(0.0, low - answered) * 1e3,
        "watch_ms": (high - acked) * 1e3,  # Pod stored -> the other replica counts it
    }


def replicas_burst(args: argparse.Namespace) -> int:
    env_note = f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    print(
        f"two replicas: {args.bursts} bursts of {2 * BURST_FREE} Pods for {BURST_FREE} free GPUs, "
        f"{args.probes} window probes; {args.events:g} Pod events/s, {args.nodes:,} nodes, {args.pods:,} Pods; "
        f"{env_note}",
        flush=True,
    )
    bursts, windows = [], []
    with (
        bench_cluster(args, "burst") as (tmp, context, sim, api),
        servers(Server, ["replica-a", "replica-b"], tmp, sim) as replicas,
    ):
        reset_burst_pool(replicas, api)
        for n in range(args.bursts):
            bursts.append(burst_once(replicas, context, sim, n, args.burst_connections))
            b = bursts[-1]
            print(
                f"  burst {n}: {b['burst_ms']:.0f} ms, claimed {b['claimed']} "
                f"{b['claimed_by_replica']}, beyond capacity {b['beyond_capacity']}",
                flush=True,
            )
            time.sleep(2.0)  # let the churn bind what fits, for the record below
            pods = api.items(f"/api/v1/namespaces/{BURST_NS}/pods")
            mine = [p for p in pods if p["metadata"]["name"].startswith(f"burst-{n}-")]
            b["bound_after_2s"] = sum(1 for p in mine if p["spec"].get("nodeName"))
            b["pending_after_2s"] = len(mine) - b["bound_after_2s"]
            reset_burst_pool(replicas, api)
        probers = [Prober(r, context) for r in replicas]
        for n in range(args.probes):
            windows.append(window_once(replicas, probers, context, api, n % 2))
        for p in probers:
            p.close()
    beyond = [b["beyond_capacity"] for b in bursts]
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "environment": env_note,
        "settings": {
            "bursts": args.bursts,
            "probes": args.probes,
            "events": args.events,
            "nodes": args.nodes,
            "pods": args.pods,
            "free_gpus": BURST_FREE,
            "pods_per_burst": 2 * BURST_FREE,
            "connections_per_replica": args.burst_connections,
        },
        "bursts": bursts,
        "beyond_capacity": {"min": min(beyond), "median": statistics.median(beyond), "max": max(beyond)},
        "window_ms": quantiles([w["window_ms"] for w in windows]),
        "watch_ms": quantiles([w["watch_ms"] for w in windows]),
        "create_ms": quantiles([w["create_ms"] for w in windows]),
        "windows": windows,
        "churn": sim.churn,
    }
    w, ws = result["window_ms"], result["watch_ms"]
    print()
    print("| measure | value |")
    print("|---|---|")
    print(
        f"| Pods placed beyond the {BURST_FREE} free GPUs, per burst of {2 * BURST_FREE} | "
        f"{', '.join(map(str, beyond))} (median {statistics.median(beyond):g}) |"
    )
    print(f"| burst duration, median | {statistics.median(b['burst_ms'] for b in bursts):.0f} ms |")
    print(
        f"| window: admission answered on one replica -> counted by the other, p50 / p90 / max | "
        f"{w['p50']:.1f} / {w['p90']:.1f} / {w['max']:.1f} ms |"
    )
    print(
        f"| of which Pod stored -> counted by the other replica's watch, p50 / p90 / max | "
        f"{ws['p50']:.1f} / {ws['p90']:.1f} / {ws['max']:.1f} ms |"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"burst-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out.relative_to(REPO)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="soak duration (default 10)")
    parser.add_argument("--rate", type=float, default=300.0, help="admissions per second (default 300)")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive TLS connections (default 4)")
    parser.add_argument(
        "--max-connections", type=int, default=32, help="more are opened when all are busy, up to this (default 32)"
    )
    parser.add_argument("--events", type=float, default=1000.0, help="the simulator's Pod writes/s (default 1000)")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-logs", action="store_true", help="copy the server's log to bench/results/")
    parser.add_argument(
        "--lock-stats", action="store_true", help="time the inventory lock inside the server (a diagnostic)"
    )
    parser.add_argument("--replicas-burst", action="store_true", help="two replicas, one burst (part 2)")
    parser.add_argument("--bursts", type=int, default=5, help="bursts in --replicas-burst (default 5)")
    parser.add_argument("--burst-connections", type=int, default=2, help="connections per replica (default 2)")
    parser.add_argument("--probes", type=int, default=40, help="window measurements in --replicas-burst")
    args = parser.parse_args()
    return replicas_burst(args) if args.replicas_burst else soak(args)


if __name__ == "__main__":
    sys.exit(main())
