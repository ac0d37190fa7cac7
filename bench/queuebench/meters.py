"""CPU meters of the processes around the run, and py-spy profiles of the leader (`--profile`)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.queuebench.replicas import Replica
from bench.serverbench.launch import RESULTS
from bench.soakbench.procfs import CpuMeter
from bench.soakbench.sim import Simulator


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


def cpu_percent(pids: dict[str, int], seconds: float) -> dict[str, float]:
    meter = CpuMeter(pids)
    meter.reset()
    time.sleep(seconds)
    return meter.read()


def meter(sim: Simulator, reps: list[Replica]) -> CpuMeter:
    pids = {"simulator": sim.proc.pid, "benchmark": os.getpid()}
    for r in reps:
        pids[f"{r.name} worker"] = r.worker()
        pids[f"{r.name} leader process"] = r.leader_process()
    cpu = CpuMeter(pids)
    cpu.reset()
    return cpu
