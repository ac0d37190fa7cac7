"""What a named layout yields on a node's GPUs: instances per profile, by device filter and GPU model.

mig-parted applies a layout's entries in order to every GPU whose PCI ID its `device-filter` matches
(an empty filter matches all) and whose index its `devices` names (`all`: every index); a GPU that
several entries match ends with the last one's. So one name can mean different cuts on different
models (`all-1g.10gb`: 7 x 1g.10gb on an A100-80GB, 4 x 1g.10gb on an A100-40GB) and nothing at all on
a model its filters leave out.

gpupool only chooses a layout whose result it can tell in advance, on every GPU of the node:
- the node's product is one whose MIG geometry it knows (webhook.mig.geometry), and its GPU count is
  known (`nvidia.com/gpu.count`);
- every GPU is matched by some entry (mig-manager leaves an unmatched GPU as it is, whatever that is);
- no filter may or may not match (a product sold under two PCI IDs that a filter names only one of, or
  a filter qualified by the subsystem, which no label tells);
- every GPU's instances fit its geometry (profiles it has, counts within its most, a placement without
  overlap): `all-3g.40gb` on an A100-40GB would leave mig-manager `failed`.
Otherwise the layout yields a reason instead, which `gpupool explain` and the planner's output show.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from webhook.domain.devices import split_product
from webhook.mig.config import Entry, Layout, MigConfig
from webhook.mig.geometry import Catalog, GpuModel, Profile, placement

MAX_GPUS = 64  # GPUs per node gpupool plans for (a node with more is judged as unknown)
_MEMO = 4096  # (layout, product, GPUs) answers kept


@dataclass(frozen=True, slots=True)
class Yield:
    """What a layout leaves on a node: instances of each profile (over all its GPUs) and whole GPUs."""

    layout: str
    model: GpuModel
    instances: tuple[tuple[Profile, int], ...]  # by profile name
    whole_gpus: int = 0

    def count(self, profile: str) -> int:
        return sum(n for p, n in self.instances if p.name == profile)

    @property
    def memory_mib(self) -> int:
        """The GPU memory of all its instances."""
        return sum(p.memory_mib * n for p, n in self.instances)

    def describe(self) -> str:
        parts = [f"{n} x {p.name}" for p, n in self.instances]
        if self.whole_gpus:
            parts.append(f"{self.whole_gpus} whole GPUs")
        return ", ".join(parts) or "no instances"


def layout_yield(layout: Layout, product: str, gpus: int, catalog: Catalog) -> Yield | str:
    """What `layout` would leave on a node of `gpus` GPUs of `product`, or why gpupool cannot tell (or
    knows it would fail)."""
    if layout.problem:
        return layout.problem
    model = catalog.model_of(product)
    if model is None:
        return f"gpupool knows no MIG geometry of {split_product(product).model or 'an unknown product'}"
    if not 0 < gpus <= MAX_GPUS:
        return "the node's GPU count is unknown (nvidia.com/gpu.count)"
    ids = catalog.device_ids(product)
    matching: list[Entry] = []
    for i, entry in enumerate(layout.entries):
        match = _filter_matches(entry, ids)
        if match is None:
            return (
                f"entry {i} of {layout.name}: its device-filter may or may not match a "
                f"{split_product(product).model} ({_ids(ids)}), so its result cannot be told"
            )
        if match:
            matching.append(entry)
    per_gpu: Counter[tuple[tuple[str, int], ...]] = Counter()
    whole = 0
    for index in range(gpus):
        final = None
        for entry in matching:
            if entry.devices is None or index in entry.devices:
                final = entry
        if final is None:
            return f"no entry of {layout.name} matches GPU {index} of the node, which mig-manager would leave as it is"
        if final.mig_enabled:
            per_gpu[final.mig_devices] += 1
        else:
            whole += 1
    totals: Counter[str] = Counter()
    for mig_devices, gpu_count in per_gpu.items():
        fits = placement(model, dict(mig_devices))
        if isinstance(fits, str):
            return f"{layout.name}: {fits}"
        for profile, n in mig_devices:
            totals[profile] += n * gpu_count
    instances = tuple((p, totals[name]) for name, p in sorted(model.profiles.items()) if totals[name])
    return Yield(layout.name, model, instances, whole)


def _filter_matches(entry: Entry, ids: tuple[int, ...]) -> bool | None:
    """Does the entry's device filter match the product's GPUs: True, False, or None when it may or may
    not (it names some of the product's PCI IDs but not all, or qualifies one by subsystem)."""
    if not entry.device_filter:
        return True
    plain = {f.device_id for f in entry.device_filter if f.subsystem is None}
    qualified = {f.device_id for f in entry.device_filter if f.subsystem is not None}
    if ids and all(i in plain for i in ids):
        return True
    if any(i in plain or i in qualified for i in ids):
        return None
    return False


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(f"0x{i:08X}" for i in ids) or "no known PCI ID"


@dataclass(slots=True)
class Layouts:
    """The layouts of one mig-parted config that gpupool may choose (`names`), with what each yields
    on a kind of node, remembered per (product, GPU count): a fleet has few kinds."""

    config: MigConfig
    names: tuple[str, ...]
    catalog: Catalog = field(default_factory=Catalog)
    _memo: dict[tuple[str, int], Mapping[str, Yield | str]] = field(default_factory=dict, repr=False)

    @classmethod
    def choosable(cls, config: MigConfig, names: Iterable[str] = (), catalog: Catalog | None = None) -> Layouts:
        """The layouts named (every MIG-enabled one of the config when none is); a name the config
        lacks is kept, yielding that reason, so the problem is shown rather than hidden."""
        chosen = tuple(dict.fromkeys(names)) or config.mig_enabled()
        return cls(config, chosen, catalog or Catalog())

    def on(self, product: str, gpus: int) -> Mapping[str, Yield | str]:
        """Each layout's yield (or why not) on a node of `gpus` GPUs of `product`."""
        key = (split_product(product).model.casefold(), gpus)
        found = self._memo.get(key)
        if found is None:
            found = {name: self._one(name, product, gpus) for name in self.names}
            if len(self._memo) >= _MEMO:
                self._memo.clear()
            self._memo[key] = found
        return found

    def usable(self, product: str, gpus: int) -> dict[str, Yield]:
        return {name: y for name, y in self.on(product, gpus).items() if isinstance(y, Yield)}

    def _one(self, name: str, product: str, gpus: int) -> Yield | str:
        layout = self.config.layouts.get(name)
        if layout is None:
            return f"the mig-parted config has no layout {name!r}"
        return layout_yield(layout, product, gpus, self.catalog)


def gpu_count(labels: Mapping[str, str], config: MigConfig, catalog: Catalog) -> int:
    """The node's physical GPUs, from GFD's labels: `nvidia.com/gpu.count`, except under the single MIG
    strategy, where that counts instances: then it is divided by what the layout in place
    (`nvidia.com/mig.config`) puts on one GPU. 0 when unknown."""
    text = labels.get("nvidia.com/gpu.count", "")
    count = int(text) if text.isascii() and text.isdigit() and len(text) <= 4 else 0
    product = labels.get("nvidia.com/gpu.product", "")
    if not split_product(product).profile:
        return count
    layout = config.layouts.get(labels.get("nvidia.com/mig.config", ""))
    one = layout_yield(layout, product, 1, catalog) if layout is not None else "no layout"
    per_gpu = sum(n for _, n in one.instances) if isinstance(one, Yield) else 0
    return count // per_gpu if per_gpu and count % per_gpu == 0 else 0
