"""An API client whose every call is one attempt, so that its timeout is the most a call can take.

The `kubernetes` client's connection pool retries a request that timed out, three more times for the
methods urllib3 takes as idempotent (GET and PUT among them, so every read and every Lease write): a read
with a 2 s timeout on an API that does not answer took 8 s, past kube-apiserver's 5 s for a webhook
call, and a Lease renewal with the writes' 10 s timeout took 40 s for its read alone. gpupool's callers
already treat a call that fails as failed (the fence refuses, the charges' read gives up, the election
retries on its own period), so they want it to fail within its timeout, not four times it.

A call is sent again only when its connection could not be made (nothing reached the API server, so
nothing can be written twice): at most the connect timeout twice, then the read timeout once.
"""

from __future__ import annotations

import copy
from typing import Any

import urllib3
from kubernetes import client

# One more attempt when the connection could not be made; none after anything was sent.
ONE_ATTEMPT = urllib3.Retry(total=1, connect=1, read=0, redirect=0, status=0, other=0)


def bounded(api_client: Any) -> Any:
    """Another `kubernetes.client.ApiClient` on the same cluster, credentials and pool size as `api_client`
    (a connection pool of its own), whose calls are never retried once sent."""
    configuration = copy.deepcopy(api_client.configuration)
    configuration.retries = ONE_ATTEMPT
    return client.ApiClient(configuration)


def worst_seconds(timeout: tuple[float, float]) -> float:
    """The most one call of a `bounded` client with `timeout` (connect, read) can take on an API that does
    not answer: two connects, one read."""
    connect, read = timeout
    return 2 * connect + read
