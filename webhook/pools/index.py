"""The pool index: GPU pools with their free GPUs, what each namespace holds (per class, per resource, in
GPU memory) and where each workload group's Pods are, kept up to date one object at a time. A façade
over two parts, which the rest of the code never sees:

- the capacity index (webhook.pools.capacity): pools, their groups of nodes, node facts, each node's own
  free GPUs and the packing of holds; what a decision reads about capacity;
- the ledger (webhook.pools.ledger): what Pods and reservations hold, per node, per pool, per namespace
  and class, per quota; the reservations of admissions the watch has not shown yet.

The ledger tells the capacity index what is used on a node and held in a pool; the capacity index tells
the ledger, through this façade, when a node's pools changed or a selector came or went, so that the
ledger's counts follow the nodes. Every change ends here (`_settle`): unbound Pods are placed again if
needed, then every pool whose nodes or holds changed is packed once.

Callers read the parts through read-only views (webhook.pools.views): `index.capacity` (pools, nodes,
free devices), `index.usage` (what the namespaces and workload groups hold) and `index.quotas` (the
ResourceQuotas), and `index.mig` (mig-parted's config, webhook.pools.migconfig); every write (nodes,
Pods, quotas, reservations) goes through the index itself, since each ends in `_settle`.

The snapshot file and the live watch cache both feed it node, Pod and quota changes; the decision only
reads it. What it shows depends only on the objects it holds, never on the order they came in: a Pod
listed before its node, or a pinned Pod before its pool's nodes, is counted as if the nodes had come
first. Everything a decision reads is kept incrementally, so a decision costs the same for 50 Pods as
for 150,000.

Not thread-safe: the inventory that owns it serialises access.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from webhook.domain.cut import FleetLabels
from webhook.domain.model import NodeInfo, PodInfo, PodKey, PoolKey, QuotaInfo
from webhook.domain.policy import Defaults, Policy
from webhook.pools.capacity import Capacity, PoolStats
from webhook.pools.constraints import Inseparable
from webhook.pools.ledger import Ledger
from webhook.pools.migconfig import MigLayouts
from webhook.pools.nodes import NodeFacts
from webhook.pools.pool import Group, Pool
from webhook.pools.quotas.store import QuotaStore
from webhook.pools.reservations import Reservation
from webhook.pools.views import CapacityView, QuotaView, UsageView

__all__ = ["Group", "Inseparable", "Pool", "PoolIndex", "PoolStats", "Reservation", "pooling"]


# What only admission reads of the policy, never an index or the projections that feed it: a change of
# these alone keeps the index. Everything else is assumed to shape the index, so a field added later
# (and read by the index) rebuilds it until it is listed here: exact by default, cheap where known.
ADMISSION_ONLY_DEFAULTS = (
    "fallback",
    "on_no_capacity",
    "stale_after_seconds",
    "on_stale",
    "check_visible_devices",
    "enforce_all_gpu_quota_forms",  # read by webhook.pools.quotas.checks from the policy it is given
    "device",
    "placement",  # read by admission and the queue (webhook.queue.release), each from the policy it is given
    "enforcement",  # read by admission and validation only (webhook.admission.audit)
)


def pooling(policy: Policy) -> Policy:
    """The policy without what only admission reads (its namespace rules, its default vendor and the
    defaults in ADMISSION_ONLY_DEFAULTS): two policies with equal poolings pool the same objects the same
    way, so an index built for one serves the other."""
    neutral = Defaults()
    defaults = replace(policy.defaults, **{name: getattr(neutral, name) for name in ADMISSION_ONLY_DEFAULTS})
    return replace(policy, namespaces={}, default_vendor="", defaults=defaults)


class PoolIndex:
    """GPU pools, free GPUs per node, quotas and per-class usage, updated incrementally: read through
    `capacity`, `usage` and `quotas`, written through its own methods."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._capacity = Capacity(policy)
        self._ledger = Ledger(policy, self._capacity)
        self._quotas = QuotaStore()
        self.capacity: CapacityView = self._capacity
        self.usage: UsageView = self._ledger
        self.quotas: QuotaView = self._quotas
        # mig-parted's config, with the layouts gpupool may choose (policy migReshaping), as last seen.
        self.mig = MigLayouts(policy.mig_reshaping)
        # Changes made so far: the queue's leader passes over an unchanged index only when woken
        # (webhook.queue.runner); a change no watch event announces (a reservation expired) still counts.
        self.changes = 0
        # Changes per namespace of what it holds (its Pods and reservations) and of its ResourceQuotas, and
        # of those whose namespace is not known here (a reservation taken back by token, or expired): what
        # the queue's parked shapes read quotas from (webhook.queue.parking).
        self._namespace_changes: dict[str, int] = {}
        self._any_namespace = 0
        self._excluded: dict[str, frozenset[str]] = {}  # owner -> the nodes it keeps from new Pods
        # The label values the GPU nodes carry: what a Pod's long node-affinity lists are cut to
        # (webhook.domain.cut); only those nodes are ever asked whether a Pod could run there.
        self.labels = FleetLabels()

    def namespace_changes(self, namespace: str) -> int:
        """How often what `namespace` holds, or its ResourceQuotas, may have changed: equal counts, equal
        usage and quotas."""
        return self._namespace_changes.get(namespace, 0) + self._any_namespace

    def _namespace_changed(self, namespace: str | None) -> None:
        if namespace is None:
            self._any_namespace += 1
        else:
            self._namespace_changes[namespace] = self._namespace_changes.get(namespace, 0) + 1

    def _settle(self, reshaped: bool = False, *, changed: bool = True) -> None:
        """End of one change: place unbound Pods again if a selector came or went (or those a changed node
        may let run or stop), then pack the holds of every pool whose nodes or holds changed. `reshaped`:
        a selector came or went earlier in a batch of changes (`upsert_nodes`). `changed`: False when it
        was a batch of Pods the index holds none of (not counted in `changes`)."""
        self.changes += changed
        if self._capacity.take_reshaped() or reshaped:
            self._capacity.take_changed()
            self._ledger.place_unbound_again()
        else:
            nodes, pools = self._capacity.take_changed()
            if nodes:
                self._ledger.refit(nodes, pools)
        self._capacity.pack()

    def see_mig_config(self, obj: dict[str, Any] | None) -> None:
        """mig-parted's ConfigMap as it is now (None: deleted), one change when what it yields changed."""
        if self.mig.see(obj):
            self.changes += 1

    # --- nodes ---------------------------------------------------------------------------------------

    def upsert_node(self, node: NodeInfo) -> None:
        self.upsert_nodes((node,))

    def upsert_nodes(self, nodes: Iterable[NodeInfo]) -> None:
        """Add or replace nodes (a page of a list) as one change: the unbound Pods they may let run or stop
        are placed again, and their pools packed, once for all of them rather than once per node (a cold
        sync's nodes would otherwise place again the Pods listed before them, one node at a time)."""
        reshaped = False
        for node in nodes:
            old = self._capacity.node(node.name)
            if self._capacity.upsert_node(node, self._ledger.used_on(node.name)):
                self._ledger.reclass(node.name)
            self._relabelled(old, self._capacity.node(node.name))
            reshaped |= self._capacity.take_reshaped()
        self._settle(reshaped)

    def remove_node(self, name: str) -> None:
        self.remove_nodes((name,))

    def _relabelled(self, old: NodeInfo | None, new: NodeInfo | None) -> None:
        self.labels.change(old.labels if old is not None else None, new.labels if new is not None else None)

    def remove_nodes(self, names: Iterable[str]) -> None:
        """Forget nodes (those a re-list did not show) as one change, as `upsert_nodes`."""
        reshaped = False
        for name in names:
            self._relabelled(self._capacity.node(name), None)
            self._capacity.remove_node(name)
            self._ledger.reclass(name)
            reshaped |= self._capacity.take_reshaped()
        self._settle(reshaped)

    def exclude_nodes(self, owner: str, names: Iterable[str]) -> None:
        """Keep the nodes `names` from new Pods for `owner` (the queue's MIG drains, its backfill holds), in
        place of what `owner` excluded before: they count no free GPUs, and every pool's constraint leaves
        them out by hostname (webhook.pools.constraints), until no owner excludes them. One change when the
        excluded nodes changed."""
        kept = frozenset(names)
        if kept:
            self._excluded[owner] = kept
        else:
            self._excluded.pop(owner, None)
        changed = self._capacity.exclude(frozenset().union(*self._excluded.values()))
        if not changed:
            return
        for name in changed:
            self._capacity.set_used(name, self._ledger.used_on(name))
        self._settle()

    def excluded_by(self, owner: str) -> frozenset[str]:
        """The nodes `owner` keeps from new Pods (`exclude_nodes`)."""
        return self._excluded.get(owner, frozenset())

    def excluders(self) -> tuple[str, ...]:
        """Every owner that keeps nodes from new Pods now."""
        return tuple(self._excluded)

    def free_unexcluded(self, facts: NodeFacts) -> int:
        """The node's free devices of `facts`' resource as they would be were it not excluded (0 when it is
        not usable): what the Pod it is held for could use there."""
        if not facts.usable:
            return 0
        used = self._ledger.used_on(facts.node)
        return max(facts.allocatable - (used.get(facts.resource, 0) if used else 0), 0)

    # --- Pods ----------------------------------------------------------------------------------------

    def upsert_pod(self, pod: PodInfo | None, key: PodKey | None = None) -> None:
        """Add or replace a Pod. None (a Pod that holds no GPUs) just removes what `key` held."""
        key = pod.key if pod is not None else key
        if key is not None:
            self.upsert_pods(((key, pod),))

    def upsert_pods(self, pods: Iterable[tuple[PodKey, PodInfo | None]]) -> None:
        """Add or replace Pods (a page of a list) as one change, their pools packed once for all of them.
        None removes what the key held; for the GPU-less bulk of a cluster, which the index never held,
        it costs one lookup."""
        ledger = self._ledger
        held = ledger.held()
        changed = False
        for key, pod in pods:
            if pod is not None or key in held:
                if ledger.upsert_pod(pod, key):  # else what the namespace holds is as it was
                    self._namespace_changed(key[0])
                changed = True
        self._settle(changed=changed)

    def remove_pod(self, key: PodKey) -> None:
        self.upsert_pods(((key, None),))

    # --- reservations --------------------------------------------------------------------------------

    def reserve(self, reservation: Reservation, now: float) -> int:
        """Count an admitted Pod against its pool until the watch shows it; returns a token.

        The reservation's `name` or `generate_name` say which Pod it is, so that the watch and a
        re-invocation find it (`take_echo`); a Pod that names its `node` holds its GPUs on that node rather
        than in the pool. `echoed`: a re-invocation has matched it already (it is not matched again).
        `group`: the Pod's workload group, which holds a member on the pool from now on (so the next Pod of
        a burst finds its siblings before the watch shows any of them). `confirmed`: made by the Pod's
        validating call, which checked the Pod as it will be stored (`take_admitted` never finds it)."""
        token = self._ledger.reserve(reservation, now)
        self._namespace_changed(reservation.namespace)
        self._settle()
        return token

    def take_echo(
        self, namespace: str, name: str, generate_name: str, *, pool: PoolKey | None, node: str, gpus: int
    ) -> bool:
        """A re-invocation: kube-apiserver calls again for a Pod that already carries the placement
        gpupool gave it moments ago. Takes back that Pod's reservation (same Pod, pool or node, GPUs; not
        matched before), so the caller can decide without counting the Pod against itself and reserve
        again with `echoed=True`. False when there is none: then it is a Pod like any other."""
        if not self._ledger.take_echo(namespace, name, generate_name, pool=pool, node=node, gpus=gpus):
            return False
        self._namespace_changed(namespace)
        self._settle()
        return True

    def take_admitted(self, namespace: str, name: str, generate_name: str, *, pool: PoolKey | None, node: str) -> bool:
        """The validating call of a Pod takes back the reservation its mutating call made (found by the
        Pod's name, else its generateName; on `node`, else in `pool`, None for any pool), so the Pod as it
        will be stored is checked without counting it against itself, and reserved again (`confirmed`)
        only if it passes. False when this replica holds none."""
        if not self._ledger.take_admitted(namespace, name, generate_name, pool=pool, node=node):
            return False
        self._namespace_changed(namespace)
        self._settle()
        return True

    def release(self, token: int) -> None:
        self._ledger.release(token)
        self._namespace_changed(None)
        self._settle()

    def expire(self, now: float, current_since: float | None = None) -> int:
        """Drop reservations whose Pod never showed up (its creation failed later in admission, or the
        review was not from kube-apiserver): after `reservationSeconds`, or, when the watch has been
        current without a break since `current_since`, once a reservation made in that time is
        `reservationSettleSeconds` old (the Pod would have shown up by then)."""
        dropped = self._ledger.expire(now, current_since)
        if dropped:
            self._namespace_changed(None)
            self._settle()
        return dropped

    # --- quotas --------------------------------------------------------------------------------------

    def upsert_quota(self, quota: QuotaInfo | None, namespace: str = "", name: str = "") -> None:
        if quota is None:
            self.remove_quota(namespace, name)
            return
        self._quotas.upsert(quota)
        self._namespace_changed(quota.namespace)
        self.changes += 1

    def remove_quota(self, namespace: str, name: str) -> None:
        self.changes += 1
        self._namespace_changed(namespace)
        self._quotas.remove(namespace, name)
