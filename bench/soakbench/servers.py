"""`gpupool serve` as the manifests run it, against the simulator, and the cluster both modes stand on."""

from __future__ import annotations

import argparse
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from bench.serverbench.launch import free_port, running
from bench.soakbench.client import tls_context
from bench.soakbench.pools import add_bench_pools
from bench.soakbench.procfs import children, rss_mb
from bench.soakbench.sim import SimApi, Simulator, simulator
from webhook.serving.certs import ensure_certificates


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
def servers(  # noqa: PLR0913 (a benchmark fixture: every server option, by keyword)
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
