"""The namespaces' ResourceQuotas on GPU resources, as last seen (projected by webhook.pools.kubeobj).

Written only by the pool index (webhook.pools.index), which counts each write as a change; everyone
else reads it as a `QuotaView` (webhook.pools.views).
"""

from __future__ import annotations

from webhook.domain.model import QuotaInfo


class QuotaStore:
    """ResourceQuotas by namespace and name."""

    def __init__(self) -> None:
        self._quotas: dict[str, dict[str, QuotaInfo]] = {}

    def upsert(self, quota: QuotaInfo) -> None:
        self._quotas.setdefault(quota.namespace, {})[quota.name] = quota

    def remove(self, namespace: str, name: str) -> None:
        quotas = self._quotas.get(namespace)
        if quotas is not None:
            quotas.pop(name, None)
            if not quotas:
                del self._quotas[namespace]

    def of(self, namespace: str) -> list[QuotaInfo]:
        return list(self._quotas.get(namespace, {}).values())

    def all(self) -> list[QuotaInfo]:
        return [q for quotas in self._quotas.values() for q in quotas.values()]

    def keys(self) -> set[tuple[str, str]]:
        return {(ns, name) for ns, quotas in self._quotas.items() for name in quotas}
