"""Kubeconfigs for the commands' tests."""

from __future__ import annotations

from pathlib import Path

import orjson


def kubeconfig(path: Path, server: str = "http://127.0.0.1:1", token: str = "t") -> Path:
    """Three contexts on one cluster: `a` (current, namespace team-a), `b` (namespace team-b) and `plain`
    (no namespace)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [
            {"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
            {"name": "b", "context": {"cluster": "c", "user": "u", "namespace": "team-b"}},
            {"name": "plain", "context": {"cluster": "c", "user": "u"}},
        ],
        "current-context": "a",
    }
    path.write_bytes(orjson.dumps(config))
    return path
