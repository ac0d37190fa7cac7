"""A running `gpupool serve` as the serving tests start and read it: started with its flags and a client
that talks like kube-apiserver, one sample of its /metrics, its /readyz, and the GPU quotas of a
simulated cluster (test_validate.py, test_forged_reviews.py, test_policyfile.py, test_worker.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from tests.builders import quota
from tests.conftest import ApiServerClient, ServerProcess, free_port, health_get, serve_argv

SETTLE = 5.0  # the policy's default reservationSettleSeconds


def start_serving(
    start: Callable[..., ServerProcess], cert_dir: Path, *flags: str, wait: bool = True
) -> tuple[ServerProcess, ApiServerClient, int]:
    """`gpupool serve` with `flags` (its inventory among them) on free ports, once ready (`wait=False`: at
    once, for a module that starts its replicas side by side and then waits for each): the server, a
    client that talks like kube-apiserver, and the health port."""
    port, health_port = free_port(), free_port()
    server = start(serve_argv(cert_dir, port, health_port, *flags), health_port, wait=wait)
    return server, ApiServerClient(port, cert_dir / "ca.crt"), health_port


def metric(health_port: int, sample: str) -> float | None:
    """One sample's value from the server's /metrics (`name{labels}` as exposed), None when absent (or
    when the port did not answer: a test polling for a value tries again)."""
    _, body, _ = health_get(health_port, "/metrics")
    for line in body.decode().splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return None


def readyz(health_port: int) -> tuple[int, dict[str, Any]]:
    """/readyz: its status and its JSON body ({} when there is none)."""
    status, body, _ = health_get(health_port, "/readyz")
    return status, orjson.loads(body) if body else {}


def gpu_quotas(hard: Mapping[str, int]) -> list[dict[str, Any]]:
    """A ResourceQuota `gpus` of requests.nvidia.com/gpu per namespace, none of it used yet."""
    return [
        quota("gpus", namespace, {"requests.nvidia.com/gpu": str(gpus)}, {"requests.nvidia.com/gpu": "0"})
        for namespace, gpus in hard.items()
    ]
