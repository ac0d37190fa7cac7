"""MIG geometry: the GPU models gpupool can re-cut, their profiles, and whether instances fit one GPU.

A GPU's memory is cut into slices (8 on A100, H100 and H200; 4 on an A30). An instance of a profile
takes `slices` consecutive memory slices starting at one of the profile's allowed starts, instances may
not overlap, and a profile has at most `most` instances per GPU (NVIDIA's MIG user guide, "Supported MIG
Profiles"; docs/mig.md cites it). That rule alone gives every valid layout: 7x1g but not 8, 4g+3g,
3g+2g+2x1g, never 4g+2x2g (the second 2g would have to start at 6).

A profile's memory is what GPU Feature Discovery reports (`nvidia.com/mig-<profile>.memory`, MiB) where
that is known from a real node or `nvidia-smi mig -lgip`; instances that take the same memory slices
report the same memory (1g.20gb and 2g.20gb). Where nothing was measured the memory is an estimate
below what the instance has (`measured=False`): 97 % of the decimal gigabytes the name rounds up to. An
estimate errs on the side of judging that a Pod does not fit, which can only cost a re-cut, never make
one for a Pod that then does not fit. `Catalog.observed` replaces table values with what the fleet's
own labels say.

A node's GPU model comes from its product label (`nvidia.com/gpu.product`, GFD's `-MIG-<profile>`
suffix taken off); each product has the PCI device IDs mig-parted's `device-filter` names it by
(0x20B210DE: device 0x20B2 of vendor 0x10DE, as in the pci.ids database).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from webhook.domain.devices import profile_memory_mib, split_product
from webhook.domain.memory import meets_memory, sold_mib

NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True, slots=True)
class Profile:
    """A GPU instance profile on one GPU model, as mig-parted names it (`1g.10gb`, `1g.10gb+me`)."""

    name: str
    slices: int  # memory slices one instance takes
    starts: tuple[int, ...]  # the memory slices an instance may start at
    most: int  # instances per GPU at most
    memory_mib: int
    measured: bool = True  # False: an estimate below the real memory (see the module's docstring)

    def meets(self, min_mib: int) -> bool:
        """Does an instance meet `min-memory` of `min_mib` (its `.NNgb` as sold: webhook.domain.memory)?"""
        return meets_memory(min_mib, sold_mib(self.name), self.memory_mib)

    @property
    def label_name(self) -> str:
        """The profile as GPU Feature Discovery writes it in resources and labels (`+me` becomes `.me`)."""
        return self.name.replace("+", ".")


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A MIG-capable GPU model: its products (as GFD writes them), their PCI device IDs, its profiles."""

    name: str
    slices: int
    products: Mapping[str, tuple[int, ...]]  # product -> packed PCI IDs (device << 16 | vendor)
    profiles: Mapping[str, Profile] = field(default_factory=dict)

    def profile(self, name: str) -> Profile | None:
        return self.profiles.get(name)

    def smallest_fitting(self, memory_mib: int) -> Profile | None:
        """The profile with the least memory that still has `memory_mib` (fewest slices on a tie, then
        most instances per GPU): where a Pod asking that much would go."""
        fitting = [p for p in self.profiles.values() if p.meets(memory_mib) and "+" not in p.name]
        return min(fitting, key=lambda p: (p.memory_mib, p.slices, -p.most, p.name), default=None)


def packed(device: int, vendor: int = NVIDIA_VENDOR) -> int:
    return device << 16 | vendor


def _estimate(name: str) -> int:
    return profile_memory_mib(name) * 97 // 100


def _profiles(*rows: tuple[str, int, tuple[int, ...], int, int]) -> dict[str, Profile]:
    """(name, slices, starts, most, memory MiB or 0 for an estimate)."""
    return {
        name: Profile(name, slices, starts, most, memory or _estimate(name), measured=bool(memory))
        for name, slices, starts, most, memory in rows
    }


_ONE = tuple(range(7))  # a one-slice instance of an 8-slice GPU: any slice but the last
_TWO = (0, 2, 4, 6)
_TWO_COMPUTE = (0, 2, 4)  # a 2g instance: two slices, never the last pair
_HALF = (0, 4)

