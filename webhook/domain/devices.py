"""Devices: what a Pod can be given besides a whole GPU, as GPU Feature Discovery names them.

Three kinds of device:
- `gpu`: a whole, dedicated GPU;
- `mig`: a hardware partition of a device: an NVIDIA MIG instance, with its own memory, which GFD names
  `<model>-MIG-<profile>` (`NVIDIA-A100-SXM4-40GB-MIG-3g.20gb`), on `nvidia.com/gpu` under the single
  MIG strategy, on `nvidia.com/mig-<profile>` under the mixed one; or a virtual NPU Ascend's device
  plugin advertises as `huawei.com/Ascend910-4c`, which gpupool names `<model>-vNPU-<template>`
  (`huawei-Ascend910-vNPU-4c`);
- `shared`: a time-sliced or MPS replica of a GPU (or of a MIG instance), which GFD marks with a
  `-SHARED` product suffix (or, with `renameByDefault`, puts on a resource of its own,
  `nvidia.com/gpu.shared`, and gpupool adds the suffix). Replicas share the GPU's memory.

Here: the kinds and their names in product labels, the MIG profile grammar, a Pod's or namespace's
device preference list, and NVIDIA's table of the oldest driver each CUDA release runs on (to derive the
CUDA version a node supports from its driver when no label says it). Pure functions over strings and
numbers; the node labels are read in webhook.pools.node_devices.
"""

from __future__ import annotations

import re
from typing import NamedTuple

GPU, MIG, SHARED = "gpu", "mig", "shared"
KINDS = (GPU, MIG, SHARED)
NOUNS = {GPU: "GPU", MIG: "MIG instance", SHARED: "replica"}  # what one device of a kind is called

SHARED_SUFFIX = "-SHARED"
MIG_MARK = "-MIG-"
VNPU_MARK = "-vNPU-"  # a partition that is not a MIG instance (gpupool's name; no node label writes it)
INVALID_PROFILE = "INVALID"  # GFD's `<model>-MIG-INVALID`: the single strategy found no usable layout

# A MIG profile as GFD writes it: `1g.5gb`, `3g.20gb`, `1c.3g.20gb` (a compute instance smaller than
# its GPU instance), `1g.10gb.me` (GFD turns `+me` into `.me`), `1g.10gb+me` from older releases.
# Bounded repetitions, ASCII only: a label value is at most 63 characters anyway.
_PROFILE = re.compile(r"(?:[0-9]{1,2}c\.)?[0-9]{1,2}g\.([0-9]{1,4})gb(?:[.+][a-z]{1,8}){0,3}", re.ASCII)
_DEVICE_PRODUCT = re.compile(
    rf"(?P<model>.+?)(?:(?:{MIG_MARK}|{VNPU_MARK})(?P<profile>[^-]+))?(?P<shared>{SHARED_SUFFIX})?",
    re.ASCII | re.IGNORECASE,
)


class DeviceProduct(NamedTuple):
    """A product label taken apart: the GPU model, the MIG profile or vNPU template ("" for none) and
    whether it is shared."""

    model: str
    profile: str
    shared: bool

    @property
    def kind(self) -> str:
        return SHARED if self.shared else MIG if self.profile else GPU


def split_product(label: str) -> DeviceProduct:
    """`NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED` -> (`NVIDIA-A100-SXM4-40GB`, `1g.5gb`, True). A `-MIG-`
    part that is not a profile (`-MIG-INVALID`) is kept as the profile, for the caller to judge."""
    text = label.strip()
    match = _DEVICE_PRODUCT.fullmatch(text)
    if match is None:  # only an empty label
        return DeviceProduct(text, "", False)
    return DeviceProduct(match["model"], match["profile"] or "", bool(match["shared"]))


def device_kind(product: str) -> str:
    """The kind of device a pool's product names (`Tesla-T4-SHARED` -> shared): gpupool writes a shared
    device's product with the suffix and a MIG instance's with `-MIG-<profile>`, so the product says it."""
    return split_product(product).kind


