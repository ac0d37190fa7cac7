"""Benchmark: POST /mutate with a full decision against a raw WSGI no-op on stock gunicorn gthread.

Starts six servers on the same gunicorn settings (`webhook.serving.server.serve`, TLS, keep-alive), all
but one on gpupool's worker:
- a no-op: the same Flask app setup whose /mutate route only reads the body and returns a constant
  AdmissionReview;
- the same no-op answered by a thin WSGI entry in front of Flask, the shortcut gpupool's /mutate takes;
- a raw WSGI no-op (no Flask at all), on gpupool's worker and on gunicorn's stock gthread worker: the
  difference is what gpupool's HTTP layer (webhook.serving.worker and its parser) costs; the one on
  stock gthread is the goals' baseline (P50_LIMIT, THROUGHPUT_LIMIT and the NEW_ ones);
- gpupool's app with the core's answer computed once (what gpupool's HTTP layer costs alone);
- the real `gpupool serve` on the demo inventory, measured twice: sending one Pod again and again (its
  shape is remembered after the first), and cycling through 5,000 Pods of distinct shapes (nothing is
  remembered: the cost of a Pod unlike any recent one).
Then, alternating between them for several rounds (the median is reported, so a noisy neighbour hits
all alike):
- latency p50/p99 with 1 keep-alive TLS connection,
- throughput with 4 keep-alive TLS connections.
The client is `wrk` when installed (C, epoll: it needs far less CPU than the server), else a Python
client with one process per connection.

    .venv/bin/python bench/bench_server.py [--duration 5] [--rounds 3] [--workers 1] [--threads 4]

Results are printed as a table and written to bench/results/server-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import platform
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flask import Flask, Response, request

from webhook.admission.core import Admitter
from webhook.domain.policy import load_policy
from webhook.serving.certs import ensure_certificates
from webhook.serving.review import parse_review, pod_ref
from webhook.serving.server import ServeOptions, WorkerApp, serve
from webhook.sources.snapshot import SnapshotInventory

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DEMO_INVENTORY = REPO / "examples" / "cluster.yaml"
SAMPLE_REVIEW = REPO / "examples" / "admissionreview.json"
PATH = "/mutate?timeout=10s"
# The goals (issue 22), against the raw WSGI no-op on stock gunicorn gthread with the same workers and
# threads, measured in the same rounds: one Pod shape, and every Pod a new shape.
P50_LIMIT, THROUGHPUT_LIMIT = 1.25, 0.8
NEW_P50_LIMIT, NEW_THROUGHPUT_LIMIT = 1.5, 0.6
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


# --- the no-op server (runs in its own process) -------------------------------------------------------


def noop_server(args: argparse.Namespace) -> int:
    """gpupool's gunicorn settings and Flask, with a /mutate that does nothing but read and answer."""
    answer = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "", "allowed": True}}
    ).encode()

    def raw(environ: dict[str, Any], start_response: Any) -> Any:
        environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))])
        return [answer]

    def load() -> WorkerApp:
        from webhook.serving.metrics import Metrics

        Metrics.private().inventory_ready.set(1)
        if args.raw:
            return WorkerApp(raw)
        app = Flask("noop")

        @app.post("/mutate")
        def mutate() -> Response:
            request.get_data()
            return Response(answer, 200, mimetype="application/json")

        if args.thin:
            # The same shortcut gpupool's app takes (webhook/serving/app.py): POST /mutate is answered by a
            # middleware before Flask's dispatch; everything else still goes through Flask.
            flask_app = app.wsgi_app

            def thin(environ: dict[str, Any], start_response: Any) -> Any:
                if environ.get("PATH_INFO") == "/mutate" and environ.get("REQUEST_METHOD") == "POST":
                    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                    start_response("200 OK", [("Content-Type", "application/json"),
                                              ("Content-Length", str(len(answer)))])  # fmt: skip
                    return [answer]
                return flask_app(environ, start_response)

            app.wsgi_app = thin  # type: ignore[method-assign]
        return WorkerApp(app)

    options = ServeOptions(
        cert=args.cert, key=args.key, inventory=None, policy=None, host="127.0.0.1", port=args.port,
        health_port=args.health_port, workers=args.workers, threads=args.threads, log_level="warning",
        **({"worker_class": "gthread"} if args.gthread else {}),
    )  # fmt: skip
    return serve(options, load)


