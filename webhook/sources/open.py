"""The one place that chooses where the inventory comes from: a snapshot file, or the live cluster
(in-cluster configuration, else a kubeconfig). Used by `serve`, `explain` and `inventory` alike.

Errors are ConfigErrors naming the file or the connection, with what to do instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from webhook.domain.policy import Policy
from webhook.pools.inventory import Inventory
from webhook.sources.live import InventoryConnectError, LiveInventory, Observer
from webhook.sources.snapshot import SnapshotInventory

MIG_CONFIG_WAIT = 5.0  # seconds a command waits for mig-parted's ConfigMap after the first list


def open_inventory(  # noqa: PLR0913 (every command's inventory-source flags, by keyword)
    policy: Policy,
    *,
    snapshot: str | None,
    kubeconfig: str | None = None,
    start: bool = True,
    sync_timeout: float = 60.0,
    context: str | None = None,
    observers: Sequence[Observer] = (),
    log_quotas: bool = True,
) -> Inventory:
    """The snapshot file `snapshot`, read whole; else the live cluster. With `start`, the live inventory
    lists everything once and keeps watching (refused when the first list does not complete within
    `sync_timeout`); without it, only its configuration is loaded: `serve` starts the watches in each
    worker after the fork, since threads do not survive a fork. `context` picks a kubeconfig context
    other than the current one. `observers` follow the raw objects from the first (the queue's waiting Pods,
    for the commands that show it). `log_quotas`: the live inventory logs the quotas Kubernetes does not
    enforce (the server's log; a command prints them in its report instead)."""
    if snapshot is not None:
        return SnapshotInventory.from_file(snapshot, policy, observers)
    try:
        live = LiveInventory.connect(policy, kubeconfig, context=context, log_quotas=log_quotas)
    except InventoryConnectError as exc:
        raise InventoryConnectError(f"{exc} (or give --inventory FILE for a snapshot)") from None
    for observer in observers:
        live.observe(observer)
    if not start:
        return live
    live.start()
    if not live.wait_ready(sync_timeout):
        live.close()
        raise InventoryConnectError(
            f"could not list nodes, pods and resourcequotas within {sync_timeout:.0f} s "
            "(check the API server address and RBAC: get/list/watch on the three resources)"
        )
    # mig-parted's ConfigMap (policy migReshaping) for what the commands say of MIG re-cuts: without it
    # (not there, or not readable) they say nothing of re-cuts, so it is waited for briefly, never required.
    live.wait_mig_config(min(sync_timeout, MIG_CONFIG_WAIT))
    return live


def reopen_inventory(
    inventory: Inventory, policy: Policy, prepare: Callable[[LiveInventory], None] | None = None
) -> Inventory:
    """The same source, read again for another policy: the snapshot file re-read (a ConfigError naming it
    when it no longer loads), or the live cluster listed and watched anew (started, not yet ready).
    `prepare` is given a new live inventory before it starts, to add observers that must see its first list."""
    if isinstance(inventory, SnapshotInventory):
        return SnapshotInventory.from_file(inventory.source, policy)
    if isinstance(inventory, LiveInventory):
        successor = inventory.for_policy(policy)
        if prepare is not None:
            prepare(successor)
        return successor.start()
    raise TypeError(f"cannot open {type(inventory).__name__} again")
