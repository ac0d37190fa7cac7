"""Figures: quantiles of what the client timed, and the server's own view, scraped from its /metrics."""

from __future__ import annotations

import http.client
import re
import statistics


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "n": len(ordered),
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "p999": at(0.999),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


def scrape(health_port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", health_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def histogram(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts {upper bound: count} of a Prometheus histogram."""
    buckets = {}
    for match in re.finditer(rf'^{name}_bucket\{{le="([^"]+)"\}} ([\d.e+]+)$', text, re.M):
        buckets[float(match.group(1))] = float(match.group(2))
    return buckets


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The bucket bound under which a fraction q of the observations between two scrapes fell."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if total and count >= q * total:
            return bound
    return float("inf")


def gauge(text: str, name: str, pool: str | None = None) -> float | None:
    label = rf'\{{pool="{re.escape(pool)}"\}}' if pool else ""
    match = re.search(rf"^{name}{label} ([\d.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else None
