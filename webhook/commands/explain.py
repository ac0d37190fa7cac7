"""`gpupool explain FILE...`: the decision for each Pod a manifest will create, why, and the patched Pod.

A file holds Pods, workloads (each Pod template explained as the Pods its controller will create, with
the owner and workload group they will have: webhook.commands.workloads), several YAML documents or a
`List`; one section per Pod template. Nothing is reserved: each template is decided on the inventory as
it is, as the first of its Pods.

Namespaces as kubectl's: an object is explained in its own `metadata.namespace`, else in `-n`'s, else in
the kubeconfig context's, else in `default`; an object whose namespace is not `-n`'s is refused.
`--as-namespace NS` explains every object as if it were in NS.

A Pod whose namespace queues (policy `placement: queue`) is queued at admission with its device resource
fixed; its section then says what the queue would do with it now: one pass of the leader's own `plan`
over the cluster's queue with this Pod added in its place in the order (created now, its own
`spec.priority`): released now to which pool, or what it would wait for (webhook.queue.preview), such as
a MIG re-cut of which node. On a live cluster the pass counts the charges of Pods that name their node,
as the leader's does (webhook.pools.charges), and so does the verdict, as the Pod's admission would.

Exit status: 0 when every Pod would be allowed, 1 when one is denied, 2 for a bad file or argument.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import yaml

from webhook.admission.burst import admit_in_turn
from webhook.admission.core import evaluate
from webhook.admission.verdict import Verdict
from webhook.commands.common import (
    add_namespace_arguments,
    add_source_arguments,
    namespace_of,
    namespace_type,
    open_with_queue,
    read_charges,
)
from webhook.commands.manifest import PodTemplate, objects_in
from webhook.commands.output import add_output_arguments, print_document
from webhook.commands.podsnow import MAX_PODS, PodsNow, from_burst, from_queue
from webhook.commands.queue import outcome_json
from webhook.commands.workloads import MAX_TEMPLATES, pod_templates
from webhook.domain.errors import ConfigError, yaml_problem
from webhook.domain.model import QUEUE_GATE
from webhook.domain.policy import Policy
from webhook.pools.charges import Charge, pending
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import as_map
from webhook.queue.preview import Outcome, arriving, preview
from webhook.queue.waiting import Queued, Waiting


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        metavar="FILE",
        nargs="+",
        help="manifests (YAML or JSON; - for standard input): Pods, workloads with Pod templates, Lists",
    )
    add_source_arguments(parser)
    add_namespace_arguments(parser, "the namespace of the objects read; an object of another one is refused")
    parser.add_argument(
        "--as-namespace",
        metavar="NS",
        type=namespace_type,
        help="explain every object as if it were in NS, whatever its own namespace (not with -n)",
    )
    add_output_arguments(parser, ("text", "json", "yaml"), "text")


@dataclass(frozen=True, slots=True)
class QueuePlace:
    """A queued Pod's place in the queue, and what the leader's pass would do with it now."""

    outcome: Outcome
    waiting: int  # Pods in the queue, this one included


@dataclass(frozen=True, slots=True)
class Section:
    """One Pod template, the namespace it is decided in, the verdict (None: not decided here), for a
    Pod the verdict queues, its place in the queue, and for a template of several Pods, how many of them
    fit now."""

    template: PodTemplate
    namespace: str
    verdict: Verdict | None
    queue: QueuePlace | None = None
    pods: PodsNow | None = None

    @property
    def denied(self) -> bool:
        return self.verdict is not None and not self.verdict.allowed


def run(args: argparse.Namespace) -> int:
    if args.namespace and args.as_namespace:
        raise ConfigError("-n/--namespace and --as-namespace: give one (--as-namespace explains every object in it)")
    templates = [t for path in args.files for t in load_templates(path)]
    if len(templates) > MAX_TEMPLATES:
        raise ConfigError(f"{len(templates)} Pod templates: explain at most {MAX_TEMPLATES} at a time")
    # Every namespace is settled before the inventory is opened: a live one lists the cluster first.
    placed = place_in_namespaces(templates, args, lambda: namespace_of(args))
    policy, inventory, waiting = open_with_queue(args)
    try:
        charges = read_charges(args)  # once for every template, before the lock, as the leader's pass reads them
        with inventory.read() as index:
            sections = [section_for(t, ns, policy, index, waiting, charges) for t, ns in placed]
    finally:
        inventory.close()
    if args.output == "text":
        sys.stdout.write("\n".join(render_text(s) for s in sections))
    else:
        items = [section_json(s) for s in sections]
        print_document(
            items[0] if len(items) == 1 else {"apiVersion": "v1", "kind": "List", "items": items}, args.output
        )
    return 1 if any(s.denied for s in sections) else 0


def section_for(
    template: PodTemplate,
    namespace: str,
    policy: Policy,
    index: PoolIndex,
    waiting: Waiting,
    charges: Sequence[Charge] = (),
) -> Section:
    """The template's section: its verdict, and for a Pod the verdict queues, what the queue would do with
    it now, counting `charges` (of Pods that name their node) as the leader does. The index is left as it
    was, for the next template."""
    if not template.decided:
        return Section(template, namespace, None)
    of = template.pods or 1
    # Its verdict counts the charges and the leader's recorded releases as its admission would
    # (webhook.pools.charges.pending): a Pod naming its node is refused for a charged Pod's quota or room.
    with pending(index, charges, time.time(), time.monotonic(), itself=(namespace, template.name)):
        result = evaluate(template.pod, namespace, policy, index)
        if result.allowed and result.placement is not None and of > 1:
            burst = admit_in_turn(template.pod, namespace, min(of, MAX_PODS), policy, index)
            return Section(template, namespace, result, pods=from_burst(burst, of))
    if not (result.allowed and result.queued):
        return Section(template, namespace, result)
    queued = waiting.ordered()
    taken = set(index.usage.pod_keys() | {q.key for q in queued})
    patched, now = _patched(template.pod, result) or template.pod, datetime.now(UTC)
    pods: list[Queued] = []
    for _ in range(min(of, MAX_PODS)):  # the template's Pods as its controller creates them, all queued
        pod = arriving(patched, namespace, policy, now, taken)
        if pod is None:  # admission's patch gates it and fixes its device: not reached
            return Section(template, namespace, result)
        pods.append(pod)
        taken.add(pod.key)
    found = {
        o.queued.key: o
        for o in preview(queued, index, policy, extra=pods, now=now.timestamp(), charges=charges, made=time.monotonic())
    }
    place = QueuePlace(found[pods[0].key], len(queued) + len(pods))
    many = from_queue([found[p.key] for p in pods], of) if len(pods) > 1 else None
    return Section(template, namespace, result, place, many)


def place_in_namespaces(
    templates: list[PodTemplate], args: argparse.Namespace, default: Callable[[], str]
) -> list[tuple[PodTemplate, str]]:
    """Each template with the namespace it is explained in; ConfigError for an object whose own namespace
    is not `-n`'s (as `kubectl apply -n` refuses it)."""
    fallback: list[str] = []  # the context's namespace, read once and only when needed

    def namespace(t: PodTemplate) -> str:
        if args.as_namespace:
            return str(args.as_namespace)
        if args.namespace:
            if t.namespace and t.namespace != args.namespace:
                raise ConfigError(
                    f"the namespace from the provided object {t.namespace!r} ({t.kind} {t.name}) does not match "
                    f"the namespace {args.namespace!r}; pass --namespace={t.namespace}, or "
                    f"--as-namespace={args.namespace} to explain it as if it were there"
                )
            return str(args.namespace)
        if t.namespace:
            return t.namespace
        if not fallback:
            fallback.append(default())
        return fallback[0]

    placed = [(t, namespace(t)) for t in templates]
    # A controller creates its Pods in the workload's namespace; a Pod read as written keeps its own.
    return [(t if t.kind == "Pod" else t.in_namespace(ns), ns) for t, ns in placed]


