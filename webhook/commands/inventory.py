"""`gpupool inventory`: the pool table, kubectl-style, with what an admin should fix.

One row per pool of devices: its kind (a whole GPU, a MIG instance, a shared replica), its exact device
product, memory per device and counts of devices. Warnings cover GPU nodes gpupool does not pool (it
cannot class them, their MIG layout is invalid or changing), and quotas written as `nvidia.com/gpu`
instead of `requests.nvidia.com/gpu`, which Kubernetes stores but never enforces. The inventory is
cluster-wide: `-n` is accepted, as `kubectl get nodes -n x` accepts it, and changes nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from webhook.commands.common import add_namespace_arguments, add_source_arguments, open_from_args
from webhook.commands.output import Column, add_output_arguments, print_listing
from webhook.domain.policy import Policy
from webhook.domain.quantity import format_mib
from webhook.pools.index import PoolIndex
from webhook.pools.inventory import PoolStats
from webhook.pools.quotas.report import quota_warnings

Pool = dict[str, Any]  # one entry of the report's `pools`


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    add_namespace_arguments(parser, "accepted and ignored: the pools are cluster-wide, as kubectl get nodes")
    add_output_arguments(parser, ("table", "wide", "json", "yaml", "name"), "table")


def run(args: argparse.Namespace) -> int:
    policy, inventory = open_from_args(args)
    try:
        with inventory.read() as index:
            report = build_report(index, policy)
    finally:
        inventory.close()
    print_listing(
        args,
        report["pools"],
        COLUMNS,
        document=lambda: report,
        name=lambda p: str(p["pool"]),
        empty="No GPU pools.",
        warnings=report["warnings"],
    )
    return 0


def build_report(index: PoolIndex, policy: Policy) -> dict[str, Any]:
    def pool(s: PoolStats) -> Pool:
        return {
            "pool": str(s.pool),  # as gpupool.io/pool names it
            "vendor": s.pool.vendor,
            "class": s.pool.gpu_class,
            "device": s.kind,
            "product": s.pool.product,
            "resource": s.resource,
            "ownResource": bool(s.pool.resource),  # a partition on a resource of its own (mixed-strategy MIG)
            "profile": s.profile,
            "replicas": list(s.replicas),
            "memoryMiB": s.memory_mib,
            "nodes": s.nodes,
            "usableNodes": s.usable_nodes,
            "gpus": {"total": s.gpus_total, "allocated": s.gpus_allocated, "free": s.gpus_free},
            "pending": s.pending,
        }

    order = {c: i for i, c in enumerate(policy.classes)}
    stats = sorted(
        index.capacity.pool_stats(),
        key=lambda s: (s.pool.vendor, order[s.pool.gpu_class], s.memory_mib, s.pool.product),
    )
    return {
        "pools": [pool(s) for s in stats],
        "warnings": [
            *(f"node {u.node}: {u.vendor} GPUs not pooled: {u.reason}" for u in index.capacity.unclassified()),
            *(f"pool {key}: no Pod is placed there: {found.reason}" for key, found in index.capacity.inseparable()),
            *quota_warnings(index, policy),
        ],
    }


def _partition(pool: Pool) -> str:
    """How a GPU is divided: the MIG profile (`3g.20gb`), the replicas per GPU (`4 replicas`), or `-`."""
    replicas = "/".join(str(r) for r in pool["replicas"])
    if pool["device"] == "shared":
        shared = f"{replicas} replicas" if replicas else "? replicas"
        return f"{pool['profile']} {shared}" if pool["profile"] else shared
    return pool["profile"] or "-"


COLUMNS: tuple[Column[Pool], ...] = (
    Column("VENDOR", lambda p: p["vendor"]),
    Column("CLASS", lambda p: p["class"]),
    Column("DEVICE", lambda p: p["device"]),
    # as gpupool.io/pool names it: a mixed-strategy MIG profile with its resource
    Column("PRODUCT", lambda p: p["product"] + (f"/{p['resource']}" if p["ownResource"] else "")),
    Column("MEMORY", lambda p: format_mib(p["memoryMiB"]) if p["memoryMiB"] else "?"),
    Column("NODES", lambda p: str(p["nodes"])),
    Column("USABLE", lambda p: str(p["usableNodes"]), wide=True),
    Column("GPUS", lambda p: str(p["gpus"]["total"])),
    Column("ALLOCATED", lambda p: str(p["gpus"]["allocated"])),
    Column("FREE", lambda p: str(p["gpus"]["free"])),
    Column("PENDING", lambda p: str(p["pending"])),
    Column("RESOURCE", lambda p: p["resource"], wide=True),
    Column("PARTITION", _partition, wide=True),
)
