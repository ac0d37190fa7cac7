"""The soak's goals, and its table on stdout."""

from __future__ import annotations

from typing import Any

GOALS = {"p99_ms": 5.0, "errors": 0, "rss_growth": 0.10}


def report_soak(r: dict[str, Any]) -> None:
    lat, s = r["latency_ms"], r["settings"]
    worst = max(r["per_10s"], key=lambda w: w.get("p99", 0.0)) if r["per_10s"] else {}
    rows = [
        ("duration", f"{s['minutes']:g} min, {r['requests']:,} admissions"),
        ("admissions/s achieved (target)", f"{r['admissions_per_s']:.1f} ({s['rate']:g})"),
        (
            "Pod writes/s achieved: churn (target) / all",
            f"{r['churn_writes_per_s']:.0f} ({s['events']:g}) / {r['pod_writes_per_s']:.0f}",
        ),
        (
            "latency from due time p50 / p99 / p99.9 / max",
            f"{lat['p50']:.2f} / {lat['p99']:.2f} / {lat['p999']:.2f} / {lat['max']:.1f} ms",
        ),
        (
            "worst 10 s window p99 / max",
            f"{worst.get('p99', 0):.2f} / {worst.get('max', 0):.1f} ms at {worst.get('from_s')} s",
        ),
        (
            "server's own histogram p50 / p99 (bucket bound)",
            f"<= {r['server_histogram']['p50_le_s'] * 1e3:g} / <= {r['server_histogram']['p99_le_s'] * 1e3:g} ms",
        ),
        ("errors (non-200, malformed, wrong outcome, late)", f"{r['errors']} {r['errors_by_kind'] or ''}"),
        ("outcomes", ", ".join(f"{k} {v:,}" for k, v in sorted(r["outcomes"].items()))),
        ("admitted Pods created in the simulator", f"{r['pods_created'].get('created', 0):,}"),
        ("RSS master + worker, start (after sync)", _rss(r["rss_mb_start"])),
        ("RSS master + worker, end", _rss(r["rss_mb_end"])),
        ("RSS growth", f"{r['rss_growth'] * 100:+.1f} %"),
        (
            "watch lag p50 / max (probe)",
            f"{r['watch_lag_ms'].get('p50', float('nan')):.1f} / {r['watch_lag_ms'].get('max', float('nan')):.1f} ms",
        ),
        (
            "client: dispatch lag p99 / max",
            f"{r['client_dispatch_lag_ms']['p99']:.2f} / {r['client_dispatch_lag_ms']['max']:.1f} ms",
        ),
        ("CPU % of one core (average)", ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_pct_average"].items())),
    ]
    if "lock_stats" in r:
        wait, admit = r["lock_stats"]["lock_wait"], r["lock_stats"]["admit"]
        rows.append(
            (
                "inside the server: wait for the inventory lock / whole admit, p99 / max",
                f"{wait['p99_ms']:.2f} / {wait['max_ms']:.1f} ms, {admit['p99_ms']:.2f} / {admit['max_ms']:.1f} ms",
            )
        )
    print()
    print("| measure | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    met = r["goals_met"]
    print(
        f"\ngoals: p99 < {GOALS['p99_ms']:g} ms, 0 errors, RSS growth < {GOALS['rss_growth'] * 100:g} %: "
        f"{'met' if met else 'NOT MET'}"
    )


def _rss(rss: dict[str, float]) -> str:
    return " + ".join(f"{v:.0f}" for v in rss.values()) + f" = {sum(rss.values()):.0f} MB"