def stub_server(args: argparse.Namespace) -> int:
    """The real app and settings with the core's answer computed once: what gpupool's layer costs alone."""
    policy = load_policy(None)
    review = parse_review(Path(args.body).read_bytes())
    assert review.object is not None
    verdict = Admitter(policy, SnapshotInventory.from_file(str(DEMO_INVENTORY), policy)).admit(
        review.object, namespace=pod_ref(review).namespace, dry_run=True
    )

    class Precomputed:
        def admit(self, pod: Any, *, namespace: str, dry_run: bool = False) -> Any:
            return verdict

    def load() -> WorkerApp:
        # After serve() set PROMETHEUS_MULTIPROC_DIR, like webhook.serving.server's own loader.
        from webhook.serving.app import AppConfig, create_app
        from webhook.serving.metrics import Metrics

        metrics = Metrics.private()
        metrics.inventory_ready.set(1)
        return WorkerApp(create_app(AppConfig(admitter=Precomputed(), metrics=metrics)))

    options = ServeOptions(
        cert=args.cert, key=args.key, inventory=None, policy=None, host="127.0.0.1", port=args.port,
        health_port=args.health_port, workers=args.workers, threads=args.threads, log_level=args.log_level,
    )  # fmt: skip
    return serve(options, load)


# --- servers ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready(health_port: int) -> bool:
    """Whether a server's /readyz answers 200 (not when it cannot be reached)."""
    conn = http.client.HTTPConnection("127.0.0.1", health_port, timeout=5)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        response.read()  # closing with the body unread would reset the connection
        return response.status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextmanager
def running(
    argv: list[str],
    health_port: int,
    log: Path,
    ready_timeout: float = 60.0,
    *,
    tree: Path = REPO,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a server (gpupool's code from `tree`, `env` added to the environment), wait for its /readyz,
    yield its process; SIGTERM (then SIGKILL) at the end."""
    full_env = {**os.environ, **(env or {})}
    if tree != REPO:
        full_env["PYTHONPATH"] = str(tree)
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tree, env=full_env)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}; see {log}")
            if ready(health_port):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"server not ready after {ready_timeout:g} s; see {log}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- clients ------------------------------------------------------------------------------------------


def read_bodies(body_file: Path) -> list[bytes]:
    """The request bodies to send in turn: one per line of a .jsonl file, else the whole file."""
    data = body_file.read_bytes()
    return data.splitlines() if body_file.suffix == ".jsonl" else [data]


def wrk_run(port: int, body_file: Path, connections: int, seconds: float) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, requests/s) from wrk over keep-alive TLS, sending the bodies of `body_file` in turn."""
    script = body_file.with_suffix(".lua")
    head = 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
    if body_file.suffix == ".jsonl":
        script.write_text(
            f'{head}local bodies, i = {{}}, 0\nfor line in io.lines("{body_file}") do bodies[#bodies + 1] = line end\n'
            "request = function()\n  i = i % #bodies + 1\n  return wrk.format(nil, nil, nil, bodies[i])\nend\n"
        )
    else:
        script.write_text(f'{head}local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*a")\nf:close()\n')
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script),
         f"https://127.0.0.1:{port}{PATH}"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    if re.search(r"Non-2xx or 3xx responses|Socket errors", out):
        raise SystemExit(f"wrk saw errors:\n{out}")

    def latency(pct: str) -> float:
        match = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert match, out
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[match.group(2)]
        return float(match.group(1)) * scale

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert rps, out
    return latency("50"), latency("99"), float(rps.group(1))


def _python_client(port: int, ca: str, bodies: list[bytes], seconds: float, queue: Any) -> None:
    ctx = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx)
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    end = time.perf_counter() + seconds
    while (start := time.perf_counter()) < end:
        conn.request("POST", PATH, body=bodies[len(latencies) % len(bodies)], headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"HTTP {resp.status}")
        latencies.append(time.perf_counter() - start)
    conn.close()
    queue.put(latencies)


