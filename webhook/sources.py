"""Where the inventory comes from: a snapshot file, or the live cluster (in-cluster config or KUBECONFIG).

Shared by `serve`, `explain` and `inventory`, so all three read a cluster the same way.
"""

from __future__ import annotations

import argparse

from webhook.cli import UsageError
from webhook.inventory import Inventory
from webhook.kubecache import InventoryConnectError, LiveInventory
from webhook.policy import Policy, PolicyError, load_policy
from webhook.snapshot import InventoryFileError, SnapshotInventory


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
        "--sync-timeout",
        metavar="SECONDS",
        type=float,
        default=60.0,
        help="live cluster: how long to wait for the first full list (default 60)",
    )


def policy_arg(path: str | None) -> Policy:
    """The --policy file merged over the default, or a UsageError naming the field."""
    try:
        return load_policy(path)
    except PolicyError as exc:
        raise UsageError(str(exc)) from None


def open_snapshot(path: str, policy: Policy) -> SnapshotInventory:
    try:
        return SnapshotInventory.from_file(path, policy)
    except InventoryFileError as exc:
        raise UsageError(str(exc)) from None


def open_live(policy: Policy, kubeconfig: str | None, sync_timeout: float) -> LiveInventory:
    """Connect, list everything once, and keep watching; refuse with a clear error if that fails."""
    try:
        live = LiveInventory.connect(policy, kubeconfig).start()
    except InventoryConnectError as exc:
        raise UsageError(f"{exc} (or give --inventory FILE)") from None
    if not live.wait_ready(sync_timeout):
        live.close()
        raise UsageError(
            f"could not list nodes, pods and resourcequotas within {sync_timeout:.0f} s "
            "(check the API server address and RBAC: get/list/watch on the three resources)"
        )
    return live


def open_inventory(args: argparse.Namespace, policy: Policy) -> Inventory:
    if args.inventory:
        return open_snapshot(args.inventory, policy)
    return open_live(policy, args.kubeconfig, args.sync_timeout)
