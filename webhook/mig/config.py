"""mig-parted's config file, read as hostile input: the named layouts mig-manager can apply.

The format (NVIDIA/mig-parted `api/spec/v1`):

    version: v1
    mig-configs:
      all-1g.10gb:
        - device-filter: ["0x233010DE", "0x20B210DE"]   # optional: PCI IDs, one string or a list
          devices: all                                 # or GPU indexes [0, 1]
          mig-enabled: true
          mig-devices: {"1g.10gb": 7}

A layout is a list of entries; mig-parted walks them in order and applies each to every GPU its
device filter and devices match, so a GPU that two entries match ends with the last one's. mig-parted
refuses a file without `version: v1`, with an unknown field, an empty `mig-configs` or layout, an entry
without `devices` or `mig-enabled`, `mig-enabled: true` without `mig-devices`, MIG devices with
`mig-enabled: false`, a profile it cannot read, a negative count, or counts that are all 0; so does
this reader, each time naming the field (`mig-configs.all-1g.10gb[1].mig-devices`). It also bounds what
it reads (the text, the layouts, entries, filters and devices) and refuses YAML aliases, so a hostile
ConfigMap costs at most its size to read.

A device filter mig-parted cannot parse matches no GPU there (it ignores the error); here it makes its
layout unusable, with the reason (`Layout.problem`), and the rest of the file stays usable. So does a
layout name that cannot be a label value: mig-manager reads the name from the node label
`nvidia.com/mig.config`, so such a layout can never be asked for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from webhook.domain.errors import ConfigError, yaml_problem

MAX_TEXT = 1024 * 1024  # a ConfigMap holds at most 1 MiB
MAX_LAYOUTS = 1024
MAX_ENTRIES = 64  # per layout (the GPU Operator's longest has 11)
MAX_FILTERS = 64  # device IDs per entry
MAX_DEVICES = 64  # GPU indexes per entry
MAX_INDEX = 1023
MAX_PROFILES = 32  # profiles per entry
MAX_COUNT = 64  # instances of one profile per GPU (7 at most on any GPU so far)

# mig-parted's profile grammar: [<c>c.]<g>g.<memory>gb[+attribute[.attribute]] (attributes me, gfx,
# me.all, or -me for "without"), bounded.
_PROFILE = re.compile(r"(?:[1-9][0-9]?c\.)?[1-9][0-9]?g\.[1-9][0-9]{0,3}gb(?:[+-][a-z]{1,8}(?:\.[a-z]{1,8}){0,3})?")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)")
_DEVICE_ID = re.compile(r"0[xX][0-9A-Fa-f]{1,8}|[0-9]{1,10}")


class MigConfigError(ConfigError):
    """The mig-parted config cannot be read; the message names the field and what is accepted."""


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """One `device-filter` value: a packed PCI ID (device << 16 | vendor), optionally qualified by the
    subsystem (`0x20B210DE:0x147E10DE`), which node labels never tell."""

    text: str
    device_id: int
    subsystem: int | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    devices: tuple[int, ...] | None  # None: all
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...]  # profile -> instances per GPU, the 0 counts left out
    device_filter: tuple[DeviceFilter, ...]  # () matches every GPU


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    entries: tuple[Entry, ...]
    problem: str = ""  # why gpupool never chooses it ("" when it may)

    @property
    def mig_enabled(self) -> bool:
        """Does it put some GPU in MIG mode with instances (the layouts a policy may choose by default)?"""
        return any(e.mig_enabled and e.mig_devices for e in self.entries)


@dataclass(frozen=True, slots=True)
class MigConfig:
    layouts: Mapping[str, Layout]

    def mig_enabled(self) -> tuple[str, ...]:
        """The names of the layouts that cut some GPU into instances, sorted."""
        return tuple(sorted(n for n, layout in self.layouts.items() if layout.mig_enabled))


class _NoAliases(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases: a few bytes of anchors and aliases can stand for a
    document too large to walk."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "YAML aliases are not accepted", event.start_mark)
        return super().compose_node(parent, index)


def parse_config(text: str, source: str = "mig-parted config") -> MigConfig:
    """The config from its text (the ConfigMap's `config.yaml`); MigConfigError naming `source` and the
    field when mig-parted would refuse it or it is past a bound."""
    if len(text) > MAX_TEXT:
        raise MigConfigError(f"{source}: {len(text)} characters, more than the {MAX_TEXT} a ConfigMap can hold")
    try:
        data = yaml.load(text, Loader=_NoAliases)
    except yaml.YAMLError as exc:
        raise MigConfigError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None
    except RecursionError:
        raise MigConfigError(f"{source}: nested too deeply to be a mig-parted config") from None
    try:
        return _config(data)
    except MigConfigError as exc:
        raise MigConfigError(f"{source}: {exc}") from None


def _config(data: Any) -> MigConfig:
    if not isinstance(data, dict):
        raise MigConfigError(f"expected a mapping with version and mig-configs, got {_show(data)}")
    for key in data:
        if key not in ("version", "mig-configs"):
            raise MigConfigError(f"{_show(key)}: unexpected field; accepted: version, mig-configs")
    if data.get("version") != "v1":
        raise MigConfigError(f"version: {_show(data.get('version'))} is not v1, the only version mig-parted reads")
    configs = data.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigConfigError(f"mig-configs: expected a mapping of layout names to entries, got {_show(configs)}")
    if len(configs) > MAX_LAYOUTS:
        raise MigConfigError(f"mig-configs: {len(configs)} layouts, more than the {MAX_LAYOUTS} accepted")
    layouts: dict[str, Layout] = {}
    for name, entries in configs.items():
        if not isinstance(name, str) or not name:
            raise MigConfigError(f"mig-configs: a layout name must be a non-empty string, got {_show(name)}")
        layouts[name] = _layout(name, entries)
    return MigConfig(layouts)


def _layout(name: str, data: Any) -> Layout:
    path = f"mig-configs.{_short(name)}"
    if not isinstance(data, list) or not data:
        raise MigConfigError(f"{path}: expected a non-empty list of entries, got {_show(data)}")
    if len(data) > MAX_ENTRIES:
        raise MigConfigError(f"{path}: {len(data)} entries, more than the {MAX_ENTRIES} accepted")
    problems: list[str] = []
    entries = tuple(_entry(f"{path}[{i}]", item, problems) for i, item in enumerate(data))
    if not _LABEL_VALUE.fullmatch(name):
        problems.insert(
            0,
            f"{path}: the name cannot be a label value (at most 63 letters, digits, '-', '_', '.'), so "
            "nvidia.com/mig.config can never name it",
        )
    return Layout(name, entries, problems[0] if problems else "")


def _entry(path: str, data: Any, problems: list[str]) -> Entry:
    if not isinstance(data, dict):
        raise MigConfigError(f"{path}: expected a mapping (devices, mig-enabled, ...), got {_show(data)}")
    accepted = ("device-filter", "devices", "mig-enabled", "mig-devices")
    for key in data:
        if key not in accepted:
            raise MigConfigError(f"{path}.{_short(str(key))}: unexpected field; accepted: {', '.join(accepted)}")
    for key in ("devices", "mig-enabled"):
        if key not in data:
            raise MigConfigError(f"{path}: missing required field {key}")
    enabled = data["mig-enabled"]
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{path}.mig-enabled: expected true or false, got {_show(enabled)}")
    devices = _devices(f"{path}.devices", data["devices"])
    if enabled and "mig-devices" not in data:
        raise MigConfigError(f"{path}: mig-devices is required when mig-enabled is true")
    mig_devices = _mig_devices(f"{path}.mig-devices", data.get("mig-devices") or {})
    if not enabled and mig_devices:
        raise MigConfigError(f"{path}.mig-devices: MIG devices are listed while mig-enabled is false")
    filters = _filters(f"{path}.device-filter", data.get("device-filter"), problems)
    return Entry(devices, enabled, mig_devices, filters)


def _devices(path: str, value: Any) -> tuple[int, ...] | None:
    if value == "all":
        return None
    if not isinstance(value, list) or len(value) > MAX_DEVICES:
        raise MigConfigError(
            f"{path}: expected 'all' or a list of at most {MAX_DEVICES} GPU indexes, got {_show(value)}"
        )
    for i in value:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_INDEX:
            raise MigConfigError(f"{path}: {_show(i)} is not a GPU index from 0 to {MAX_INDEX}")
    return tuple(value)


def _mig_devices(path: str, value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict):
        raise MigConfigError(f"{path}: expected a mapping of MIG profile to count, got {_show(value)}")
    if len(value) > MAX_PROFILES:
        raise MigConfigError(f"{path}: {len(value)} profiles, more than the {MAX_PROFILES} accepted")
    counts: list[tuple[str, int]] = []
    for profile, count in value.items():
        if not isinstance(profile, str) or not _PROFILE.fullmatch(profile):
            raise MigConfigError(
                f"{path}: {_show(profile)} is not a MIG profile; accepted: [<c>c.]<g>g.<memory>gb[+attribute], "
                "such as 3g.40gb"
            )
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            raise MigConfigError(f"{path}.{profile}: {_show(count)} is not a count from 0 to {MAX_COUNT}")
        if count:
            counts.append((profile, count))
    if value and not counts:
        raise MigConfigError(f"{path}: every count is 0")
    return tuple(sorted(counts))


def _filters(path: str, value: Any, problems: list[str]) -> tuple[DeviceFilter, ...]:
    if value is None or value == "":
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise MigConfigError(f"{path}: expected a PCI device ID or a list of them, got {_show(value)}")
    if len(items) > MAX_FILTERS:
        raise MigConfigError(f"{path}: {len(items)} device IDs, more than the {MAX_FILTERS} accepted")
    filters: list[DeviceFilter] = []
    for i, text in enumerate(items):
        parsed = _device_filter(text)
        if parsed is None:  # mig-parted ignores the error and matches no GPU with it
            problems.append(
                f"{path}[{i}]: {_show(text)} is not a PCI device ID such as 0x20B210DE (or "
                "0x20B210DE:0x147E10DE), so mig-parted would match no GPU with it"
            )
        else:
            filters.append(parsed)
    return tuple(filters)


def _device_filter(text: str) -> DeviceFilter | None:
    parts = text.split(":")
    if len(parts) > 2 or not all(_DEVICE_ID.fullmatch(p) for p in parts):
        return None
    numbers = [int(p, 0) if p[:2].lower() == "0x" else int(p) for p in parts]
    if any(n > 0xFFFFFFFF for n in numbers):
        return None
    return DeviceFilter(text, numbers[0], numbers[1] if len(numbers) == 2 else None)


def _short(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:77]}..."


def _show(value: Any) -> str:
    if value is None:
        return "nothing"
    shown = repr(value)
    return shown if len(shown) <= 80 else f"{shown[:77]}..."
