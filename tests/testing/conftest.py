"""Fixtures of the API simulator's tests. `sim` serves a 12-node synthetic cluster, or an empty one in a
module or test marked `empty_cluster` (test_kubewrite.py, test_kubeleases.py, ...); `client` is the real
`kubernetes` ApiClient on a kubeconfig the simulator wrote, and `api` and `custom` its CoreV1Api and
CustomObjectsApi. Every `sim` ends with no errors in its request handlers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from tests.testing.kubeclient import kube_client
from webhook.testing import KubeSim, synthetic_cluster


@pytest.fixture
def sim(request: pytest.FixtureRequest) -> Iterator[KubeSim]:
    with KubeSim(bookmark_interval=0.2) as running:
        if request.node.get_closest_marker("empty_cluster") is None:
            running.load(synthetic_cluster(nodes=12, pods=120, seed=7))
        yield running
        assert running.handler_errors == []


@pytest.fixture
def client(sim: KubeSim, tmp_path: Path) -> Iterator[kubernetes.client.ApiClient]:
    with kube_client(sim, tmp_path) as api_client:
        yield api_client


@pytest.fixture
def api(client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client=client)


@pytest.fixture
def custom(client: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(client)
