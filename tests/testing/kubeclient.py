"""Reading the API simulator through the real `kubernetes` client: a watch returned once it is open, a
list as raw JSON, and the namespace/name of listed objects (tests/testing/test_kubesim_*.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import orjson

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from webhook.testing import KubeSim


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
