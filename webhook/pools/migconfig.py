"""mig-parted's config as the inventory last saw it (the ConfigMap the policy's `migReshaping.configMap`
names), with the layouts gpupool may choose of it: what admission reads to tell whether a MIG re-cut could
serve a Pod no current layout can (webhook.admission.recut). The queue's leader reads the ConfigMap
itself (webhook.queue.reshape); both read its text by `config_text`.

Kept in the pool index (`PoolIndex.mig`), fed by the inventory's sources: the live inventory follows the
one ConfigMap by a watch of its own when the policy has `migReshaping`, a snapshot holds it if captured.
Parsed once per text seen, never per admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.domain.policy_model import MigReshaping
from webhook.mig.config import MigConfigError, parse_config
from webhook.mig.layouts import Layouts

CONFIG_KEY = "config.yaml"  # the GPU Operator's key; a ConfigMap with one key is read by it whatever its name


def config_text(data: Mapping[str, Any], key: str = CONFIG_KEY) -> str | None:
    """The text of mig-parted's config in a ConfigMap's `data`: its `key`, else its only key; None when it
    has neither (or the value is not text)."""
    value = data.get(key) if key in data else (next(iter(data.values())) if len(data) == 1 else None)
    return value if isinstance(value, str) else None


class MigLayouts:
    """The layouts gpupool may choose (`layouts`), from the ConfigMap as last seen; None, with `problem`
    saying why, while it is unseen, gone, or not a valid mig-parted config."""

    def __init__(self, settings: MigReshaping | None) -> None:
        self.settings = settings
        self.layouts: Layouts | None = None
        self._text: str | None = None
        self._seen = False
        self._present = False
        where = "" if settings is None else "/".join(settings.config_map)
        self.problem = "migReshaping is not in the policy" if settings is None else f"ConfigMap {where} not seen"

    @property
    def present(self) -> bool:
        """Was the ConfigMap there when last seen?"""
        return self._present

    def names(self, namespace: str, name: str) -> bool:
        """Is this the ConfigMap the policy names?"""
        return self.settings is not None and self.settings.config_map == (namespace, name)

    def see(self, obj: Mapping[str, Any] | None) -> bool:
        """The ConfigMap as it is now (None: deleted); True when what it yields changed."""
        if self.settings is None:
            return False
        where = "/".join(self.settings.config_map)
        data = obj.get("data") if obj is not None else None
        text = config_text(data) if isinstance(data, Mapping) else None
        self._present = obj is not None
        if self._seen and text == self._text:
            return False
        self._seen, self._text = True, text
        self.layouts = None
        if text is None:
            self.problem = f"ConfigMap {where} " + ("is gone" if obj is None else f"has no key {CONFIG_KEY}")
            return True
        try:
            config = parse_config(text)
        except MigConfigError as exc:
            self.problem = f"ConfigMap {where} is not a valid mig-parted config: {exc}"
            return True
        self.layouts = Layouts.choosable(config, self.settings.configs)
        self.problem = ""
        return True
