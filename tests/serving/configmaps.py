"""A policy file as the kubelet mounts a ConfigMap, for the tests of reloading it."""

from __future__ import annotations

import os
from pathlib import Path


class ConfigMapVolume:
    """A directory laid out as the kubelet lays out a ConfigMap volume: `policy.yaml -> ..data/policy.yaml`,
    `..data -> ..<version>`; an update writes a new version directory and swaps `..data` in one rename."""

    def __init__(self, root: Path, text: str) -> None:
        self.root = root
        self.versions = 0
        root.mkdir(parents=True, exist_ok=True)
        self.update(text)
        (root / "policy.yaml").symlink_to("..data/policy.yaml")

    @property
    def path(self) -> str:
        return str(self.root / "policy.yaml")

    def update(self, text: str) -> None:
        self.versions += 1
        version = self.root / f"..2026_12_01_00_00_{self.versions:02d}"
        version.mkdir()
        (version / "policy.yaml").write_text(text, encoding="utf-8")
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.root / "..data")
