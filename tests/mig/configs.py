# ruff: noqa: E501  (the GPU Operator's config, its lines as they are there)
"""mig-parted configs the MIG tests read: an extract of the GPU Operator's `default-mig-parted-config`
(assets/state-mig-manager/0400_configmap.yaml in NVIDIA/gpu-operator, as of 2026-08), its entries kept
as they are there, and a custom one with GPU indexes."""

from __future__ import annotations

from webhook.mig.config import MigConfig, parse_config
from webhook.mig.layouts import Layouts

OPERATOR_DEFAULT = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}

  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7

  all-3g.20gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2

  all-7g.40gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "7g.40gb": 1

  all-1g.10gb:
    # H100-80GB, H800-80GB, A100-80GB, A800-80GB
    - device-filter: ["0x233010DE", "0x233110DE", "0x232210DE", "0x20B210DE", "0x20B510DE", "0x20F310DE", "0x20F510DE", "0x232410DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7

    # A100-40GB, A800-40GB
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 4

  all-2g.20gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "2g.20gb": 3

  all-3g.40gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2

  all-7g.80gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "7g.80gb": 1

  all-1g.6gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.6gb": 4

  all-4g.24gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "4g.24gb": 1

  all-1g.35gb:
    # H200-141GB
    - device-filter: ["0x233510DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.35gb": 4
    # GB300
    - device-filter: ["0x31C210DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.35gb": 7

  all-3g.71gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.71gb": 2

  all-balanced:
    # H100-80GB, H800-80GB, A100-80GB, A800-80GB
    - device-filter: ["0x233010DE", "0x233110DE", "0x232210DE", "0x20B210DE", "0x20B510DE", "0x20F310DE", "0x20F510DE", "0x232410DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1

    # A100-40GB, A800-40GB
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1

    # A30-24GB
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.6gb": 2
        "2g.12gb": 1
"""

# GPU indexes: the first GPU whole, the rest cut (the later entry wins on GPUs 1-7).
CUSTOM = """\
version: v1
mig-configs:
  half-and-half:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
    - devices: [0]
      mig-enabled: false
  gpu0-only:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
"""

A100_80 = "NVIDIA-A100-SXM4-80GB"
A100_40 = "NVIDIA-A100-SXM4-40GB"
A100_40_PCIE = "NVIDIA-A100-PCIE-40GB"  # sold under two PCI IDs, 0x20B1 and 0x20F1
H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
H200_NVL = "NVIDIA-H200-NVL"
A30 = "NVIDIA-A30"


def operator_default() -> MigConfig:
    return parse_config(OPERATOR_DEFAULT)


def operator_layouts(*names: str) -> Layouts:
    return Layouts.choosable(operator_default(), names)
