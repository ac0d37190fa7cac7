"""The clients that time a server: `wrk` when installed (C, epoll: far less CPU than the server), else one Python
process per keep-alive TLS connection."""

from __future__ import annotations

import http.client
import multiprocessing
import re
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.serverbench.launch import PATH


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
