"""Part 1, the soak: one `gpupool serve` on the live inventory under load and churn for a while, and the figures
of the run (bench/soak.py's docstring says what is measured)."""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import platform
import shutil
import ssl
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.serverbench.launch import REPO, RESULTS
from bench.serverbench.rounds import admissions_by_outcome
from bench.soakbench.client import DEADLINE_S
from bench.soakbench.load import Load, creator
from bench.soakbench.metrics import gauge, histogram, histogram_quantile, quantiles, scrape
from bench.soakbench.prober import Prober, watch_lag
from bench.soakbench.procfs import CpuMeter
from bench.soakbench.report import GOALS, report_soak
from bench.soakbench.reviews import RequestMaker
from bench.soakbench.servers import Server, bench_cluster, read_log, servers
from bench.soakbench.sim import SimApi, Simulator
from webhook.testing.synthetic import namespaces as synthetic_namespaces


def soak(args: argparse.Namespace) -> int:
    env_note = f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    print(
        f"soak: {args.minutes:g} min at {args.rate:g} admissions/s over {args.connections} connections, "
        f"{args.events:g} Pod events/s, {args.nodes:,} nodes, {args.pods:,} Pods; {env_note}",
        flush=True,
    )
    with bench_cluster(args, "soak") as (tmp, context, sim, api):
        maker = RequestMaker(api.items("/api/v1/resourcequotas"), synthetic_namespaces(), args.seed)
        lock_stats = tmp / "lock-stats.json"
        if args.lock_stats:  # only the server started next imports bench/lockstats/sitecustomize.py
            hook = [str(REPO / "bench" / "lockstats"), *filter(None, [os.environ.get("PYTHONPATH")])]
            os.environ.update(PYTHONPATH=os.pathsep.join(hook), GPUPOOL_BENCH_LOCKSTATS=str(lock_stats))
        with servers(Server, ["server"], tmp, sim) as (server,):
            result = soak_run(args, server, sim=sim, api=api, maker=maker, context=context)
            result["server_log"] = read_log(server.log)
            if args.lock_stats:
                time.sleep(6)  # the worker writes them every 5 s
                result["lock_stats"] = json.loads(lock_stats.read_text())
            if args.keep_logs:
                RESULTS.mkdir(parents=True, exist_ok=True)
                shutil.copy(server.log, RESULTS / f"soak-{time.strftime('%Y%m%dT%H%M%S')}-server.log")
    result["churn"] = sim.churn  # its counts, printed when it stopped
    result["environment"] = env_note
    result["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    report_soak(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"soak-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out.relative_to(REPO)}")
    return 0 if result["goals_met"] else 1