def python_run(
    port: int, ca: Path, bodies: list[bytes], connections: int, seconds: float
) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, requests/s) with one client process per keep-alive TLS connection."""
    queue: Any = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(target=_python_client, args=(port, str(ca), bodies, seconds, queue))
        for _ in range(connections)
    ]
    for p in procs:
        p.start()
    latencies = sorted(x for _ in procs for x in queue.get(timeout=seconds + 60))
    for p in procs:
        p.join()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    return p50, p99, len(latencies) / seconds


# --- the benchmark ------------------------------------------------------------------------------------


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


def bench(args: argparse.Namespace) -> int:
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
        this = str(Path(__file__).resolve())

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

    result = {name: median(s) for name, s in samples.items()}
    gthread = result["noop_gthread"]
    print()
    print(
        "| handler | p50 (1 conn) | p99 (1 conn) | req/s (1 conn) | req/s (4 conns) | p50 / gthread no-op "
        "| req/s (4) / gthread no-op | p50 / Flask no-op | req/s (4) / Flask no-op |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    noop, thin = result["noop"], result["noop_thin"]
    for name, m in result.items():
        print(
            f"| {servers[name]} | {m.p50_ms:.3f} ms | {m.p99_ms:.3f} ms | {m.rps_1:,.0f} | {m.rps_4:,.0f} | "
            f"{m.p50_ms / gthread.p50_ms:.2f}x | {m.rps_4 / gthread.rps_4:.2f}x | "
            f"{m.p50_ms / noop.p50_ms:.2f}x | {m.rps_4 / noop.rps_4:.2f}x |"
        )
    mutate, new = result["mutate"], result["mutate_new"]
    p50_ratio, rps_ratio = mutate.p50_ms / gthread.p50_ms, mutate.rps_4 / gthread.rps_4
    new_p50, new_rps = new.p50_ms / gthread.p50_ms, new.rps_4 / gthread.rps_4
    print(
        f"\ngoals against the raw WSGI no-op on stock gthread: one Pod shape p50 <= {P50_LIMIT}x, throughput >= "
        f"{THROUGHPUT_LIMIT}x; every Pod a new shape p50 <= {NEW_P50_LIMIT}x, throughput >= {NEW_THROUGHPUT_LIMIT}x"
    )
    print(f"one Pod shape: {p50_ratio:.2f}x the p50, {rps_ratio:.2f}x the throughput")
    print(f"every Pod a new shape: {new_p50:.2f}x the p50, {new_rps:.2f}x the throughput")
    raw = result["noop_raw"]
    print(
        f"gpupool's worker against stock gthread, raw WSGI no-op: {raw.p50_ms / gthread.p50_ms:.2f}x the p50, "
        f"{raw.rps_4 / gthread.rps_4:.2f}x the throughput; /mutate against the Flask no-op: "
        f"{mutate.p50_ms / noop.p50_ms:.2f}x, {mutate.rps_4 / noop.rps_4:.2f}x; against the thin no-op: "
        f"{mutate.p50_ms / thin.p50_ms:.2f}x, {mutate.rps_4 / thin.rps_4:.2f}x"
    )
    if args.against:
        for name in AGAINST:
            now, then = result[name], result[f"{name}_before"]
            print(
                f"{servers[name]}: {now.p50_ms / then.p50_ms:.2f}x the p50, {now.rps_4 / then.rps_4:.2f}x the "
                f"throughput of the same on {args.against}"
            )
    print(f"\noutcomes of the real server's admissions: {outcomes}")
    one_ok = p50_ratio <= P50_LIMIT and rps_ratio >= THROUGHPUT_LIMIT
    new_ok = new_p50 <= NEW_P50_LIMIT and new_rps >= NEW_THROUGHPUT_LIMIT
    ok = one_ok and new_ok
    print(f"one Pod shape: {'met' if one_ok else 'MISSED'}; every Pod a new shape: {'met' if new_ok else 'MISSED'}")
    thin_p50, thin_rps = mutate.p50_ms / thin.p50_ms, mutate.rps_4 / thin.rps_4

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"server-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "environment": env_note,
        "settings": {"workers": args.workers, "threads": args.threads, "duration_s": args.duration,
                     "rounds": args.rounds, "log_level": args.log_level},
        "servers": servers, "against": args.against, "median": {k: asdict(v) for k, v in result.items()},
        "rounds": {k: [asdict(m) for m in v] for k, v in samples.items()},
        "baseline": "noop_gthread", "p50_ratio": p50_ratio, "throughput_ratio": rps_ratio,
        "new_shapes_p50_ratio": new_p50, "new_shapes_throughput_ratio": new_rps, "targets_met": ok,
        "outcomes": outcomes, "load_average": os.getloadavg(),
        "flask_noop_p50_ratio": mutate.p50_ms / noop.p50_ms, "flask_noop_throughput_ratio": mutate.rps_4 / noop.rps_4,
        "thin_p50_ratio": thin_p50, "thin_throughput_ratio": thin_rps,
        "worker_vs_gthread": {"p50": raw.p50_ms / gthread.p50_ms, "throughput": raw.rps_4 / gthread.rps_4},
        "new_shapes": NEW_SHAPES,
    }, indent=2))  # fmt: skip
    print(f"written to {out.relative_to(REPO)}")
    return 1 if args.check and not ok else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode")
    noop = sub.add_parser("noop-server", help=argparse.SUPPRESS)
    stub = sub.add_parser("stub-server", help=argparse.SUPPRESS)
    stub.add_argument("--body", required=True)
    noop.add_argument("--thin", action="store_true")
    noop.add_argument("--raw", action="store_true", help="a WSGI callable, no Flask")
    noop.add_argument("--gthread", action="store_true", help="gunicorn's own gthread worker")
    for p in (parser, noop, stub):
        p.add_argument("--workers", type=int, default=1)
        p.add_argument("--threads", type=int, default=4)
        p.add_argument("--log-level", default="info", help="gpupool's log level (default info)")
    for p in (noop, stub):
        p.add_argument("--cert", required=True)
        p.add_argument("--key", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--health-port", type=int, required=True)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per server (default 3)")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--check", action="store_true", help="exit 1 when the targets are missed")
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="also measure the raw no-op and /mutate on the code of another checkout (say, main before a change)",
    )
    args = parser.parse_args()
    if args.mode == "noop-server":
        return noop_server(args)
    if args.mode == "stub-server":
        return stub_server(args)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
