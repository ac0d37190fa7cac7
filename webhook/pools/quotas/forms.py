"""Which ResourceQuota keys limit a device resource: the one rule, for the projection of quotas
(webhook.pools.kubeobj), every check (webhook.pools.quotas.checks) and the report (`gpupool quota`).

A ResourceQuota may limit an extended resource R in three forms: `requests.R`, which Kubernetes
enforces; and `R` (what `kubectl create quota --hard=nvidia.com/gpu=4` writes) and `limits.R`, which
Kubernetes stores but never enforces for extended resources, and gpupool enforces itself for the Pods it
admits (policy `defaults.enforceAllGpuQuotaForms`), against its own count of the namespace's Pods.
"""

from __future__ import annotations

from functools import lru_cache

REQUESTS, LIMITS = "requests.", "limits."


@lru_cache(maxsize=256)  # asked on every admission; a cluster has a handful of device resources
def forms(resource: str) -> tuple[str, str, str]:
    """The keys that limit `resource`, the one Kubernetes enforces first: `requests.R`, `R`, `limits.R`."""
    return (f"{REQUESTS}{resource}", resource, f"{LIMITS}{resource}")


def enforced(resource: str) -> str:
    """The key Kubernetes enforces for `resource`: `requests.R`."""
    return forms(resource)[0]


def counted_by_gpupool(resource: str) -> tuple[str, str]:
    """The keys only gpupool enforces (against its own count): `R` and `limits.R`."""
    return forms(resource)[1:]


def is_enforced(key: str) -> bool:
    """Is the key the form Kubernetes enforces?"""
    return key.startswith(REQUESTS)


def resource_of(key: str) -> str:
    """The resource a key limits, in any form."""
    return key.removeprefix(REQUESTS).removeprefix(LIMITS)


def prefixed(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """Every form of the resources that start with one of `prefixes` (a vendor's GPU partitions, whose
    resource names come from the nodes): `requests.P`, `P` and `limits.P` for each."""
    return tuple(f"{form}{p}" for p in prefixes for form in (REQUESTS, "", LIMITS))
