"""Watch lag: how long until a server counts a Pod that was just created (dry runs for the one-GPU probe pool)."""

from __future__ import annotations

import ssl
import time
import uuid

from bench.soakbench.client import DEADLINE_S, Connection, read_answer
from bench.soakbench.pools import PROBE_NS, PROBE_PRODUCT, bench_pod
from bench.soakbench.reviews import review_body
from bench.soakbench.servers import Server
from bench.soakbench.sim import SimApi


class Prober:
    """Dry runs for the one-GPU probe pool on one server: does it still see the GPU free?"""

    def __init__(self, server: Server, context: ssl.SSLContext) -> None:
        self._conn = Connection(server.port, context)
        self.requests = 0

    def sees_taken(self) -> bool:
        uid = str(uuid.uuid4())
        pod = bench_pod(PROBE_NS, "probe-", PROBE_PRODUCT, generate=True)
        answer = read_answer(*self._conn.post(review_body(pod, uid, dry_run=True), DEADLINE_S), uid)
        self.requests += 1
        if answer.outcome != "mutated":
            raise RuntimeError(f"probe answered {answer.outcome}")
        return not answer.claimed

    def wait_until(self, taken: bool, timeout: float = 30.0) -> tuple[float, float]:
        """Ask until the answer flips; (send time of the last answer still unchanged, time of the
        first changed answer): the server counted the change in between."""
        last_unchanged = time.perf_counter()
        deadline = last_unchanged + timeout
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            if self.sees_taken() == taken:
                return last_unchanged, time.perf_counter()
            last_unchanged = sent
        raise TimeoutError(f"the server did not see the probe GPU {'taken' if taken else 'free'} in {timeout:g} s")

    def close(self) -> None:
        self._conn.close()


def watch_lag(prober: Prober, api: SimApi) -> dict[str, float]:
    """Create a Pod holding the probe pool's GPU (as kube-apiserver persists an admitted Pod) and time
    until the server counts it; then delete it and wait until the server sees the GPU free again."""
    prober.wait_until(taken=False)
    pod = bench_pod(PROBE_NS, "lag-", PROBE_PRODUCT, generate=True)
    pod["metadata"]["annotations"]["gpupool.io/pool"] = f"nvidia/medium/{PROBE_PRODUCT}"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": PROBE_PRODUCT}
    pod["status"] = {"phase": "Pending"}
    sent = time.perf_counter()
    created = api.create(pod)
    acked = time.perf_counter()
    low, high = prober.wait_until(taken=True)
    api.delete_pod(PROBE_NS, created["metadata"]["name"])
    prober.wait_until(taken=False)
    return {
        "create_ms": (acked - sent) * 1e3,
        "lag_ms": (high - acked) * 1e3,
        "lag_low_ms": max(0.0, low - acked) * 1e3,
    }
