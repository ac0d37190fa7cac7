"""`bench/soak.py --lock-stats`: time, inside a running `gpupool serve` worker, how long each admission
waits for the inventory's lock and how long applying one watch event takes.

Python imports `sitecustomize` at start from any directory on PYTHONPATH; the soak puts this one there
for the servers it starts, and only when GPUPOOL_BENCH_LOCKSTATS names the file to write. It wraps
three methods of the server (the lock's `__enter__`, `Admitter.admit`, `LiveInventory.apply`) in the
master before gunicorn forks, and the worker writes its figures to that file every 5 seconds. A
diagnostic for the benchmark only: nothing of it is part of gpupool.
"""

import json
import os
import sys
import threading
import time

OUT = os.environ.get("GPUPOOL_BENCH_LOCKSTATS")


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    return {
        "n": len(ordered),
        "p50_ms": ordered[len(ordered) // 2] * 1e3,
        "p99_ms": ordered[int(len(ordered) * 0.99)] * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "over_5ms": sum(1 for v in ordered if v > 0.005),
    }


def _install(out: str) -> None:
    from webhook.admission import core
    from webhook.pools import inventory
    from webhook.sources import live

    waits: list[tuple[float, float]] = []  # (wall seconds waited, process CPU seconds meanwhile)
    admits: list[float] = []
    applies: list[float] = []

    def enter(self, _pc=time.perf_counter, _pt=time.process_time):  # type: ignore[no-untyped-def]
        t0, c0 = _pc(), _pt()
        self._lock.acquire()
        if threading.current_thread().name.startswith("ThreadPoolExecutor"):  # gthread's request threads
            waits.append((_pc() - t0, _pt() - c0))
        return self._index

    def timed(method, into):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - t0)

        return wrapper

    inventory._Held.__enter__ = enter
    core.Admitter.admit = timed(core.Admitter.admit, admits)
    live.LiveInventory.apply = timed(live.LiveInventory.apply, applies)

    def write() -> None:
        while True:
            time.sleep(5)
            long_waits = [w for w in list(waits) if w[0] > 0.005]
            figures = {
                "lock_wait": _quantiles([w for w, _ in list(waits)]),
                "admit": _quantiles(list(admits)),
                "apply_event": _quantiles(list(applies)),
                # Of the time spent in waits over 5 ms, the share the worker process spent on a CPU
                # (another thread of it running: the watch); the rest it waited for a CPU at all.
                "long_waits_process_on_cpu": (
                    sum(c for _, c in long_waits) / sum(w for w, _ in long_waits) if long_waits else None
                ),
            }
            with open(out + ".tmp", "w") as f:
                json.dump(figures, f)
            os.replace(out + ".tmp", out)

    os.register_at_fork(after_in_child=lambda: threading.Thread(target=write, daemon=True).start())


if OUT and "serve" in getattr(sys, "orig_argv", ()):
    _install(OUT)