def valid_profile(profile: str) -> bool:
    return _PROFILE.fullmatch(profile) is not None


def partition_product(model: str, profile: str) -> str:
    """The product of a partition of `model` that no label names: `<model>-MIG-<profile>` for a MIG
    profile, as GFD would write it; any other partition (an Ascend virtual NPU's template, `4c`) is
    `<model>-vNPU-<template>`."""
    return f"{model}{MIG_MARK if valid_profile(profile) else VNPU_MARK}{profile}"


def profile_memory_mib(profile: str) -> int:
    """The memory a MIG profile's name promises (`3g.20gb`: 20 GB), in MiB, rounded down: for nodes
    whose labels do not say. The name counts decimal gigabytes, and the instance never has less than
    that (a 1g.5gb has 4864 MiB, more than 5 GB's 4768), so it is never an overestimate. 0 when the
    profile cannot be read."""
    return profile_gb(profile) * 10**9 // 2**20


def profile_gb(profile: str) -> int:
    """The size a MIG profile's name gives (`3g.20gb`: 20); 0 when the profile cannot be read."""
    match = _PROFILE.fullmatch(profile)
    return int(match.group(1)) if match else 0


# --- a device preference: gpupool.io/device, the policy's defaults.device and namespaces.<ns>.device ----


def parse_device_list(value: object) -> tuple[str, ...]:
    """`mig,gpu` or a YAML list `[mig, gpu]` as an ordered tuple of kinds; raises ValueError saying what is
    wrong (the caller names the annotation or field). The value is bounded by the caller."""
    items = [str(v).strip() for v in value] if isinstance(value, list) else str(value).split(",")
    kinds = tuple(item.strip() for item in items)
    if not kinds:
        raise ValueError("is empty")
    if not all(kinds):
        raise ValueError("has an empty entry")
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"{kind[:16]!r} is not a device kind")
    if len(set(kinds)) != len(kinds):
        raise ValueError("names a device kind twice")
    return kinds


DEVICE_LIST_HELP = f"a device kind or an ordered list such as 'mig,gpu' of: {', '.join(KINDS)}"


# --- CUDA: the newest release a driver runs ---------------------------------------------------------------

# NVIDIA's CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions" (Linux x86_64):
# the oldest driver of each CUDA release's GA, newest first. A driver runs every CUDA release whose
# minimum it meets (the CUDA version `nvidia-smi` prints is the newest of them).
CUDA_MIN_DRIVER: tuple[tuple[tuple[int, int], tuple[int, ...]], ...] = (
    ((13, 2), (595, 45, 4)),
    ((13, 1), (590, 44, 1)),
    ((13, 0), (580, 65, 6)),
    ((12, 9), (575, 51, 3)),
    ((12, 8), (570, 26)),
    ((12, 6), (560, 28, 3)),
    ((12, 5), (555, 42, 2)),
    ((12, 4), (550, 54, 14)),
    ((12, 3), (545, 23, 6)),
    ((12, 2), (535, 54, 3)),
    ((12, 1), (530, 30, 2)),
    ((12, 0), (525, 60, 13)),
    ((11, 8), (520, 61, 5)),
    ((11, 7), (515, 43, 4)),
    ((11, 6), (510, 39, 1)),
    ((11, 5), (495, 29, 5)),
    ((11, 4), (470, 42, 1)),
    ((11, 3), (465, 19, 1)),
    ((11, 2), (460, 27, 3)),
    ((11, 1), (455, 23)),
    ((11, 0), (450, 51, 5)),
    ((10, 2), (440, 33)),
    ((10, 1), (418, 39)),
    ((10, 0), (410, 48)),
)


def cuda_of_driver(driver: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The newest CUDA release an NVIDIA driver runs, by the table above; None for an unknown driver or
    one older than CUDA 10.0's."""
    if driver is None:
        return None
    padded = driver + (0,) * (3 - len(driver))
    for cuda, minimum in CUDA_MIN_DRIVER:
        if padded >= minimum + (0,) * (3 - len(minimum)):
            return cuda
    return None
