"""`gpupool quota`: every quota gpupool checks, per namespace, kubectl-style.

Where each comes from (a ResourceQuota's name, or the policy's classQuota / memoryQuota), the resource or
class it limits, used, pending (admissions the watch has not shown yet), hard, and who enforces it:
Kubernetes and gpupool (`requests.nvidia.com/gpu`), or gpupool only (the forms Kubernetes ignores, and
the policy's quotas), and whether it is exact under a burst: a quota only gpupool enforces, in a namespace
that places `now`, is checked by each admitting process alone (`--replicas`: replicas x workers; 2 by
default, as manifests/base installs), so a burst can exceed it (EXACT `no`, with a warning). Namespaces
as `kubectl get resourcequotas`: `-n`, else the kubeconfig context's, else `default`; `-A` for all of them.
"""

from __future__ import annotations

import argparse
from typing import Any

from webhook.commands.common import add_namespace_arguments, add_source_arguments, namespace_of, open_from_args
from webhook.commands.output import Column, add_output_arguments, print_listing
from webhook.domain.quantity import format_mib
from webhook.pools.quotas.report import QuotaRow, quota_rows, quota_warnings


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    add_namespace_arguments(parser, "the namespace whose quotas are listed", all_namespaces=True)
    parser.add_argument(
        "--replicas",
        metavar="N",
        type=_admitters,
        default=2,
        help="the processes that admit Pods: the webhook Deployment's replicas x GPUPOOL_WORKERS (default 2, as "
        "manifests/base installs); with more than one, quotas only gpupool enforces in namespaces that place now "
        "are not exact",
    )
    add_output_arguments(parser, ("table", "json", "yaml"), "table")


def _admitters(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 10_000:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 10000, not {value!r}")
    return int(value)


def run(args: argparse.Namespace) -> int:
    namespace = None if args.all_namespaces else namespace_of(args)
    policy, inventory = open_from_args(args)
    try:
        with inventory.read() as index:
            rows = quota_rows(index, policy, namespace, admitters=args.replicas)
            warnings = quota_warnings(index, policy, namespace)
    finally:
        inventory.close()
    print_listing(
        args,
        rows,
        COLUMNS,
        document=lambda: {"quotas": [row_json(r) for r in rows]},
        empty=f"No GPU quotas in namespace {namespace}." if namespace else "No GPU quotas.",
        warnings=[_inexact(r, args.replicas) for r in rows if not r.exact] + warnings,
    )
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
        "exact": row.exact,
    }


def _inexact(row: QuotaRow, admitters: int) -> str:
    return (
        f"quota {row.namespace}/{row.quota} {row.resource}: not exact: {row.namespace} places now and only gpupool "
        f"enforces it, checked by each of {admitters} admitting processes alone, so a burst can exceed it; "
        f"set placement: queue for {row.namespace} (docs/queue.md)"
    )


def _amount(value: int, row: QuotaRow) -> str:
    return format_mib(value) if row.unit == "MiB" and value else str(value)


COLUMNS: tuple[Column[QuotaRow], ...] = (
    Column("NAMESPACE", lambda r: r.namespace),
    Column("QUOTA", lambda r: r.quota),
    Column("RESOURCE", lambda r: r.resource),
    Column("USED", lambda r: _amount(r.used, r)),
    Column("PENDING", lambda r: _amount(r.pending, r)),
    Column("HARD", lambda r: _amount(r.hard, r)),
    Column("ENFORCED BY", lambda r: r.enforced_by),
    Column("EXACT", lambda r: "yes" if r.exact else "no: placement now"),
)
