"""What the commands that read a cluster share (`explain`, `inventory`, `quota`, `queue`): where the inventory
and the policy come from, the namespace as kubectl means it, and opening them.

The same arguments mean the same in `gpupool` and `kubectl gpupool`: `-n` is the namespace of the
objects read (else the kubeconfig context's, else `default`), `--context` and `--kubeconfig` pick the
cluster, and without `--policy FILE` a live cluster's answers follow the policy its webhook runs with.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from webhook.commands.output import say
from webhook.domain.policy import Policy, PolicyError, load_policy, load_policy_text
from webhook.pools.charges import Charge, ChargeError
from webhook.pools.inventory import Inventory
from webhook.queue.waiting import Waiting
from webhook.sources.charge_store import CHARGES_LEASE, LeaseCharges
from webhook.sources.installed import WEBHOOK_DEPLOYMENT, read_installed_policy
from webhook.sources.live import InventoryConnectError, Observer, api_client, context_namespace
from webhook.sources.open import open_inventory

# Kubernetes' name rules (linear patterns, on values argparse has already bounded to one argument).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inventory",
        metavar="FILE",
        help="a cluster snapshot (`kubectl get nodes,pods,resourcequotas -A -o yaml`) instead of the live "
        "cluster; examples/cluster.yaml is a demo",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for the live cluster (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument(
        "--context",
        metavar="NAME",
        help="the kubeconfig context of the live cluster (default: the current context), as kubectl's --context",
    )
    parser.add_argument(
        "--sync-timeout",
        metavar="SECONDS",
        type=float,
        default=60.0,
        help="live cluster: how long to wait for the first full list (default 60)",
    )
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="policy file merged over the built-in default (default: on a live cluster, the policy the webhook "
        "Deployment runs with; with --inventory, the built-in default)",
    )
    parser.add_argument(
        "--webhook",
        metavar="NAMESPACE/NAME",
        default=WEBHOOK_DEPLOYMENT,
        type=_deployment,
        help=f"the webhook's Deployment, whose policy is used without --policy (default {WEBHOOK_DEPLOYMENT})",
    )


def add_namespace_arguments(parser: argparse.ArgumentParser, meaning: str, *, all_namespaces: bool = False) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        type=namespace_type,
        help=f"{meaning} (default: the kubeconfig context's namespace, else default)",
    )
    if all_namespaces:
        parser.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (-n is ignored)")


def namespace_of(args: argparse.Namespace) -> str:
    """`-n`, else the namespace of the kubeconfig context (`--context`, else the current one), else
    `default`: kubectl's rule. A kubeconfig that cannot be read means `default`, as in kubectl."""
    namespace: str | None = args.namespace
    return namespace or context_namespace(args.kubeconfig, args.context)


def open_from_args(args: argparse.Namespace) -> tuple[Policy, Inventory]:
    """The policy and the inventory the arguments name, listed and watching."""
    policy = policy_from_args(args)
    return policy, _open(args, policy)


def open_with_queue(args: argparse.Namespace) -> tuple[Policy, Inventory, Waiting]:
    """`open_from_args`, and the Pods waiting in gpupool's queue, kept from the same list and watch (a
    snapshot's Pods that carry the gate)."""
    policy = policy_from_args(args)
    waiting = Waiting(policy)
    return policy, _open(args, policy, (waiting,)), waiting


def read_charges(args: argparse.Namespace) -> list[Charge]:
    """The charges of Pods that name their node (webhook.pools.charges), read once from the live cluster's
    Lease `gpupool-charges` in the webhook's namespace (`--webhook`), for the commands that show what the
    queue's leader would do (`queue`, `explain`): its pass counts them. None in a snapshot, which holds no
    Lease. The commands run as the user: a Lease they cannot read (forbidden, no answer) is said in one
    warning on stderr, and the answers are given without it."""
    if args.inventory is not None:
        return []
    namespace = args.webhook.partition("/")[0]
    try:
        return LeaseCharges(api_client(args.kubeconfig, args.context), namespace).read()[0]
    except ChargeError as exc:
        say(
            args,
            "warning",
            f"{exc}: the queue is shown without the charges of Pods that name their node, which the leader "
            f"counts (kubectl -n {namespace} get lease {CHARGES_LEASE} needs get on Leases there)",
        )
        return []


def _open(args: argparse.Namespace, policy: Policy, observers: Sequence[Observer] = ()) -> Inventory:
    return open_inventory(
        policy,
        snapshot=args.inventory,
        kubeconfig=args.kubeconfig,
        sync_timeout=args.sync_timeout,
        context=args.context,
        observers=observers,
        log_quotas=False,  # each command that reads quotas prints their warnings itself, once
    )


def policy_from_args(args: argparse.Namespace) -> Policy:
    """`--policy FILE`; else, on a live cluster, the policy its webhook runs with; else the built-in
    default. Which one is said on stderr unless it was given."""
    if args.policy is not None:
        return load_policy(args.policy)
    if args.inventory is not None:
        say(args, "note", "with gpupool's built-in default policy (a snapshot holds none); pass --policy FILE")
        return load_policy(None)
    try:
        api = api_client(args.kubeconfig, args.context)
    except InventoryConnectError as exc:  # as open_inventory says it, since the inventory is next
        raise InventoryConnectError(f"{exc} (or give --inventory FILE for a snapshot)") from None
    installed = read_installed_policy(api, args.webhook)
    say(args, "note", installed.note)
    try:
        return load_policy_text(installed.text, installed.source)
    except PolicyError as exc:
        # The webhook's Pods refuse the same file and keep deciding by the one they had, which the
        # cluster does not hold any more: only the user can say what that was.
        raise PolicyError(
            f"{exc}; the webhook refuses it too and keeps the policy it had (its /readyz policy.error says "
            "so): fix the ConfigMap, or pass --policy FILE"
        ) from None


def namespace_type(value: str) -> str:
    """A namespace name as Kubernetes accepts it (a DNS label), or a usage error that says so."""
    if _DNS_LABEL.fullmatch(value) is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a namespace name: 1 to 63 lowercase letters, digits and '-', starting and "
            "ending with a letter or digit"
        )
    return value


def _deployment(value: str) -> str:
    namespace, slash, name = value.partition("/")
    if not slash or _DNS_LABEL.fullmatch(namespace) is None or _DNS_SUBDOMAIN.fullmatch(name) is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAMESPACE/NAME of a Deployment")
    return value
