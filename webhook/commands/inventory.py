"""`gpupool inventory`: the pool table, kubectl-style, with what an admin should fix.

One row per pool of devices: its kind (a whole GPU, a MIG instance, a shared replica), its exact device
product, memory per device and counts of devices. Warnings cover GPU nodes gpupool does not pool (it
cannot class them, their MIG layout is invalid or changing), and quotas written as `nvidia.com/gpu`
instead of `requests.nvidia.com/gpu`, which Kubernetes stores but never enforces.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from webhook.commands.common import add_source_arguments, open_from_args
from webhook.domain.policy import Policy
from webhook.domain.quantity import format_mib
from webhook.pools.index import PoolIndex
from webhook.pools.inventory import PoolStats
from webhook.pools.quotas import quota_warnings


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table", help="output format")


def run(args: argparse.Namespace) -> int:
    policy, inventory = open_from_args(args)
    try:
        with inventory.read() as index:
            report = build_report(index, policy)
    finally:
        inventory.close()
    if args.output == "json":
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_table(report, wide=args.output == "wide"))
    return 0


def build_report(index: PoolIndex, policy: Policy) -> dict[str, Any]:
    def pool(s: PoolStats) -> dict[str, Any]:
        return {
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
        index.pool_stats(), key=lambda s: (s.pool.vendor, order[s.pool.gpu_class], s.memory_mib, s.pool.product)
    )
    return {
        "pools": [pool(s) for s in stats],
        "warnings": [
            *(f"node {u.node}: {u.vendor} GPUs not pooled: {u.reason}" for u in index.unclassified()),
            *(f"pool {key}: no Pod is placed there: {found.reason}" for key, found in index.inseparable()),
            *quota_warnings(index, policy),
        ],
    }


def render_table(report: dict[str, Any], wide: bool) -> str:
    head = ["VENDOR", "CLASS", "DEVICE", "PRODUCT", "MEMORY", "NODES", "GPUS", "ALLOCATED", "FREE", "PENDING"]
    if wide:
        head[5:6] = ["NODES", "USABLE"]
        head += ["RESOURCE", "PARTITION"]
    rows = [head]
    for p in report["pools"]:
        row = [
            p["vendor"],
            p["class"],
            p["device"],
            p["product"] + (f"/{p['resource']}" if p["ownResource"] else ""),  # as gpupool.io/pool names it
            format_mib(p["memoryMiB"]) if p["memoryMiB"] else "?",
            str(p["nodes"]),
            str(p["gpus"]["total"]),
            str(p["gpus"]["allocated"]),
            str(p["gpus"]["free"]),
            str(p["pending"]),
        ]
        if wide:
            row[5:6] = [str(p["nodes"]), str(p["usableNodes"])]
            row += [p["resource"], _partition(p)]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not report["pools"]:
        lines.append("(no GPU pools)")
    lines.extend(f"WARNING: {w}" for w in report["warnings"])
    return "\n".join(lines) + "\n"


def _partition(pool: dict[str, Any]) -> str:
    """How a GPU is divided: the MIG profile (`3g.20gb`), the replicas per GPU (`4 replicas`), or `-`."""
    replicas = "/".join(str(r) for r in pool["replicas"])
    if pool["device"] == "shared":
        shared = f"{replicas} replicas" if replicas else "? replicas"
        return f"{pool['profile']} {shared}" if pool["profile"] else shared
    return pool["profile"] or "-"
