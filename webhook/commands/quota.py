"""`gpupool quota`: every quota gpupool checks, per namespace, kubectl-style.

Where each comes from (a ResourceQuota's name, or the policy's classQuota / memoryQuota), the resource or
class it limits, used, pending (admissions the watch has not shown yet), hard, and who enforces it:
Kubernetes and gpupool (`requests.nvidia.com/gpu`), or gpupool only (the forms Kubernetes ignores, and
the policy's quotas).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from webhook.commands.common import add_source_arguments, open_from_args
from webhook.domain.quantity import format_mib
from webhook.pools.quotas import QuotaRow, quota_rows


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument(
        "--namespace", "-n", metavar="NS", help="only this namespace's quotas (default: every namespace)"
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")


def run(args: argparse.Namespace) -> int:
    policy, inventory = open_from_args(args)
    try:
        with inventory.read() as index:
            rows = quota_rows(index, policy, args.namespace)
    finally:
        inventory.close()
    if args.output == "json":
        report = {"quotas": [row_json(r) for r in rows]}
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_table(rows, args.namespace))
    return 0


def row_json(row: QuotaRow) -> dict[str, Any]:
    return {
        "namespace": row.namespace,
        "quota": row.quota,
        "resource": row.resource,
        "used": row.used,
        "pending": row.pending,
        "hard": row.hard,
        "unit": row.unit,
        "enforcedBy": row.enforced_by,
    }


def render_table(rows: list[QuotaRow], namespace: str | None = None) -> str:
    def amount(row: QuotaRow, value: int) -> str:
        return format_mib(value) if row.unit == "MiB" and value else str(value)

    table = [["NAMESPACE", "QUOTA", "RESOURCE", "USED", "PENDING", "HARD", "ENFORCED BY"]]
    table += [
        [r.namespace, r.quota, r.resource, amount(r, r.used), amount(r, r.pending), amount(r, r.hard), r.enforced_by]
        for r in rows
    ]
    if not rows:
        where = f" in namespace {namespace}" if namespace else ""
        return f"No GPU quotas{where}.\n"
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table) + "\n"