# What each model's profiles take, and their memory where a real node or nvidia-smi showed it (MiB):
# A100-80GB from GFD labels of an A100 80GB PCIe (9728, 19968, 40192) and 7g.80gb 80896; H100-80GB HBM3
# from `nvidia-smi mig -lgip` (9.75, 19.62, 39.50, 79.25 GiB; GFD labelled its 2g.20gb 20096); A100-40GB's
# 1g.5gb 4864 and 3g.20gb 19968, H100 PCIe's 1g.10gb 9856 (docs/mig.md: sources). The rest are estimates.
MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        "A100-40GB",
        8,
        {"NVIDIA-A100-SXM4-40GB": (packed(0x20B0),), "NVIDIA-A100-PCIE-40GB": (packed(0x20B1), packed(0x20F1))},
        _profiles(
            ("1g.5gb", 1, _ONE, 7, 4864),
            ("1g.5gb+me", 1, _ONE, 1, 4864),
            ("1g.10gb", 2, _TWO, 4, 0),
            ("2g.10gb", 2, _TWO_COMPUTE, 3, 0),
            ("3g.20gb", 4, _HALF, 2, 19968),
            ("4g.20gb", 4, (0,), 1, 19968),
            ("7g.40gb", 8, (0,), 1, 0),
        ),
    ),
    GpuModel(
        "A100-80GB",
        8,
        {"NVIDIA-A100-SXM4-80GB": (packed(0x20B2),), "NVIDIA-A100-80GB-PCIe": (packed(0x20B5),)},
        _profiles(
            ("1g.10gb", 1, _ONE, 7, 9728),
            ("1g.10gb+me", 1, _ONE, 1, 9728),
            ("1g.20gb", 2, _TWO, 4, 19968),
            ("2g.20gb", 2, _TWO_COMPUTE, 3, 19968),
            ("3g.40gb", 4, _HALF, 2, 40192),
            ("4g.40gb", 4, (0,), 1, 40192),
            ("7g.80gb", 8, (0,), 1, 80896),
        ),
    ),
    GpuModel(
        "H100-80GB",
        8,
        {"NVIDIA-H100-80GB-HBM3": (packed(0x2330),)},
        _profiles(
            ("1g.10gb", 1, _ONE, 7, 9984),
            ("1g.10gb+me", 1, _ONE, 1, 9984),
            ("1g.20gb", 2, _TWO, 4, 20096),
            ("2g.20gb", 2, _TWO_COMPUTE, 3, 20096),
            ("3g.40gb", 4, _HALF, 2, 40448),
            ("4g.40gb", 4, (0,), 1, 40448),
            ("7g.80gb", 8, (0,), 1, 81152),
        ),
    ),
    GpuModel(
        "H100-PCIe",
        8,
        {"NVIDIA-H100-PCIe": (packed(0x2331),)},
        _profiles(
            ("1g.10gb", 1, _ONE, 7, 9856),
            ("1g.10gb+me", 1, _ONE, 1, 9856),
            ("1g.20gb", 2, _TWO, 4, 0),
            ("2g.20gb", 2, _TWO_COMPUTE, 3, 0),
            ("3g.40gb", 4, _HALF, 2, 0),
            ("4g.40gb", 4, (0,), 1, 0),
            ("7g.80gb", 8, (0,), 1, 0),
        ),
    ),
    GpuModel(
        "H200",
        8,
        {"NVIDIA-H200": (packed(0x2335),), "NVIDIA-H200-NVL": (packed(0x233B),)},
        _profiles(
            ("1g.18gb", 1, _ONE, 7, 0),
            ("1g.18gb+me", 1, _ONE, 1, 0),
            ("1g.35gb", 2, _TWO, 4, 0),
            ("2g.35gb", 2, _TWO_COMPUTE, 3, 0),
            ("3g.71gb", 4, _HALF, 2, 0),
            ("4g.71gb", 4, (0,), 1, 0),
            ("7g.141gb", 8, (0,), 1, 0),
        ),
    ),
    GpuModel(
        "A30",
        4,
        {"NVIDIA-A30": (packed(0x20B7),)},
        _profiles(
            ("1g.6gb", 1, (0, 1, 2, 3), 4, 0),
            ("1g.6gb+me", 1, (0, 1, 2, 3), 1, 0),
            ("2g.12gb", 2, (0, 2), 2, 0),
            ("2g.12gb+me", 2, (0, 2), 1, 0),
            ("4g.24gb", 4, (0,), 1, 0),
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class Catalog:
    """The models gpupool knows, found by product; `observed` gives one with memory the fleet reports."""

    models: tuple[GpuModel, ...] = MODELS
    _by_product: dict[str, GpuModel] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for model in self.models:
            for product in model.products:
                self._by_product[product.casefold()] = model

    def model_of(self, product: str) -> GpuModel | None:
        """The model of a product label (`NVIDIA-A100-SXM4-80GB`, also with GFD's `-MIG-1g.10gb`); None
        when gpupool knows no MIG geometry for it."""
        return self._by_product.get(split_product(product).model.casefold())

    def device_ids(self, product: str) -> tuple[int, ...]:
        model = self.model_of(product)
        if model is None:
            return ()
        wanted = split_product(product).model.casefold()
        return next((ids for p, ids in model.products.items() if p.casefold() == wanted), ())

    def observed(self, memory: Iterable[tuple[str, str, int]]) -> Catalog:
        """The catalog with the memory GFD reports on the fleet's nodes: (product, profile as GFD writes
        it, MiB) from their `nvidia.com/mig-<profile>.memory` labels. Unknown products and profiles, and
        values no instance could have (0, or more than its GPU's share says by a factor of two), are
        left out."""
        seen: dict[tuple[str, str], int] = {}
        for product, label_profile, mib in memory:
            model = self.model_of(product)
            if model is None:
                continue
            profile = next((p for p in model.profiles.values() if p.label_name == label_profile), None)
            if profile is not None and 0 < mib <= 2 * profile_memory_mib(profile.name):
                key = (model.name, profile.name)
                seen[key] = min(seen.get(key, mib), mib)  # two SKUs of one model: the smaller
        if not seen:
            return self
        models = tuple(
            replace(
                m,
                profiles={
                    n: replace(p, memory_mib=seen[m.name, n], measured=True) if (m.name, n) in seen else p
                    for n, p in m.profiles.items()
                },
            )
            for m in self.models
        )
        return Catalog(models)


def placement(model: GpuModel, counts: Mapping[str, int]) -> tuple[tuple[str, int], ...] | str:
    """Where each instance of `counts` (profile -> instances on one GPU) would start, or why they
    cannot all be on one GPU of `model`. A search over the allowed starts, largest instances first:
    at most 8 instances and 7 starts each, so it is small whatever the input."""
    wanted: list[Profile] = []
    for name, count in sorted(counts.items()):
        if count <= 0:
            continue
        profile = model.profile(name)
        if profile is None:
            known = ", ".join(model.profiles)
            return f"{model.name} has no MIG profile {name!r} (it has {known})"
        if count > profile.most:
            return f"{model.name} holds at most {profile.most} x {name}, not {count}"
        wanted.extend([profile] * count)
    if sum(p.slices for p in wanted) > model.slices:
        return f"{_show(counts)} takes more than the {model.slices} memory slices of one {model.name}"
    wanted.sort(key=lambda p: (-p.slices, p.name))
    starts: list[int] = []

    def place(i: int, used: int) -> bool:
        if i == len(wanted):
            return True
        profile = wanted[i]
        mask = (1 << profile.slices) - 1
        for start in profile.starts:
            if start + profile.slices <= model.slices and not used & (mask << start):
                starts.append(start)
                if place(i + 1, used | mask << start):
                    return True
                starts.pop()
        return False

    if not place(0, 0):
        return f"{_show(counts)} does not fit on one {model.name}: no placement of its instances avoids an overlap"
    return tuple((p.name, s) for p, s in zip(wanted, starts, strict=True))


def _show(counts: Mapping[str, int]) -> str:
    return " + ".join(f"{n} x {p}" for p, n in sorted(counts.items()) if n > 0) or "nothing"
