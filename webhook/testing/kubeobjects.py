"""Objects the simulator serves by GET alone, at their REST path: the few that a client reads once and
does not list or watch (the webhook's apps/v1 Deployment and the ConfigMap of its policy, read by
`kubectl gpupool`). No resourceVersion, no history, no watch: `KubeSim.serve_object(obj)` puts one,
`KubeSim.serve_object(obj, remove=True)` takes it away, and a GET of any other path answers 404 as
before.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import orjson


def object_path(obj: Mapping[str, Any]) -> str:
    """The path kube-apiserver serves `obj` at: `/api/v1/namespaces/NS/configmaps/NAME` for the core
    group, `/apis/GROUP/VERSION/namespaces/NS/PLURAL/NAME` for others. The plural is the kind in lower
    case with an `s`, right for the kinds served here (deployments, configmaps, secrets, services)."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    meta = obj.get("metadata")
    if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(meta, Mapping)):
        raise ValueError("an object needs apiVersion, kind and metadata")
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        raise ValueError("an object needs metadata.name")
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{kind.lower()}s/{name}"


class StaticObjects:
    """Path -> the object's JSON, guarded by a lock (handlers run in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[str, bytes] = {}

    def put(self, obj: Mapping[str, Any]) -> None:
        body = orjson.dumps(obj)
        with self._lock:
            self._bodies[object_path(obj)] = body

    def remove(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._bodies.pop(object_path(obj), None)

    def get(self, path: str) -> bytes | None:
        with self._lock:
            return self._bodies.get(path.rstrip("/"))
