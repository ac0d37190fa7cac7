"""The processes' memory and CPU, from /proc: RSS, CPU seconds, children, and a meter of CPU use over time."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path


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