def load_templates(path: str) -> list[PodTemplate]:
    """Every Pod template in the file (`-`: standard input), in order; ConfigError naming the file and
    the document for anything that is not a Kubernetes object with Pods."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML or JSON: {yaml_problem(exc)}") from None
    if not docs:
        raise ConfigError(f"{path}: no manifest in it (expected a Pod, a workload or a List of them)")
    return [t for obj in objects_in(docs, path) for t in pod_templates(obj, path)]


# --- text ------------------------------------------------------------------------------------------------


def render_text(section: Section) -> str:
    t, result = section.template, section.verdict
    lines = [] if t.kind == "Pod" else [_workload_line(section)]
    if t.note:
        lines.append(f"Note: {t.note}")
    lines.append(f"Pod {section.namespace}/{_pod_name(t.pod)}")
    if result is None:
        lines.append("Decision: not decided here")
        return "\n".join(lines) + "\n"
    if not result.allowed:
        lines.append(f"Decision: DENIED ({result.code}): {result.message}")
    elif result.queued:
        lines.extend(_queue_lines(result, section.queue, as_map(t.pod.get("spec"))))
    elif result.placement is None:
        lines.append(f"Decision: allowed unchanged: {result.message}")
    else:
        p = result.placement
        lines.append(f"Decision: {result.outcome}: pool {p.pool}, {p.gpus} x {p.resource}")
        if result.patch and (p.constraint.selector or p.constraint.expressions):
            lines.append(f"Constraints: {p.constraint.text()}")
    if section.pods is not None:
        lines.append(section.pods.text())
    if result.group is not None:
        g = result.group
        where = f"{g.pods} {'Pod' if g.pods == 1 else 'Pods'} on pool {g.pool}" if g.pool else "no Pod placed yet"
        lines.append(f"Group: {g.name}: {where}")
    if result.reasons:
        lines.append("Pools considered:")
        lines.extend(f"  {r}" for r in result.reasons)
    if result.warnings:
        lines.append("Warnings:")
        lines.extend(f"  {w}" for w in result.warnings)
    if result.patch:
        lines.append("Patch (RFC 6902):")
        lines.extend(f"  {orjson.dumps(op).decode()}" for op in result.patch)
        lines.append("Patched Pod:")
        patched = _patched(t.pod, result)
        lines.extend("  " + line for line in yaml.safe_dump(patched, sort_keys=False).splitlines())
    return "\n".join(lines) + "\n"


def _queue_lines(result: Verdict, place: QueuePlace | None, spec: Mapping[str, Any]) -> list[str]:
    """`Decision: queued: ...` and, below it, what the queue would do with the Pod now."""
    if place is None:
        return [f"Decision: queued: {result.message}"]
    o = place.outcome
    devices = ", ".join(f"{n} x {r}" for r, n in o.queued.info.gpu_requests.items())
    lines = [f"Decision: queued: {devices} (the device resource is fixed now), behind the scheduling gate "
             f"{QUEUE_GATE} until the queue's leader releases it to a pool"]  # fmt: skip
    where = f"Queue: position {o.position} of {place.waiting}, priority {o.queued.priority}"
    if o.release is not None:
        lines.append(f"{where}: would be released now to {o.release.pool} (constraints: {o.constraints})")
    elif o.recut is not None:
        lines.append(f"{where}: would wait for {o.recut.describe()}")
    elif o.wait is not None:
        lines.append(f"{where}: would wait: {o.wait.reason}")
    if spec.get("priorityClassName") and "priority" not in spec:
        lines.append(
            f"Note: priorityClassName {spec['priorityClassName']}: kube-apiserver sets spec.priority from it when the "
            "Pod is created; its place above counts priority 0"
        )
    return lines


def _workload_line(section: Section) -> str:
    """`Job ml-train/train: spec.template, 4 Pods at a time, owned by Job/train`."""
    t = section.template
    what = f"{t.role} ({t.path})" if t.role else t.path
    parts = [what]
    if t.pods is not None:
        parts.append(f"{t.pods} {'Pod' if t.pods == 1 else 'Pods'}")
    if t.owner:
        parts.append(f"owned by {t.owner}")
    return f"{t.kind} {section.namespace}/{t.name}: {', '.join(parts)}"


def _pod_name(pod: dict[str, Any]) -> str:
    meta = as_map(pod.get("metadata"))
    return str(meta.get("name") or f"{meta.get('generateName', '')}<generated>")


def _patched(pod: dict[str, Any], result: Verdict) -> dict[str, Any] | None:
    if not result.patch:
        return None
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, list(result.patch))
    return patched


# --- JSON and YAML ---------------------------------------------------------------------------------------


def section_json(section: Section) -> dict[str, Any]:
    """Everything the text shows, as data: `-o json` and `-o yaml` of one section."""
    t, result = section.template, section.verdict
    workload = None
    if t.kind != "Pod":
        workload = {"kind": t.kind, "name": t.name, "template": t.path, "role": t.role, "pods": t.pods,
                    "owner": t.owner or None}  # fmt: skip
    head: dict[str, Any] = {
        "namespace": section.namespace,
        "name": _pod_name(t.pod),
        "workload": workload,
        "note": t.note or None,
    }
    if result is None:
        undecided: dict[str, Any] = {"allowed": None, "outcome": "undecided", "code": None, "reason": None}
        empty: dict[str, Any] = {"warnings": [], "pool": None, "patch": [], "group": None, "queued": None,
                                 "queue": None, "pods": None}  # fmt: skip
        return {**head, **undecided, "message": t.note, **empty, "poolsConsidered": [], "patchedPod": None}
    return {
        **head,
        **result.as_json(),
        "outcome": result.outcome,
        "reason": result.reason or None,
        "queue": _queue_json(section.queue),
        "pods": section.pods.as_json() if section.pods is not None else None,
        "poolsConsidered": list(result.reasons),
        "patchedPod": _patched(t.pod, result),
    }


def _queue_json(place: QueuePlace | None) -> dict[str, Any] | None:
    """What the text's `Queue:` line says, as data (null for a Pod that is not queued)."""
    if place is None:
        return None
    o = place.outcome
    return {"position": o.position, "waiting": place.waiting, "priority": o.queued.priority, **outcome_json(o)}
