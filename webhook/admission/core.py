"""Admission of one Pod: annotations -> request -> the one decision (pool, group, quotas) -> patch, as a Verdict.

`evaluate` is the pure core (no I/O, no clock): the same function answers kube-apiserver through the
Flask app and the user through `gpupool explain`. It is `prepare` (what the Pod alone decides,
webhook.admission.prepared) then `place` (what the pools decide, by the one decision of
webhook.admission.choice). `Admitter` binds them to a policy and an inventory, holds the
inventory's lock only for `place`, and records a reservation for each real (not dry-run, not audited)
placement; the server rebinds it when the policy file changes (webhook.serving.policyfile). In a
namespace under `enforcement: audit` the same answer is turned into an allowed one that says what it
would have been (webhook.admission.audit).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from webhook.admission import verdict
from webhook.admission.audit import audited
from webhook.admission.bound import check_bound, reachable
from webhook.admission.charging import for_now, is_charged
from webhook.admission.choice import ADMIT, QUEUE, choose
from webhook.admission.hints import hinted
from webhook.admission.patch import PatchSpec, build_patch
from webhook.admission.pod import PodError, PodView, read_ephemeral_containers
from webhook.admission.prepared import Prepared, prepare
from webhook.admission.queued import queue_verdict
from webhook.admission.recut import recut_note
from webhook.admission.request import GpuRequest, visible_devices_problem
from webhook.admission.verdict import GroupNote, Placement, Verdict
from webhook.admission.versions import PREVIOUS_SECONDS, PREVIOUS_VERSIONS, stamped
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.pools.charges import Charge, ChargeStore, pending
from webhook.pools.index import PoolIndex, Reservation, pooling
from webhook.pools.inventory import Inventory
from webhook.pools.memo import NO_MEMO, Memo
from webhook.pools.nodes import NodeFacts
from webhook.pools.quotas.checks import Held, held_quota_problem


def evaluate(
    pod: Any,
    namespace: str,
    policy: Policy,
    index: PoolIndex,
    *,
    explain: bool = True,
    shapes: Memo = NO_MEMO,
) -> Verdict:
    """The verdict for a Pod being created in `namespace`. `explain` adds a line per pool considered
    (for `gpupool explain`; the server does not need them, denial messages carry their own).

    `shapes` remembers, across calls with the same policy, what a Pod's shape alone decides
    (webhook.admission.pod.PodShape): its request, or why it is refused, and its patch for a placement.
    """
    prepared = prepare(pod, namespace, policy, shapes)
    if isinstance(prepared, Verdict):
        return prepared
    return place(prepared, policy, index, explain=explain, shapes=shapes)


def place(
    prepared: Prepared, policy: Policy, index: PoolIndex, *, explain: bool = True, shapes: Memo = NO_MEMO
) -> Verdict:
    """The pool for a prepared Pod, read from the index now, and the patch that pins it there (or, for a
    Pod that names its node, the check of that node's pool)."""
    view, req, _, devices = prepared
    if prepared.bypasses or (req.partitions and not req.resource):
        # A Pod placed by someone else, or one that requests several device resources no one pool offers.
        if prepared.bypasses:
            nodes = reachable(view.shape.requirements, view.node_name, index)
            result = check_bound(req, nodes, devices, policy, index)
        else:
            result = _partitions(req, policy, index)
        return replace(result, group=GroupNote(view.group, None, 0)) if view.group else result
    if policy.placement(req.namespace) == "queue":
        return queue_verdict(view, req, choose(req, view, index, policy, QUEUE), policy, index, shapes=shapes)
    choice = choose(req, view, index, policy, ADMIT)
    decision = choice.decision
    reasons = choice.explain() if explain else ()
    chosen = choice.chosen
    if chosen is None:
        message = hinted(choice, req, view, index, policy, shapes=shapes)
        note = recut_note(req, index, policy) if not decision.candidates else ""
        message = f"{message}. {note}" if note else message
        return verdict.deny(message, reasons=reasons, reason=choice.reason, group=choice.group)
    placement = Placement(
        pool=chosen.pool,
        resource=chosen.resource,
        gpus=req.count,
        pod_total=req.pod_total,
        selector=policy.hold_pins({**dict(req.node_selector), **dict(chosen.constraint.selector)}),
        has_capacity=chosen.fits,
        fallback=chosen.fallback,
        device=chosen.kind,
        constraint=chosen.constraint,
    )
    spec = PatchSpec(
        chosen.constraint, chosen.gpu_taints, req.container_index, chosen.resource, req.count, str(chosen.pool)
    )
    # The key is the patch's whole input, so nothing it reads can be left out of it.
    patch = shapes.get(
        (view.shape, spec),
        lambda: build_patch(view.shape, spec),
        size=lambda p: req.shape_bytes + _PATCH_OP * len(p.ops),
    )
    return verdict.place(placement, patch, warnings=decision.warnings, reasons=reasons, group=choice.group)


def _partitions(req: GpuRequest, policy: Policy, index: PoolIndex) -> Verdict:
    """A Pod that requests several kinds of device itself (a MIG profile and whole GPUs, or two profiles)
    and names no node: no one pool offers them all, so gpupool cannot place it, nor keep it inside a
    namespace's classes; its ResourceQuotas hold for every kind it requests."""
    listed = ", ".join(r for r, _ in req.own_requests)
    if policy.namespace(req.namespace).restricted:
        return verdict.deny(
            f"the Pod requests {listed}: several kinds of device, which no one pool offers; namespace "
            f"{req.namespace} may only use some GPU classes, so request one and let gpupool choose",
            reason="no-match",
        )
    held = [Held(resource, count) for resource, count in req.own_requests]
    problem, reason = held_quota_problem(req, [("the Pod's devices", held)], index, policy)
    if problem:
        return verdict.deny(problem, reason=reason)
    note = f"gpupool: {listed} are several kinds of device, which gpupool does not place; the Pod keeps its requests"
    return verdict.allow(f"requests {listed}, which gpupool does not place").with_warnings((note,))


# What one op of a patch holds, at most, with its piece (webhook.admission.pieces): its path, and a value
# made of the pool's labels, taints, resource and name (the cluster's, never the Pod's strings; node labels
# are validated: keys 317 characters, values 63), which the piece names again.
_PATCH_OP = 2048


def evaluate_ephemeral(pod: Any, old: Any, namespace: str, policy: Policy) -> Verdict:
    """The verdict for an update of `pods/ephemeralcontainers` (`kubectl debug`): the ephemeral containers
    it adds to the Pod (`old` is the Pod before it) are held to the NVIDIA_VISIBLE_DEVICES rule, as any
    container is. They request no resources (Kubernetes forbids it), so nothing is placed or counted,
    and the answer is a denial or allowed unchanged: never a patch."""
    try:
        added = read_ephemeral_containers(pod, old)
    except PodError as exc:
        return verdict.deny(str(exc), code=verdict.CODE_INVALID, reason="invalid")
    problem = visible_devices_problem(added, namespace, policy)
    if problem:
        return verdict.deny(problem, reason="visible-devices")
    return verdict.allow("ephemeral containers: none sets NVIDIA_VISIBLE_DEVICES")


class Binding(NamedTuple):
    """What an Admitter decides with: a policy, an inventory whose index was built for it, and what Pod
    shapes decide under that policy (webhook.pools.memo; valid for this policy only)."""

    policy: Policy
    inventory: Inventory
    shapes: Memo


class Admitter:
    """The core bound to a policy and an inventory, as the server uses it. `use` binds it to another
    policy (and inventory) between two admissions: each admission is decided by one policy, whole."""

    def __init__(
        self,
        policy: Policy,
        inventory: Inventory,
        clock: Callable[[], float] = time.monotonic,
        *,
        charges: bool = False,
        store: ChargeStore | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`charges`: the validating call charges Pods that bypass placement in queued namespaces in the
        API (webhook.admission.charging), so the mutating call reserves nothing for them. `store`: those
        charges and the releases the queue's leader records there (webhook.queue.records), which a `now`
        Pod is placed counting (`charging.for_now`: one read per call), so it takes neither a charged Pod's
        room nor that of a release this replica's watch has not shown yet, such as a half-released gang's;
        `wall`: the clock they expire by. None: no queue, nothing to read."""
        self._bound = Binding(policy, inventory, Memo())
        self._clock = clock
        self.charges = charges
        self._store, self._wall = store, wall
        # An inventory being built for the next policy: every reservation (and echo) made meanwhile is made
        # in it too, so it holds what the current one holds once the reservations made before are gone.
        self._successor: Inventory | None = None
        # The policies used before, newest first, with when each was replaced: those with the current pools
        # (an index built for the current one serves them), for the validating call (webhook.admission.versions).
        self._previous: tuple[tuple[Policy, float], ...] = ()

    @property
    def bound(self) -> Binding:
        return self._bound

    @property
    def policy(self) -> Policy:
        return self._bound.policy

    @property
    def inventory(self) -> Inventory:
        return self._bound.inventory

    def use(self, policy: Policy, inventory: Inventory | None = None) -> None:
        """Decide by `policy` from the next admission on, with `inventory` (built for it; by default the
        current one, for a policy whose pools are the same). Set under the current inventory's lock: an
        admission inside it finishes by the old policy, one that read the old binding decides again."""
        old = self._bound
        now = self._clock()
        pools = pooling(policy)
        kept = [(p, t) for p, t in ((old.policy, now), *self._previous) if p.digest != policy.digest]
        previous = tuple((p, t) for p, t in kept if pooling(p) == pools)[:PREVIOUS_VERSIONS]
        with old.inventory.read():
            self._bound = Binding(policy, inventory or old.inventory, Memo())
            self._successor = None
            self._previous = previous

    def previous(self) -> tuple[Policy, ...]:
        """The policies this Admitter decided by before the current one, newest first: at most
        PREVIOUS_VERSIONS, replaced within the last PREVIOUS_SECONDS, each with the current policy's pools."""
        since = self._clock() - PREVIOUS_SECONDS
        return tuple(p for p, replaced in self._previous if replaced >= since)

    def mirror_into(self, successor: Inventory | None) -> None:
        """From now on, also make every reservation in `successor` (None: stop)."""
        with self._bound.inventory.read():
            self._successor = successor

    def admit(self, pod: Any, *, namespace: str, dry_run: bool = False) -> Verdict:
        """The answer for a Pod being created. In a namespace under `enforcement: audit` it is decided
        as under `enforce`, as a dry run (nothing reserved), and answered `audited`: allowed unchanged."""
        counted: list[Charge] | None = None
        while True:
            bound = self._bound
            prepared = prepare(pod, namespace, bound.policy, bound.shapes)
            if isinstance(prepared, Verdict):
                return audited(prepared) if bound.policy.audits(namespace) else prepared
            audit = bound.policy.audits(prepared.pod.namespace)
            if counted is None:  # read once, outside the inventory's lock
                counted = self._counted(bound.policy, prepared.pod.namespace)
            result = self._place(bound, prepared, dry_run or audit, counted)
            if result is not None:
                return audited(result) if audit else stamped(result, prepared.pod.shape, bound.policy)

    def _counted(self, policy: Policy, namespace: str) -> list[Charge]:
        """What a `now` Pod is placed counting on top of the index (see __init__'s `store`); none in a
        namespace that queues (its Pods are the leader's to release, or charged by their validating call)."""
        if self._store is None or policy.placement(namespace) != "now":
            return []
        return for_now(self._store)

    def _place(self, bound: Binding, prepared: Prepared, dry_run: bool, counted: list[Charge]) -> Verdict | None:
        """Place a prepared Pod; None when the binding changed before the lock was had (decide again)."""
        policy, inventory, shapes = bound
        if not inventory.ready:
            return loading_denial()
        stale = self.stale_of(bound)
        view, req, node, devices = prepared
        # Only reading the pools and reserving hold the inventory's lock (which the watches need too).
        with inventory.read() as index:
            if bound is not self._bound:
                return None
            now = self._clock()
            index.expire(now, inventory.current_since())
            # kube-apiserver may call again with gpupool's own placement applied (reinvocationPolicy
            # IfNeeded): that Pod's reservation is taken back first, so it is not counted against itself.
            echo = not dry_run and bool(node or req.pool_pin is not None)
            echoed = echo and index.take_echo(
                view.namespace, view.name, view.generate_name, pool=req.pool_pin, node=node, gpus=devices
            )
            with pending(index, counted, self._wall() if counted else 0.0, now, itself=(view.namespace, view.name)):
                result = refused_if_stale(place(prepared, policy, index, explain=False, shapes=shapes), stale, policy)
            placement = result.placement
            # Every placed Pod counts until the watch shows it, pre-patched and bound ones too (only its
            # own re-invocation, recognised above, is not counted twice).
            charged = self.charges and is_charged(prepared, policy)  # its charge is its reservation
            reserve = placement if not (dry_run or charged) else None
            if reserve is not None:
                reserve_for(index, view, reserve, now, echoed=echoed)
            if self._successor is not None and not dry_run:
                _mirror(self._successor, prepared, reserve, now, echo=echo)
        if placement is not None and stale:
            note = f"gpupool: placed from a GPU inventory {stale:.0f} s stale; the pool may have changed"
            result = replace(result, warnings=(*result.warnings, note))
        return result

    def admit_ephemeral(self, pod: Any, *, namespace: str, old: Any = None) -> Verdict:
        """An update of pods/ephemeralcontainers; reads neither the inventory nor the clock."""
        policy = self.policy
        result = evaluate_ephemeral(pod, old, namespace, policy)
        return audited(result) if policy.audits(namespace) else result

    def stale_seconds(self) -> float:
        """How stale the inventory is beyond the policy's threshold (0 when fresh)."""
        return self.stale_of(self._bound)

    @staticmethod
    def stale_of(bound: Binding) -> float:
        """How stale `bound`'s inventory is beyond its policy's threshold (0 when fresh)."""
        age = bound.inventory.age_seconds()
        return age if age > bound.policy.defaults.stale_after_seconds else 0.0

    @property
    def shapes(self) -> Memo:
        """What Pod shapes decide under the current policy; the validating call (webhook.admission.validation)
        reads the same Pods, patched."""
        return self._bound.shapes

    def now(self) -> float:
        """The clock reservations are made and expired by."""
        return self._clock()


def reserve_for(
    index: PoolIndex, view: PodView, placement: Placement, now: float, *, echoed: bool, confirmed: bool = False
) -> int:
    """Hold what `placement` places for the Pod until the watch shows it (the mutating call's reservation,
    or the validating call's, `confirmed` by the Pod as it will be stored); the reservation's token."""
    return index.reserve(
        Reservation(
            namespace=view.namespace,
            pool=placement.pool,
            selector=placement.selector,
            gpus=placement.pod_total,
            name=view.name,
            generate_name=view.generate_name,
            node=placement.node,
            echoed=echoed,
            # A member of its group on the pool, as the Pod will be once the watch shows it carrying
            # gpupool.io/pool (a Pod that bypasses placement gets no pool written).
            group="" if placement.node else view.group,
            confirmed=confirmed,
        ),
        now,
    )


def _mirror(successor: Inventory, prepared: Prepared, placement: Placement | None, now: float, *, echo: bool) -> None:
    """Make in the inventory being built for the next policy what this admission did to the current one:
    take back a re-invoked Pod's reservation, reserve for the placement, in the pool the next policy puts
    those devices in. Where that is not one pool, nothing is reserved: the Pod counts once the watch
    shows it."""
    view, req, node, devices = prepared
    with successor.read() as index:
        index.expire(now, successor.current_since())
        echoed = echo and index.take_echo(
            view.namespace, view.name, view.generate_name, pool=req.pool_pin, node=node, gpus=devices
        )
        pool = None if placement is None else _pool_in(index, placement)
        if placement is not None and pool is not None:
            reserve_for(index, view, placement._replace(pool=pool), now, echoed=echoed)


def _pool_in(index: PoolIndex, placement: Placement) -> PoolKey | None:
    """The pool of another index (built for another policy) that holds what `placement` places: the pool
    of the devices of the one node a Pod that bypasses placement lands on, or the one pool its nodeSelector
    reaches, as the ledger will count the Pod once the watch shows it (webhook.pools.claims)."""
    if placement.node:
        facts = index.capacity.node_facts(placement.node, placement.resource)
        return facts.pool if isinstance(facts, NodeFacts) else None
    pins = tuple(sorted((k, v) for k, v in placement.selector if index.policy.pins_pool(k)))
    reached = [
        p.key for p in index.capacity.pools(placement.pool.vendor) if p.resource == placement.resource and p.reach(pins)
    ]
    return reached[0] if len(reached) == 1 else None


def loading_denial() -> Verdict:
    """A GPU Pod refused because this worker's inventory has not finished its first list (a worker that
    just started, or was restarted while its Pod is still in the Service): decided from an empty index it
    would be told no pool matches, which is neither true nor the Pod's doing."""
    return verdict.deny(
        "gpupool's GPU inventory is still loading (this server has not finished its first list of the "
        "cluster); GPU Pods are refused until it has, which takes seconds: retry",
        code=verdict.CODE_UNAVAILABLE,
        reason="loading",
    )


def refused_if_stale(result: Verdict, stale: float, policy: Policy) -> Verdict:
    """`result` under policy onStale: a placement made from an inventory `stale` seconds old (0: fresh) is
    refused under `deny` (`stale_denial`); anything else is left as it is."""
    if result.placement is not None and stale and policy.defaults.on_stale == "deny":
        return stale_denial(stale)
    return result


def stale_denial(stale: float) -> Verdict:
    """A GPU Pod refused because the inventory is `stale` seconds old under policy onStale: deny."""
    return verdict.deny(
        f"the GPU inventory is stale (no contact with the API for {stale:.0f} s); "
        "policy onStale is deny, so GPU Pods are refused until it re-syncs",
        code=verdict.CODE_UNAVAILABLE,
        reason="stale",
    )
