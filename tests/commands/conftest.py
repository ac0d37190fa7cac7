"""The commands read the kubeconfig for the context's namespace and cluster: every test here starts with
none (not the ~/.kube/config of the machine running the tests, not in a Pod), and passes its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.config import kube_config


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-kubeconfig")
    monkeypatch.setenv("KUBECONFIG", missing)  # for the processes a test starts
    # The client reads $KUBECONFIG once, when it is imported: this is where it keeps the answer.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", missing)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
