"""A k8s-mig-manager stand-in: re-cuts a simulated node when its `nvidia.com/mig.config` label changes.

As NVIDIA's mig-manager does (docs/mig.md, "What mig-manager does"), per node, from the same
mig-parted config the code under test reads:

- a name the config lacks, or whose result on the node's GPUs webhook.mig.layouts cannot tell (or
  knows would fail): `nvidia.com/mig.config.state=failed` at once;
- a layout the node already shows (GFD's labels and allocatable): `success`, nothing else;
- otherwise `pending`, the operator's deploy labels (`nvidia.com/gpu.deploy.device-plugin`,
  `.gpu-feature-discovery`, `.dcgm-exporter`, `.dcgm`, `.nvsm`) set to `paused-for-mig-change` (those
  that are `false` stay so), and the node's MIG resources (and `nvidia.com/gpu`) allocatable 0, as
  when the device plugin is gone; after `delay` seconds GFD's labels and the allocatable are rewritten
  for the new layout (mixed strategy: `nvidia.com/mig-<profile>.count`, `.memory`, `.product`,
  `.replicas`, `.sharing-strategy`, `.slices.gi`, `.slices.ci` and allocatable
  `nvidia.com/mig-<profile>`; single strategy, for a layout of one profile: `nvidia.com/gpu.product`
  `<model>-MIG-<profile>`, `.count`, `.memory`, allocatable `nvidia.com/gpu`; several profiles under
  single: GFD's `-MIG-INVALID` labels), the deploy labels back to `true`, and `success`.

Knobs: `fail` (node names, or a function of the node's name and the layout) ends a change `failed` after
the delay, leaving the old layout; `stuck` leaves it `pending` forever (as mig-manager before v0.15.1
could). And a Pod using the node's GPUs (a non-terminated Pod bound there that requests `nvidia.com/gpu`
or `nvidia.com/mig-*`) while the layout changes, from the moment the label changes until `success` or
`failed`, is recorded in `violations` (once per Pod and change); when one is there as the layout is
applied, the change fails, as mig-parted does on GPUs in use.

`step(now)` does one round without the thread, for tests that want no timing at all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.domain.devices import split_product
from webhook.mig.config import MigConfig, parse_config
from webhook.mig.follow import shows
from webhook.mig.layouts import Layouts, Yield, gpu_count
from webhook.testing.kubefit import TERMINAL
from webhook.testing.kubestore import Store, kind_of

log = logging.getLogger(__name__)
Obj = dict[str, Any]
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
STRATEGY_LABEL = "nvidia.com/mig.strategy"
PRODUCT_LABEL = "nvidia.com/gpu.product"
PAUSED = "paused-for-mig-change"
DEPLOY_LABELS = tuple(
    f"nvidia.com/gpu.deploy.{c}" for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")
)
MIG_PREFIX = "nvidia.com/mig-"
GPU = "nvidia.com/gpu"
_NODES = kind_of("nodes")
_PODS = kind_of("pods")


@dataclass(slots=True)
class _Change:
    layout: str
    due: float
    before: dict[str, Any]  # the allocatable before `pending` zeroed it: what a failed change leaves
    saw: set[str] = field(default_factory=set)  # Pods already recorded as violations


class MigManager:
    """Plays mig-manager on every node of `store` (see the module's docstring)."""

    def __init__(
        self,
        store: Store,
        config: str | MigConfig,
        *,
        delay: float = 1.0,
        fail: Collection[str] | Callable[[str, str], bool] = (),
        stuck: Collection[str] = (),
        tick: float = 0.02,
    ) -> None:
        self._store = store
        parsed = parse_config(config) if isinstance(config, str) else config
        self.layouts = Layouts(parsed, tuple(parsed.layouts))  # mig-manager applies any name of its config
        self.delay = delay
        self._fail = fail
        self.stuck = set(stuck)
        self._tick = tick
        self._seen: dict[str, str] = {}  # node -> the label value last acted on
        self._changes: dict[str, _Change] = {}
        self._gpus: dict[str, int] = {}  # node -> physical GPUs, read before a change (single: counts instances)
        self.violations: list[dict[str, str]] = []
        self.history: list[tuple[str, str, str]] = []  # (node, layout, outcome) per change: success, failed
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        with store.changed:
            for name, node in self._nodes():
                self._settled(name, node)

    def start(self) -> MigManager:
        if self._thread is not None:
            raise RuntimeError("the mig-manager stand-in is already running")
        self._thread = threading.Thread(target=self._loop, name="kubesim-mig-manager", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self._tick):
                self.step()
        except Exception as exc:
            self.errors.append(exc)
            log.exception("kubesim mig-manager failed")
            raise

    def changing(self) -> set[str]:
        """The nodes whose layout is changing now."""
        with self._store.changed:
            return set(self._changes)

    # -- one round ------------------------------------------------------------------------------

    def step(self, now: float | None = None) -> None:
        with self._store.changed:
            now = time.monotonic() if now is None else now
            for name, node in self._nodes():
                if name not in self._seen:
                    self._settled(name, node)
                wanted = _labels(node).get(CONFIG_LABEL, "")
                if wanted != self._seen.get(name, ""):
                    self._seen[name] = wanted
                    self._begin(name, node, wanted, now)
            for name in sorted(self._changes):
                self._watch_pods(name)
                change = self._changes[name]
                if now >= change.due and name not in self.stuck:
                    self._finish(name, change)

    def _settled(self, name: str, node: Obj) -> None:
        """Note a node whose layout is in place: its label, and its physical GPUs (which the single
        strategy's labels count only through the layout in place)."""
        labels = _labels(node)
        self._seen[name] = labels.get(CONFIG_LABEL, "")
        self._gpus[name] = gpu_count(labels, self.layouts.config, self.layouts.catalog)

    def _begin(self, name: str, node: Obj, wanted: str, now: float) -> None:
        replaced = self._changes.pop(name, None)  # a new name replaces a change under way
        if replaced is not None:
            node.setdefault("status", {})["allocatable"] = dict(replaced.before)
        chosen = self._yield(node, wanted)
        labels = _labels(node)
        if isinstance(chosen, str):
            log.info("kubesim mig-manager: %s: %s", name, chosen)
            labels[STATE_LABEL] = "failed"
            self.history.append((name, wanted, "failed"))
            self._put(node)
            return
        if shows(chosen, labels, _counts(_allocatable(node))):
            labels[STATE_LABEL] = "success"
            self._put(node)
            return
        labels[STATE_LABEL] = "pending"
        for key in DEPLOY_LABELS:
            labels[key] = "false" if labels.get(key) == "false" else PAUSED
        allocatable = _allocatable(node)
        before = dict(allocatable)
        for resource in list(allocatable):
            if resource == GPU or resource.startswith(MIG_PREFIX):
                allocatable[resource] = "0"
        self._changes[name] = _Change(wanted, now + self.delay, before)
        self._put(node)
        self._watch_pods(name)

    def _finish(self, name: str, change: _Change) -> None:
        del self._changes[name]
        node = self._node(name)
        if node is None:
            return
        labels = _labels(node)
        chosen = self._yield(node, change.layout)
        failed = isinstance(chosen, str) or bool(change.saw) or self._failing(name, change.layout)
        if not failed and isinstance(chosen, Yield):
            _relabel(node, chosen, labels.get(STRATEGY_LABEL, "mixed"))
        else:  # the GPUs stay as they were
            node["status"]["allocatable"] = change.before
        for key in DEPLOY_LABELS:
            labels[key] = "false" if labels.get(key) == "false" else "true"
        outcome = "failed" if failed else "success"
        labels[STATE_LABEL] = outcome
        self.history.append((name, change.layout, outcome))
        self._put(node)

    def _failing(self, name: str, layout: str) -> bool:
        return self._fail(name, layout) if callable(self._fail) else name in self._fail

    def _watch_pods(self, name: str) -> None:
        change = self._changes[name]
        for key, pod in self._pods_on(name):
            if key not in change.saw:
                change.saw.add(key)
                phase = str((pod.get("status") or {}).get("phase") or "Pending")
                self.violations.append({"node": name, "pod": key, "phase": phase, "layout": change.layout})

    # -- the store ------------------------------------------------------------------------------

    def _yield(self, node: Obj, layout: str) -> Yield | str:
        labels = _labels(node)
        gpus = self._gpus.get(str(node["metadata"]["name"]), 0)
        found = self.layouts.on(labels.get(PRODUCT_LABEL, ""), gpus).get(layout)
        return found if found is not None else f"the mig-parted config has no layout {layout!r}"

    def _nodes(self) -> list[tuple[str, Obj]]:
        snap = self._store.snapshot(_NODES)
        return [(k.rsplit("/", 1)[-1], orjson.loads(b)) for k, b in zip(snap.keys, snap.bodies, strict=True)]

    def _node(self, name: str) -> Obj | None:
        body = self._store.get(_NODES, "", name)
        return None if body is None else orjson.loads(body)

    def _pods_on(self, name: str) -> list[tuple[str, Obj]]:
        snap = self._store.snapshot(_PODS)
        found = []
        for key, body in zip(snap.keys, snap.bodies, strict=True):
            pod = orjson.loads(body)
            spec = pod.get("spec") or {}
            if spec.get("nodeName") != name or (pod.get("status") or {}).get("phase") in TERMINAL:
                continue
            if _uses_gpus(spec):
                found.append((key, pod))
        return found

    def _put(self, node: Obj) -> None:
        node["kind"] = "Node"
        self._store.put(node, exists=True)


def _labels(node: Obj) -> dict[str, str]:
    return node.setdefault("metadata", {}).setdefault("labels", {})  # type: ignore[no-any-return]


def _allocatable(node: Obj) -> dict[str, Any]:
    status = node.setdefault("status", {})
    return status.setdefault("allocatable", {})  # type: ignore[no-any-return]


def _counts(allocatable: dict[str, Any]) -> dict[str, int]:
    return {k: int(v) for k, v in allocatable.items() if isinstance(v, str | int) and str(v).isdigit()}


def _uses_gpus(spec: Obj) -> bool:
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = (c or {}).get("resources") or {}
        for part in ("limits", "requests"):
            if any(r == GPU or r.startswith(MIG_PREFIX) for r in resources.get(part) or {}):
                return True
    return False


def _relabel(node: Obj, chosen: Yield, strategy: str) -> None:
    """GFD's labels and the device plugin's allocatable for `chosen`, as they are after a re-cut."""
    labels, allocatable = _labels(node), _allocatable(node)
    for key in [k for k in labels if k.startswith(MIG_PREFIX)]:
        del labels[key]
    for resource in [r for r in allocatable if r.startswith(MIG_PREFIX)]:
        del allocatable[resource]
    model = split_product(labels.get(PRODUCT_LABEL, "")).model
    if strategy == "single":
        profiles = [(p, n) for p, n in chosen.instances]
        if len(profiles) != 1 or chosen.whole_gpus:
            labels.update({PRODUCT_LABEL: f"{model}-MIG-INVALID", "nvidia.com/gpu.count": "0"})
            labels.update({"nvidia.com/gpu.memory": "0", "nvidia.com/gpu.replicas": "0"})
            allocatable[GPU] = "0"
            return
        ((profile, count),) = profiles
        labels.update({PRODUCT_LABEL: f"{model}-MIG-{profile.label_name}", "nvidia.com/gpu.count": str(count)})
        labels.update({"nvidia.com/gpu.memory": str(profile.memory_mib), "nvidia.com/gpu.replicas": "1"})
        allocatable[GPU] = str(count)
        return
    for profile, count in chosen.instances:
        base = f"{MIG_PREFIX}{profile.label_name}"
        compute = profile.name.split("g.", 1)[0].rsplit(".", 1)[-1]
        labels.update(
            {
                f"{base}.count": str(count),
                f"{base}.memory": str(profile.memory_mib),
                f"{base}.product": f"{model}-MIG-{profile.label_name}",
                f"{base}.replicas": "1",
                f"{base}.sharing-strategy": "none",
                f"{base}.slices.gi": compute,
                f"{base}.slices.ci": compute,
            }
        )
        allocatable[base] = str(count)
    allocatable[GPU] = str(chosen.whole_gpus)
