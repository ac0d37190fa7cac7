"""The simulator's process (its scheduler, finishes and audit log on) and what the benchmark asks of its API:
paged lists, creations in bulk, a pause in its writes, and its audit log fed to the judge as it grows."""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from bench.queueaudit import Auditor
from bench.queuebench.cluster import FINISH_LABEL, now
from bench.soakbench.sim import SimApi, Simulator, launch_simulator

AUDIT_LOG = "audit.jsonl"  # in the run's scratch directory


@contextmanager
def simulator(args: argparse.Namespace, tmp: Path) -> Iterator[Simulator]:
    """`python -m webhook.testing` with its scheduler, its finishes under control (`Simulator.command`) and
    its audit log (`tmp / AUDIT_LOG`) of the Pods, nodes and Leases."""
    kubeconfig, audit = tmp / "kubeconfig", tmp / AUDIT_LOG
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
    with launch_simulator(argv, kubeconfig, control=True, stop_timeout=120) as sim:
        yield sim


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


def post_all(sim: Simulator, objects: list[dict[str, Any]], threads: int = 4) -> None:
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
