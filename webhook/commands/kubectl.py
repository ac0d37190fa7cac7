"""`kubectl gpupool`: `explain`, `inventory` and `quota` as a kubectl plugin, against the current context.

kubectl finds the `kubectl-gpupool` executable on PATH and runs it with every argument after `gpupool`
(its own global flags are not passed on, so they are read here). The plugin applies kubectl's
conventions, then runs the gpupool command:

- `--kubeconfig FILE` and `--context NAME` pick the cluster, as for kubectl (default: $KUBECONFIG or
  ~/.kube/config, at its current context);
- `-n/--namespace NS` is the namespace; without it, the namespace the context names, else `default`;
- `explain`: the Pod's own metadata.namespace wins over the context's, and one that differs from `-n` is
  refused, as `kubectl apply` refuses it;
- `quota` lists the namespace's quotas, or every namespace's with `-A/--all-namespaces`;
- `inventory` is cluster-wide: `-n` changes nothing, as for `kubectl get nodes`;
- without `--policy`, a note on stderr says the built-in default policy is used: the plugin does not
  read the policy the installed webhook runs with.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from webhook.commands.cli import run_command
from webhook.domain.errors import ConfigError
from webhook.sources.live import context_namespace

PROG = "kubectl gpupool"
COMMANDS = ("explain", "inventory", "quota")
# kubectl's flags the plugin reads itself (documented in docs/operations.md, "kubectl gpupool").
KUBECTL_FLAGS = ("-n", "--namespace", "-A", "--all-namespaces", "--context", "--kubeconfig")
DEFAULT_POLICY_NOTE = (
    "note: with gpupool's built-in default policy; pass --policy FILE for the one your install runs "
    "(the policy.yaml of its gpupool-policy-* ConfigMap)"
)
EPILOG = """kubectl's flags, after the command:
  -n, --namespace NS     the namespace (default: the context's, else default)
  -A, --all-namespaces   quota: every namespace's quotas
  --context NAME         the kubeconfig context (default: the current one)
  --kubeconfig FILE      the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)

kubectl gpupool explain pod.yaml -n team-a; kubectl gpupool quota -A; kubectl gpupool inventory --context prod"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    kubectl = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    kubectl.add_argument("-n", "--namespace")
    kubectl.add_argument("-A", "--all-namespaces", action="store_true")
    kubectl.add_argument("--context")
    kubectl.add_argument("--kubeconfig")
    known, rest = kubectl.parse_known_args(args)
    command = rest[0] if rest and rest[0] in COMMANDS else None
    if command is None:  # --help, no command, or an unknown one: argparse says which are accepted
        return run_command(rest or ["--help"], PROG, COMMANDS, epilog=EPILOG)
    if not any(a == "--policy" or a.startswith("--policy=") for a in rest):
        # The cluster is the context's, the policy is not: say so, or explain may disagree with the webhook.
        print(f"{PROG} {command}: {DEFAULT_POLICY_NOTE}", file=sys.stderr)
    for flag, value in (("--context", known.context), ("--kubeconfig", known.kubeconfig)):
        if value is not None:
            rest += [flag, value]
    try:
        namespace = known.namespace or context_namespace(known.kubeconfig, known.context)
    except ConfigError as exc:
        print(f"{PROG} {command}: error: {exc}", file=sys.stderr)
        return 2
    settings: dict[str, object] = {}
    if command == "explain":
        if known.namespace:
            rest += ["--namespace", known.namespace]
        settings = {"default_namespace": namespace, "namespace_must_match": True}
    elif command == "quota" and not known.all_namespaces:
        rest += ["--namespace", namespace]
    return run_command(rest, PROG, COMMANDS, settings)
