"""Where the benchmarks' files are, and starting a server to measure: free ports, /readyz, a process for the length
of a `with` (bench_server.py's, and the soak's and the others' that start servers)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


RESULTS = REPO / "bench" / "results"
DEMO_INVENTORY = REPO / "examples" / "cluster.yaml"
SAMPLE_REVIEW = REPO / "examples" / "admissionreview.json"
PATH = "/mutate?timeout=10s"


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
