"""`gpupool queue`: the Pods waiting in gpupool's queue, where each stands and what it waits for.

A Pod waits while it carries the scheduling gate `gpupool.io/queue` (webhook.queue.waiting): on a live
cluster, the queued Pods its list shows; in a snapshot, the Pods that carry the gate. Each row is a Pod
with its position in the whole queue's release order (`spec.priority` descending, then creation time),
how long it has waited (since its creation, in kubectl's age format), and what it waits for: the Wait
reason of one pass of the leader's own `plan` run on this command's own view of the cluster
(webhook.queue.preview), so the list says what the leader would decide now (on a live cluster, counting
the charges of Pods that name their node, as the leader's pass does); for a Pod that waits for a MIG
re-cut (policy `migReshaping`), of which node, to which layout, and whether it is under way. A Pod that fits now waits
only for the leader's next pass. Namespaces as `kubectl get pods`: `-n`, else the kubeconfig
context's, else `default`; `-A` for all of them (the positions are in the whole queue either way).
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from webhook.commands.common import (
    add_namespace_arguments,
    add_source_arguments,
    namespace_of,
    open_with_queue,
    read_charges,
)
from webhook.commands.output import Column, add_output_arguments, age, print_listing, say
from webhook.domain.policy import Policy
from webhook.queue.preview import Outcome, preview

Entry = dict[str, Any]  # one queued Pod of the listing, as `-o json` prints it
FITS_NOW = "the leader: it fits now"  # what a Pod that would be released at the next pass waits for


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    add_namespace_arguments(parser, "the namespace whose queued Pods are listed", all_namespaces=True)
    add_output_arguments(parser, ("table", "wide", "json", "yaml", "name"), "table")


def run(args: argparse.Namespace) -> int:
    namespace = None if args.all_namespaces else namespace_of(args)
    policy, inventory, waiting = open_with_queue(args)
    try:
        charges = read_charges(args)  # read once, before the lock, as the leader's pass reads them
        with inventory.read() as index:
            outcomes = preview(
                waiting.ordered(), index, policy, now=time.time(), charges=charges, made=time.monotonic()
            )
    finally:
        inventory.close()
    now = datetime.now(UTC)
    entries = [entry(o, now) for o in outcomes if namespace is None or o.queued.key[0] == namespace]
    print_listing(
        args,
        entries,
        COLUMNS,
        document=lambda: {"waiting": len(outcomes), "pods": entries},
        name=lambda e: f"pod/{e['name']}",
        empty=f"No queued Pods in namespace {namespace}." if namespace else "No queued Pods.",
    )
    for note in notes(entries, namespace, policy, args):
        say(args, "note", note)
    return 0


def entry(outcome: Outcome, now: datetime) -> Entry:
    """The Pod, where it stands and what the pass would do with it, as data (the table reads it too)."""
    q = outcome.queued
    waited = q.age(now)
    # The one device resource admission fixed, and the Pod's devices of it (a queued Pod requests one kind).
    resource, devices = next(iter(q.info.gpu_requests.items()), ("", 0))
    return {
        "namespace": q.key[0],
        "name": q.key[1],
        "position": outcome.position,
        "priority": q.priority,
        "created": q.created or None,
        "waitingSeconds": int(waited) if waited is not None else None,  # below 0 when the clocks disagree
        "resource": resource,
        "devices": devices,
        "group": q.view.group or None,
        **outcome_json(outcome),
    }


def outcome_json(outcome: Outcome) -> Entry:
    """What one pass would do with the Pod now: `release` to a pool (with the constraints its release
    adds) or `wait`, with the Wait's code and reason, and for a Pod that waits for a MIG re-cut, which
    (`recut`: node, layout, whether under way); `waitsFor` is what the FOR column says."""
    release, wait, recut = outcome.release, outcome.wait, outcome.recut
    if release is not None:
        return {"outcome": "release", "pool": str(release.pool), "constraints": outcome.constraints,
                "code": None, "reason": None, "recut": None, "waitsFor": FITS_NOW}  # fmt: skip
    code, reason = (wait.code, wait.reason) if wait is not None else (None, None)
    shown = {"node": recut.node, "layout": recut.layout, "underWay": recut.under_way} if recut is not None else None
    return {"outcome": "wait", "pool": None, "constraints": None, "code": code, "reason": reason, "recut": shown,
            "waitsFor": recut.describe() if recut is not None else reason or "-"}  # fmt: skip


def notes(entries: list[Entry], namespace: str | None, policy: Policy, args: argparse.Namespace) -> list[str]:
    """What a person should know to read the list: Pods that wait only for a leader, and why a list is
    empty when the policy queues nothing there."""
    found: list[str] = []
    fits = sum(1 for e in entries if e["outcome"] == "release")
    if fits:
        one = fits == 1
        what = f"{fits} of these Pods {'fits' if one else 'fit'} now: the queue's leader"
        them = "it" if one else "them"
        if args.inventory is not None:
            found.append(f"{what} would release {them} at its next pass")
        else:
            found.append(
                f"{what} releases {them} at its next pass; if {'it is' if one else 'they are'} still listed a few "
                f"seconds from now, no gpupool replica may be leading "
                f"(kubectl -n {args.webhook.partition('/')[0]} get lease gpupool)"
            )
    if not entries and namespace is not None and policy.placement(namespace) != "queue":
        found.append(f"namespace {namespace} places its Pods at admission (placement: now): none of them queue")
    elif not entries and namespace is None and not policy.queues:
        found.append("no namespace queues its Pods (placement: now in the policy, for every namespace)")
    return found


def _now(e: Entry) -> str:
    return f"would be released to {e['pool']}" if e["outcome"] == "release" else f"would wait ({e['code'] or '-'})"


COLUMNS: tuple[Column[Entry], ...] = (
    Column("NAMESPACE", lambda e: e["namespace"]),
    Column("NAME", lambda e: e["name"]),
    Column("POSITION", lambda e: str(e["position"])),
    Column("WAITING", lambda e: age(e["waitingSeconds"])),
    Column("FOR", lambda e: e["waitsFor"]),
    Column("PRIORITY", lambda e: str(e["priority"]), wide=True),
    Column("RESOURCE", lambda e: e["resource"], wide=True),
    Column("DEVICES", lambda e: str(e["devices"]), wide=True),
    Column("NOW", _now, wide=True),
)
