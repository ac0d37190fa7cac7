"""Arguments the commands that read an inventory share (`explain`, `inventory`), and opening it."""

from __future__ import annotations

import argparse

from webhook.domain.policy import Policy, load_policy
from webhook.pools.inventory import Inventory
from webhook.sources.open import open_inventory


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
    parser.add_argument("--policy", metavar="FILE", help="policy file merged over the built-in default")


def open_from_args(args: argparse.Namespace) -> tuple[Policy, Inventory]:
    """The --policy and the inventory the arguments name, listed and watching."""
    policy = load_policy(args.policy)
    return policy, open_inventory(
        policy,
        snapshot=args.inventory,
        kubeconfig=args.kubeconfig,
        sync_timeout=args.sync_timeout,
        context=args.context,
    )
