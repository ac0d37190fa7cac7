"""`kubectl gpupool`: gpupool's commands for cluster users, as a kubectl plugin.

kubectl finds the `kubectl-gpupool` executable on PATH and runs it with every argument after `gpupool`
(its own global flags are not passed on to plugins). The plugin is the `gpupool` command under another
name with `explain`, `inventory`, `quota`, `queue`, `release` (the one that writes: a queued Pod released
by hand, webhook.commands.release) and `version`: the same flags, read the same way, so the two
never disagree. kubectl's flags (`-n`, `-A`, `--context`, `--kubeconfig`) are among them, with kubectl's
meaning (webhook.commands.common), and on a live cluster the policy is the one the installed webhook
runs with (webhook.sources.installed) unless `--policy FILE` is given.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from webhook.commands.cli import LEADING_FLAGS, run_command

PROG = "kubectl gpupool"
COMMANDS = ("explain", "inventory", "quota", "queue", "release", "version")
# kubectl's flags, as the plugin's commands take them (documented in docs/operations.md, "kubectl gpupool").
KUBECTL_FLAGS = tuple(LEADING_FLAGS)
EPILOG = """kubectl's flags, after `gpupool` (kubectl does not pass its own on to a plugin):
  -n, --namespace NS     the namespace (default: the context's, else default)
  -A, --all-namespaces   quota, queue: every namespace's
  --context NAME         the kubeconfig context (default: the current one)
  --kubeconfig FILE      the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)

kubectl gpupool explain job.yaml -n team-a; kubectl gpupool quota -A; kubectl gpupool queue -A;
kubectl gpupool inventory --context prod; kubectl gpupool release -n team-a train-0"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_command(args or ["--help"], PROG, COMMANDS, epilog=EPILOG)
