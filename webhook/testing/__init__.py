"""Test support: a local Kubernetes API simulator and synthetic clusters (no work at import time)."""

from __future__ import annotations

from webhook.testing.kubesim import KubeSim
from webhook.testing.synthetic import iter_synthetic_cluster, synthetic_cluster

__all__ = ["KubeSim", "iter_synthetic_cluster", "synthetic_cluster"]
