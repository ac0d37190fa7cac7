"""Fixtures of the API simulator's tests. `sim` serves a 12-node synthetic cluster (modules whose tests
need an empty cluster, such as test_kubewrite.py and test_kubeleases.py, define their own `sim`), and
`api` is the real client's CoreV1Api on a kubeconfig the simulator wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from webhook.testing import KubeSim, synthetic_cluster


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with KubeSim(bookmark_interval=0.2) as running:
        running.load(synthetic_cluster(nodes=12, pods=120, seed=7))
        yield running
        assert running.handler_errors == []


@pytest.fixture
def api(sim: KubeSim, tmp_path: Path) -> Iterator[kubernetes.client.CoreV1Api]:
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    with kubernetes.config.new_client_from_config(config_file=str(path)) as client:
        yield kubernetes.client.CoreV1Api(api_client=client)
