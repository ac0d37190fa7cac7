"""The API simulator (`python -m webhook.testing`) in its own process, and a keep-alive client for its REST API."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.serverbench.launch import REPO


class SimApi:
    """A keep-alive client for the simulator's REST API (one per thread)."""

    def __init__(self, port: int, token: str, timeout: float = 120.0) -> None:
        # 120 s, not 30: on a loaded machine the simulator's first binds after loading 150,000 Pods held a
        # GET for over 30 s and ended a bench_queue run before it began.
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
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
