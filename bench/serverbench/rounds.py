"""The servers bench_server.py measures, and its rounds: every server started, then measured in turn, round after
round (a noisy neighbour hits all alike)."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.serverbench.clients import python_run, read_bodies, wrk_run
from bench.serverbench.launch import DEMO_INVENTORY, REPO, SAMPLE_REVIEW, free_port, running
from webhook.serving.certs import ensure_certificates

# The script the no-op and stub servers run as (its hidden subcommands noop-server and stub-server).
ENTRY = REPO / "bench" / "bench_server.py"


SERVERS = {  # measured in this order in every round
    "noop": "no-op handler",
    "noop_thin": "no-op behind a thin WSGI entry, like gpupool's",
    "noop_raw": "raw WSGI no-op, gpupool's worker",
    "noop_gthread": "raw WSGI no-op, stock gunicorn gthread",
    "layer": "gpupool app, core answer precomputed",
    "mutate": "/mutate, full decision (demo inventory)",
    "mutate_new": "/mutate, full decision, every Pod a new shape",
}
SAME_SERVER = {"mutate_new": "mutate"}  # measured on another server, with other request bodies
AGAINST = ("noop_raw", "mutate", "mutate_new")  # measured on another checkout's code too with --against
NEW_SHAPES = 5000  # distinct Pod shapes, cycled: more than the shape memo holds, so every request misses

# Used when examples/admissionreview.json is not there: a Pod asking for 20Gi per GPU.
FALLBACK_REVIEW: dict[str, Any] = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "bench-0000",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "ml-train",
        "userInfo": {"username": "bench"},
        "object": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bench", "annotations": {"gpupool.io/min-memory": "20Gi"}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/train:1.0"}]},
        },
        "dryRun": False,
    },
}


@dataclass(frozen=True)
class Measure:
    p50_ms: float
    p99_ms: float
    rps_1: float
    rps_4: float


def shape_variants(body_file: Path, count: int) -> list[dict[str, Any]]:
    """`count` copies of the review whose Pods differ in gpupool.io/min-memory (1,000 to 5,999 MiB, which
    every medium GPU of the demo has), so no two share a shape (webhook.admission.pod.PodShape); each has
    its own uid."""
    review = json.loads(body_file.read_text())
    variants = []
    for i in range(count):
        copy = json.loads(json.dumps(review))
        copy["request"]["uid"] = f"bench-{i:05d}"
        copy["request"]["object"]["metadata"].setdefault("annotations", {})["gpupool.io/min-memory"] = f"{1000 + i}Mi"
        variants.append(copy)
    return variants


def measure(client: str, port: int, ca: Path, body_file: Path, seconds: float) -> Measure:
    def run(connections: int, duration: float) -> tuple[float, float, float]:
        if client == "wrk":
            return wrk_run(port, body_file, connections, duration)
        return python_run(port, ca, read_bodies(body_file), connections, duration)

    run(1, 1)  # warm-up: connection, caches, the Pool reservations' steady state
    p50, p99, rps_1 = run(1, seconds)
    _, _, rps_4 = run(4, seconds)
    return Measure(p50, p99, rps_1, rps_4)


def median(samples: list[Measure]) -> Measure:
    return Measure(*(statistics.median(getattr(m, f) for m in samples) for f in ("p50_ms", "p99_ms", "rps_1", "rps_4")))


def admissions_by_outcome(health_port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", health_port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    outcomes: dict[str, float] = {}
    for match in re.finditer(r'^gpupool_admissions_total\{outcome="(\w+)",pool="[^"]*"\} ([\d.e+]+)$', text, re.M):
        outcomes[match.group(1)] = outcomes.get(match.group(1), 0) + float(match.group(2))
    return outcomes


@dataclass(frozen=True)
class Rounds:
    """What the rounds measured: the servers by name (with what each is), each one's measures round by round,
    the real server's admissions by outcome, and the environment (Python, CPUs, client)."""

    servers: dict[str, str]
    samples: dict[str, list[Measure]]
    outcomes: dict[str, float]
    env_note: str