def soak_run(
    args: argparse.Namespace,
    server: Server,
    *,
    sim: Simulator,
    api: SimApi,
    maker: RequestMaker,
    context: ssl.SSLContext,
) -> dict[str, Any]:
    create_queue: Any = multiprocessing.Queue()
    create_done: Any = multiprocessing.Queue()
    create_proc = multiprocessing.Process(target=creator, args=(sim.port, sim.token, create_queue, create_done))
    create_proc.start()
    assert create_proc.pid is not None
    meter = CpuMeter(
        {**server.pids(), "simulator": sim.proc.pid, "load generator": os.getpid(), "Pod creator": create_proc.pid}
    )
    rss_start = server.rss()
    metrics_start = scrape(server.health_port)
    rv_start, t_start = api.resource_version(), time.perf_counter()
    load = Load(server, context, maker, args, create_queue)
    lags: list[dict[str, float]] = []
    timeline: list[dict[str, Any]] = []
    stop = threading.Event()

    def observe() -> None:
        """Every 10 s: RSS, CPU, and (every 20 s) the watch lag; never on the load's connections."""
        prober, lag_api = Prober(server, context), sim.api()
        tick = 0
        while not stop.wait(10.0):
            tick += 1
            sample: dict[str, Any] = {"t_s": round(time.perf_counter() - t_start, 1), "rss_mb": server.rss()}
            sample["cpu_pct"] = {k: round(v, 1) for k, v in meter.read().items()}
            if tick % 2 == 0:
                try:
                    lags.append(watch_lag(prober, lag_api))
                    sample["watch_lag_ms"] = round(lags[-1]["lag_ms"], 2)
                except (TimeoutError, RuntimeError, OSError) as exc:
                    sample["watch_lag_error"] = str(exc)
            timeline.append(sample)
            print(
                f"  {sample['t_s']:>6.0f} s  done {len(load.outcomes):>7,}  RSS {sample['rss_mb']}  "
                f"CPU % {sample['cpu_pct']}  lag {sample.get('watch_lag_ms', '-')} ms",
                flush=True,
            )
        prober.close()
        lag_api.close()

    meter.reset()
    cpu_meter_total = CpuMeter(dict(meter.pids))
    cpu_meter_total.reset()
    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    load.run()
    elapsed = time.perf_counter() - load.start
    cpu_total = cpu_meter_total.read()
    stop.set()
    observer.join(60)
    create_queue.put(None)
    created: Counter[str] = Counter(create_done.get(timeout=300))
    create_proc.join(60)
    rv_end = api.resource_version()
    events_seconds = time.perf_counter() - t_start
    rss_end = server.rss()
    metrics_end = scrape(server.health_port)

    latencies = [(o.done - o.due) * 1e3 for o in load.outcomes]
    service = [(o.done - o.sent) * 1e3 for o in load.outcomes]
    queued = [(o.sent - o.due) * 1e3 for o in load.outcomes]
    errors = Counter(o.error for o in load.outcomes if o.error)
    per_shape: dict[str, dict[str, Any]] = {}
    for o in load.outcomes:
        entry = per_shape.setdefault(o.shape, {"n": 0, "outcomes": Counter()})
        entry["n"] += 1
        entry["outcomes"][o.result] += 1
    windows = []
    ordered = sorted(load.outcomes, key=lambda o: o.due)
    dues = [o.due for o in ordered]
    for w in range(int(args.minutes * 6)):
        lo = bisect.bisect_left(dues, load.start + w * 10)
        hi = bisect.bisect_left(dues, load.start + (w + 1) * 10)
        q = quantiles([(o.done - o.due) * 1e3 for o in ordered[lo:hi]])
        windows.append({"from_s": w * 10, **{k: round(v, 3) for k, v in q.items()}})
    rss_total_start, rss_total_end = sum(rss_start.values()), sum(rss_end.values())
    growth = rss_total_end / rss_total_start - 1
    lat = quantiles(latencies)
    writes = rv_end - rv_start
    churn_writes = writes - created["created"]
    hist_a = histogram(metrics_start, "gpupool_admission_duration_seconds")
    hist_b = histogram(metrics_end, "gpupool_admission_duration_seconds")
    result: dict[str, Any] = {
        "settings": {
            "minutes": args.minutes,
            "rate": args.rate,
            "events": args.events,
            "connections": args.connections,
            "max_connections": args.max_connections,
            "nodes": args.nodes,
            "pods": args.pods,
            "seed": args.seed,
            "deadline_s": DEADLINE_S,
            "server": "1 worker x 8 threads, log level info, live inventory",
        },
        "requests": len(load.outcomes),
        "admissions_per_s": len(load.outcomes) / elapsed,
        "latency_ms": lat,
        "service_ms": quantiles(service),
        "queued_ms": quantiles(queued),
        "client_dispatch_lag_ms": quantiles([x * 1e3 for x in load.dispatch_lag]),
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
        "error_examples": load.examples,
        "connections_opened": load.opened,
        "outcomes": dict(Counter(o.result for o in load.outcomes)),
        "per_shape": {k: {"n": v["n"], "outcomes": dict(v["outcomes"])} for k, v in per_shape.items()},
        "pods_created": dict(created),
        "pod_writes": writes,
        "pod_writes_per_s": writes / events_seconds,
        "churn_writes_per_s": churn_writes / events_seconds,
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
        "rss_growth": growth,
        "cpu_pct_average": {k: round(v, 1) for k, v in cpu_total.items()},
        "watch_lag_ms": quantiles([x["lag_ms"] for x in lags]),
        "watch_lag_samples": lags,
        "server_histogram": {
            f"p{int(q * 100)}_le_s": histogram_quantile(hist_a, hist_b, q) for q in (0.5, 0.99, 0.999)
        },
        "server_admissions": admissions_by_outcome(server.health_port),
        "server_reservations_end": gauge(metrics_end, "gpupool_reservations"),
        "per_10s": windows,
        "timeline": timeline,
    }
    result["goals"] = GOALS
    result["goals_met"] = lat["p99"] < GOALS["p99_ms"] and not errors and growth < GOALS["rss_growth"]
    return result
