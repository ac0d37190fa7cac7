"""bench_server.py's figures: the table of medians, the ratios to the baselines, the goals, the JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.serverbench.launch import REPO, RESULTS
from bench.serverbench.rounds import AGAINST, NEW_SHAPES, Rounds, median

# The goals (issue 22), against the raw WSGI no-op on stock gunicorn gthread with the same workers and
# threads, measured in the same rounds: one Pod shape, and every Pod a new shape.
P50_LIMIT, THROUGHPUT_LIMIT = 1.25, 0.8
NEW_P50_LIMIT, NEW_THROUGHPUT_LIMIT = 1.5, 0.6


def report(args: argparse.Namespace, rounds: Rounds) -> int:
    """The medians' table, the ratios and the goals on stdout, the JSON in bench/results/; 1 when `--check`
    and a goal is missed."""
    servers, samples, outcomes, env_note = rounds.servers, rounds.samples, rounds.outcomes, rounds.env_note
    result = {name: median(s) for name, s in samples.items()}
    gthread = result["noop_gthread"]
    print()
    print(
        "| handler | p50 (1 conn) | p99 (1 conn) | req/s (1 conn) | req/s (4 conns) | p50 / gthread no-op "
        "| req/s (4) / gthread no-op | p50 / Flask no-op | req/s (4) / Flask no-op |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    noop, thin = result["noop"], result["noop_thin"]
    for name, m in result.items():
        print(
            f"| {servers[name]} | {m.p50_ms:.3f} ms | {m.p99_ms:.3f} ms | {m.rps_1:,.0f} | {m.rps_4:,.0f} | "
            f"{m.p50_ms / gthread.p50_ms:.2f}x | {m.rps_4 / gthread.rps_4:.2f}x | "
            f"{m.p50_ms / noop.p50_ms:.2f}x | {m.rps_4 / noop.rps_4:.2f}x |"
        )
    mutate, new = result["mutate"], result["mutate_new"]
    p50_ratio, rps_ratio = mutate.p50_ms / gthread.p50_ms, mutate.rps_4 / gthread.rps_4
    new_p50, new_rps = new.p50_ms / gthread.p50_ms, new.rps_4 / gthread.rps_4
    print(
        f"\ngoals against the raw WSGI no-op on stock gthread: one Pod shape p50 <= {P50_LIMIT}x, throughput >= "
        f"{THROUGHPUT_LIMIT}x; every Pod a new shape p50 <= {NEW_P50_LIMIT}x, throughput >= {NEW_THROUGHPUT_LIMIT}x"
    )
    print(f"one Pod shape: {p50_ratio:.2f}x the p50, {rps_ratio:.2f}x the throughput")
    print(f"every Pod a new shape: {new_p50:.2f}x the p50, {new_rps:.2f}x the throughput")
    raw = result["noop_raw"]
    print(
        f"gpupool's worker against stock gthread, raw WSGI no-op: {raw.p50_ms / gthread.p50_ms:.2f}x the p50, "
        f"{raw.rps_4 / gthread.rps_4:.2f}x the throughput; /mutate against the Flask no-op: "
        f"{mutate.p50_ms / noop.p50_ms:.2f}x, {mutate.rps_4 / noop.rps_4:.2f}x; against the thin no-op: "
        f"{mutate.p50_ms / thin.p50_ms:.2f}x, {mutate.rps_4 / thin.rps_4:.2f}x"
    )
    if args.against:
        for name in AGAINST:
            now, then = result[name], result[f"{name}_before"]
            print(
                f"{servers[name]}: {now.p50_ms / then.p50_ms:.2f}x the p50, {now.rps_4 / then.rps_4:.2f}x the "
                f"throughput of the same on {args.against}"
            )
    print(f"\noutcomes of the real server's admissions: {outcomes}")
    one_ok = p50_ratio <= P50_LIMIT and rps_ratio >= THROUGHPUT_LIMIT
    new_ok = new_p50 <= NEW_P50_LIMIT and new_rps >= NEW_THROUGHPUT_LIMIT
    ok = one_ok and new_ok
    print(f"one Pod shape: {'met' if one_ok else 'MISSED'}; every Pod a new shape: {'met' if new_ok else 'MISSED'}")
    thin_p50, thin_rps = mutate.p50_ms / thin.p50_ms, mutate.rps_4 / thin.rps_4

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"server-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "environment": env_note,
        "settings": {"workers": args.workers, "threads": args.threads, "duration_s": args.duration,
                     "rounds": args.rounds, "log_level": args.log_level},
        "servers": servers, "against": args.against, "median": {k: asdict(v) for k, v in result.items()},
        "rounds": {k: [asdict(m) for m in v] for k, v in samples.items()},
        "baseline": "noop_gthread", "p50_ratio": p50_ratio, "throughput_ratio": rps_ratio,
        "new_shapes_p50_ratio": new_p50, "new_shapes_throughput_ratio": new_rps, "targets_met": ok,
        "outcomes": outcomes, "load_average": os.getloadavg(),
        "flask_noop_p50_ratio": mutate.p50_ms / noop.p50_ms, "flask_noop_throughput_ratio": mutate.rps_4 / noop.rps_4,
        "thin_p50_ratio": thin_p50, "thin_throughput_ratio": thin_rps,
        "worker_vs_gthread": {"p50": raw.p50_ms / gthread.p50_ms, "throughput": raw.rps_4 / gthread.rps_4},
        "new_shapes": NEW_SHAPES,
    }, indent=2))  # fmt: skip
    print(f"written to {out.relative_to(REPO)}")
    return 1 if args.check and not ok else 0
