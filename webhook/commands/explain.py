"""`gpupool explain POD.yaml`: the decision for one Pod, why, and the patched Pod.

Exit status: 0 when the Pod would be allowed, 1 when denied, 2 for a bad file or argument.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import yaml

from webhook.admission.core import evaluate
from webhook.admission.verdict import Verdict
from webhook.commands.common import add_source_arguments, open_from_args
from webhook.domain.errors import ConfigError, yaml_problem
from webhook.pools.kubeobj import as_map


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod", metavar="POD.yaml", help="the Pod manifest (YAML or JSON; - for standard input)")
    add_source_arguments(parser)
    parser.add_argument(
        "--namespace", "-n", metavar="NS", help="namespace of the Pod (default: its metadata.namespace, else default)"
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")


def run(args: argparse.Namespace) -> int:
    pod = load_pod(args.pod)
    own = as_map(pod.get("metadata")).get("namespace")
    own = own if isinstance(own, str) else ""
    if getattr(args, "namespace_must_match", False) and args.namespace and own and own != args.namespace:
        # `kubectl gpupool explain`: as kubectl apply, a Pod of one namespace is not explained in another.
        raise ConfigError(
            f"the namespace from the provided object {own!r} does not match the namespace {args.namespace!r}; "
            f"pass --namespace={own} to explain it"
        )
    namespace = args.namespace or own or getattr(args, "default_namespace", "default")
    # Opened once the arguments are known to be good: a live inventory lists the cluster first.
    policy, inventory = open_from_args(args)
    try:
        with inventory.read() as index:
            result = evaluate(pod, namespace, policy, index)
    finally:
        inventory.close()
    if args.output == "json":
        sys.stdout.write(orjson.dumps(result.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_text(pod, namespace, result))
    return 0 if result.allowed else 1


def load_pod(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML or JSON: {yaml_problem(exc)}") from None
    if len(docs) != 1:
        raise ConfigError(f"{path}: expected exactly one Pod manifest, found {len(docs)} YAML documents")
    if not isinstance(docs[0], dict):
        raise ConfigError(f"{path}: expected a Pod manifest (a mapping), found a {type(docs[0]).__name__}")
    pod = docs[0]
    if pod.get("kind") not in (None, "Pod"):
        raise ConfigError(f"{path}: kind {pod.get('kind')!r} is not Pod")
    return pod


def render_text(pod: dict[str, Any], namespace: str, result: Verdict) -> str:
    meta = as_map(pod.get("metadata"))
    name = meta.get("name") or f"{meta.get('generateName', '')}<generated>"
    lines = [f"Pod {namespace}/{name}"]
    if not result.allowed:
        lines.append(f"Decision: DENIED ({result.code}): {result.message}")
    elif result.placement is None:
        lines.append(f"Decision: allowed unchanged: {result.message}")
    else:
        p = result.placement
        lines.append(f"Decision: {result.outcome}: pool {p.pool}, {p.count} x {p.resource}")
        if result.patch and (p.constraint.selector or p.constraint.expressions):
            lines.append(f"Constraints: {p.constraint.text()}")
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
        patched = jsonpatch.apply_patch(pod, list(result.patch))
        lines.append("Patched Pod:")
        lines.extend("  " + line for line in yaml.safe_dump(patched, sort_keys=False).splitlines())
    return "\n".join(lines) + "\n"
