"""Reading the API simulator through the real `kubernetes` client: a client on the kubeconfig the simulator
writes, a watch returned once it is open, a list as raw JSON, and the namespace/name of listed objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes
import orjson

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from webhook.testing import KubeSim


@contextmanager
def kube_client(sim: KubeSim, tmp_path: Path) -> Iterator[kubernetes.client.ApiClient]:
    """The real client, configured by the kubeconfig `sim` writes into `tmp_path`, closed on exit."""
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    with kubernetes.config.new_client_from_config(config_file=str(path)) as client:
        yield client


def open_watch(sim: KubeSim, call: Any, request_timeout: Any = TIMEOUT) -> Iterator[dict[str, Any]]:
    """A bookmark-enabled watch from now on, returned once it is open (its first event, a bookmark,
    has arrived), so the test can change the cluster knowing the stream will see it."""
    stream = kubernetes.watch.Watch().stream(
        call,
        resource_version=sim.resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=TIMEOUT,
        _request_timeout=request_timeout,
    )
    assert next(stream)["type"] == "BOOKMARK"
    return stream


def raw_list(api: kubernetes.client.CoreV1Api, **kwargs: Any) -> dict[str, Any]:
    response = api.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=TIMEOUT, **kwargs)
    result: dict[str, Any] = orjson.loads(response.data)
    return result


def names(items: list[dict[str, Any]]) -> list[str]:
    return [f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in items]