def run_rounds(args: argparse.Namespace) -> Rounds:
    """Start every server (and with --against, the same few on another checkout's code), then measure each in
    turn for `args.rounds` rounds."""
    client = args.client if args.client != "auto" else ("wrk" if shutil.which("wrk") else "python")
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp_name:
        tmp = Path(tmp_name)
        ensure_certificates(tmp, "gpupool-webhook", "gpupool-system", hosts=["127.0.0.1"])
        body_file = tmp / "review.json"
        if SAMPLE_REVIEW.exists():
            shutil.copy(SAMPLE_REVIEW, body_file)
        else:
            body_file.write_text(json.dumps(FALLBACK_REVIEW))
        new_shapes = tmp / "new-shapes.jsonl"
        new_shapes.write_bytes(b"\n".join(json.dumps(b).encode() for b in shape_variants(body_file, NEW_SHAPES)))
        servers = dict(SERVERS)
        if args.against:  # the same two servers on the code of another checkout, in the same rounds
            servers.update({f"{name}_before": f"{servers[name]}, {args.against}" for name in AGAINST})
        same = {**SAME_SERVER, **{f"{a}_before": f"{b}_before" for a, b in SAME_SERVER.items()}}
        bodies = {name: new_shapes if name.startswith("mutate_new") else body_file for name in servers}
        ports = {name: (free_port(), free_port()) for name in servers if name not in same}
        ports.update({name: ports[other] for name, other in same.items() if name in servers})
        common = ["--cert", str(tmp / "tls.crt"), "--key", str(tmp / "tls.key"),
                  "--workers", str(args.workers), "--threads", str(args.threads)]  # fmt: skip
        this = str(ENTRY)

        def server_argv(kind: str, port: int, health_port: int) -> list[str]:
            listen = ["--port", str(port), "--health-port", str(health_port)]
            return {
                "mutate": [sys.executable, "-m", "webhook", "serve", *common, "--inventory", str(DEMO_INVENTORY),
                           "--host", "127.0.0.1", *listen, "--log-level", args.log_level],
                "noop": [sys.executable, this, "noop-server", *common, *listen],
                "noop_thin": [sys.executable, this, "noop-server", "--thin", *common, *listen],
                "noop_raw": [sys.executable, this, "noop-server", "--raw", *common, *listen],
                "noop_gthread": [sys.executable, this, "noop-server", "--raw", "--gthread", *common, *listen],
                "layer": [sys.executable, this, "stub-server", *common, *listen, "--body", str(body_file),
                          "--log-level", args.log_level],
            }[kind]  # fmt: skip

        argv = {name: server_argv(name, *ports[name]) for name in SERVERS if name not in SAME_SERVER}
        trees = dict.fromkeys(argv, REPO)
        for name in [n for n in AGAINST if n not in SAME_SERVER] if args.against else []:
            argv[f"{name}_before"] = server_argv(name, *ports[f"{name}_before"])
            trees[f"{name}_before"] = Path(args.against).resolve()
        samples: dict[str, list[Measure]] = {name: [] for name in servers}
        env_note = f"{platform.python_version()}, {os.cpu_count()} CPUs, client {client}"
        print(f"gpupool server benchmark: {args.rounds} rounds x {args.duration:g} s, workers {args.workers}, "
              f"threads {args.threads}, {env_note}", flush=True)  # fmt: skip
        with contextlib.ExitStack() as stack:
            for name, command in argv.items():
                stack.enter_context(running(command, ports[name][1], tmp / f"{name}.log", tree=trees[name]))
            for round_no in range(1, args.rounds + 1):
                for name in servers:
                    m = measure(client, ports[name][0], tmp / "ca.crt", bodies[name], args.duration)
                    samples[name].append(m)
                    print(f"  round {round_no} {name:6} p50 {m.p50_ms:.3f} ms  p99 {m.p99_ms:.3f} ms  "
                          f"{m.rps_1:,.0f} req/s (1 conn)  {m.rps_4:,.0f} req/s (4 conns)", flush=True)  # fmt: skip
            outcomes = admissions_by_outcome(ports["mutate"][1])

    return Rounds(servers, samples, outcomes, env_note)
