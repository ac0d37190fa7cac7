"""Benchmark: admissions from a new client while slow clients hold 1,000 connections of the server.

Starts the real `gpupool serve` on the demo inventory (1 worker x 4 threads, as shipped) and measures
one keep-alive TLS client sending `examples/admissionreview.json` back to back for `--duration`
seconds, with a 10 s timeout per request (kube-apiserver's for a webhook call): latency p50, p99 and
max, and the requests lost (timed out or failed). It does so without attackers, then with `--count`
connections of each kind of webhook.testing.slow_clients (idle TCP, idle after the TLS handshake,
half-open TLS, a head dripped one byte a second, a body dripped one byte a second), then with all
five kinds at once, and repeats that for `--rounds` rounds (medians are reported). The attackers run
in processes of their own and open a new connection for each one the server closes, so the count
stays up for the whole measurement.

    .venv/bin/python bench/bench_slow_clients.py [--count 1000] [--duration 10] [--rounds 3]

Results are printed as a table and written to bench/results/slow-clients-<time>.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's packages

from bench.serverbench.launch import DEMO_INVENTORY, PATH, REPO, RESULTS, SAMPLE_REVIEW, free_port, running
from webhook.serving.certs import ensure_certificates
from webhook.testing.slow_clients import KINDS, SlowClients

SERVER_NAME = "127.0.0.1"
TIMEOUT = 10.0  # kube-apiserver's timeout for a webhook call
SCENARIOS = ("none", *KINDS, "all")


@dataclass(frozen=True)
class Measure:
    requests: int
    lost: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    attackers_open: int  # attacker connections open, on average over the measurement
    worker_rss_mb: float


def attack(port: int, ca: str, kind: str, count: int, *, measuring: Any, stop: Any, opened: Any) -> None:  # noqa: PLR0913 (a benchmark child process's entry: its options from the parent)
    """In its own process: keep `count` slow connections of `kind` open until `stop` is set. `opened`
    holds how many are open: the latest count until `measuring` is set, then the mean since."""
    context = ssl.create_default_context(cafile=ca)
    samples: list[int] = []
    with SlowClients(port, context, SERVER_NAME, keep=True) as slow:
        slow.open(kind, count)
        while not stop.wait(0.2):
            now = slow.open_counts()[kind]
            if measuring.is_set():
                samples.append(now)
            opened.value = statistics.mean(samples) if samples else now


def admissions(port: int, ca: Path, body: bytes, seconds: float) -> tuple[list[float], int]:
    """Latencies (s) of the answered requests and the number lost, one keep-alive client back to back."""
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(SERVER_NAME, port, context=context, timeout=TIMEOUT)
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    lost = 0
    end = time.perf_counter() + seconds
    while (start := time.perf_counter()) < end:
        try:
            conn.request("POST", PATH, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise SystemExit(f"HTTP {resp.status}")
            latencies.append(time.perf_counter() - start)
        except (OSError, http.client.HTTPException):  # timed out, refused or reset: lost, then reconnect
            lost += 1
            conn.close()
    conn.close()
    return latencies, lost


def worker_rss_mb(health_port: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", health_port, timeout=10)
    conn.request("GET", "/readyz")
    (pid,) = json.loads(conn.getresponse().read())["workers"]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(args: argparse.Namespace, scenario: str, port: int, health_port: int, tmp: Path) -> Measure:
    kinds = KINDS if scenario == "all" else () if scenario == "none" else (scenario,)
    measuring, stop = multiprocessing.Event(), multiprocessing.Event()
    opened = {kind: multiprocessing.Value("d", 0.0) for kind in kinds}
    procs = [
        multiprocessing.Process(
            target=attack,
            args=(port, str(tmp / "ca.crt"), k, args.count),
            kwargs={"measuring": measuring, "stop": stop, "opened": opened[k]},
        )
        for k in kinds
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 60
        while any(v.value < args.count * 0.9 for v in opened.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        measuring.set()
        latencies, lost = admissions(port, tmp / "ca.crt", SAMPLE_REVIEW.read_bytes(), args.duration)
        rss = worker_rss_mb(health_port)
        attackers_open = round(sum(v.value for v in opened.values()))
    finally:
        stop.set()
        for p in procs:
            p.join(60)
    latencies.sort()
    ms = [x * 1000 for x in latencies] or [float("nan")]
    return Measure(
        len(latencies) + lost, lost, ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.99))], ms[-1],
        attackers_open, rss,
    )  # fmt: skip


def bench(args: argparse.Namespace) -> int:
    samples: dict[str, list[Measure]] = {s: [] for s in SCENARIOS}
    env_note = f"{platform.python_version()}, {os.cpu_count()} CPUs"
    print(f"gpupool slow-client benchmark: {args.count} connections per kind, {args.rounds} rounds x "
          f"{args.duration:g} s, {env_note}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp_name:
        tmp = Path(tmp_name)
        ensure_certificates(tmp, "gpupool-webhook", "gpupool-system", hosts=[SERVER_NAME])
        port, health_port = free_port(), free_port()
        argv = [sys.executable, "-m", "webhook", "serve", "--cert", str(tmp / "tls.crt"), "--key",
                str(tmp / "tls.key"), "--inventory", str(DEMO_INVENTORY), "--host", "127.0.0.1",
                "--port", str(port), "--health-port", str(health_port)]  # fmt: skip
        with running(argv, health_port, tmp / "server.log"):
            for round_no in range(1, args.rounds + 1):
                for scenario in SCENARIOS:
                    m = measure(args, scenario, port, health_port, tmp)
                    samples[scenario].append(m)
                    print(f"  round {round_no} {scenario:13} {m.requests:6,} requests  lost {m.lost}  "
                          f"p50 {m.p50_ms:.2f} ms  p99 {m.p99_ms:.2f} ms  max {m.max_ms:.1f} ms  "
                          f"attackers open {m.attackers_open:,}  worker RSS {m.worker_rss_mb:.0f} MB",
                          flush=True)  # fmt: skip
    result = {s: median(ms) for s, ms in samples.items()}
    print("\n| slow connections held | requests | lost | p50 | p99 | max |")
    print("|---|---|---|---|---|---|")
    for scenario, m in result.items():
        held = "none" if scenario == "none" else f"{m.attackers_open:,} {scenario}"
        print(f"| {held} | {m.requests:,} | {m.lost} | {m.p50_ms:.2f} ms | {m.p99_ms:.2f} ms | {m.max_ms:.1f} ms |")
    # RSS only grows (Python keeps the memory it used): the first round shows what each kind added.
    first = [(s, ms[0].worker_rss_mb) for s, ms in samples.items()]
    print("\nworker RSS after each scenario of round 1: " + ", ".join(f"{s} {mb:.0f} MB" for s, mb in first))
    total_lost = sum(m.lost for ms in samples.values() for m in ms)
    worst_p99 = max(m.p99_ms for s, ms in samples.items() if s != "none" for m in ms)
    ok = total_lost == 0 and worst_p99 < 100
    print(f"\ngoal: none lost and p99 < 100 ms under every attack: {'met' if ok else 'MISSED'} "
          f"(lost {total_lost}, worst p99 {worst_p99:.2f} ms)")  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"slow-clients-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "environment": env_note,
        "settings": {"count": args.count, "duration_s": args.duration, "rounds": args.rounds},
        "median": {k: asdict(v) for k, v in result.items()},
        "rounds": {k: [asdict(m) for m in v] for k, v in samples.items()}, "goal_met": ok,
    }, indent=2))  # fmt: skip
    print(f"written to {out.relative_to(REPO)}")
    return 0 if ok or not args.check else 1


def median(samples: list[Measure]) -> Measure:
    fields = [f for f in Measure.__dataclass_fields__ if f not in ("requests", "lost", "attackers_open")]
    values = {f: statistics.median(getattr(m, f) for m in samples) for f in fields}
    counts = {f: int(statistics.median(getattr(m, f) for m in samples)) for f in ("requests", "attackers_open")}
    return Measure(lost=sum(m.lost for m in samples), **counts, **values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="slow connections per kind (default 1000)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all scenarios (default 3)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the goal is missed")
    return bench(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
