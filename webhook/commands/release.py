"""`gpupool release NAME`: release one queued Pod by hand, as the queue's leader would, or say why not.

The Pod is decided by the leader's own release (`release_one` of webhook.queue.release: the one decision in
RELEASE mode, the one patch builder), on this command's own view of the cluster, alone: not behind the Pods
before it in the queue. `--pool` keeps it to one pool; `--ignore-quota` sets gpupool's own quotas aside
(class, GPU memory, the ResourceQuota forms gpupool counts; Kubernetes charged the `requests.` form when the
Pod was created). The release is one JSON Patch: the pool's constraints, gpupool's gate removed, the
resourceVersion the decision read as a precondition (a Pod changed since is not released: run again), and
`gpupool.io/released-by: manual/<user>` (`manual-ignore-quota/<user>`), the user kube-apiserver
authenticates this command as. gpupool's validating webhook accepts that annotation only from that user
(webhook.admission.fence), and kube-apiserver only from someone its RBAC lets patch the Pod. An Event on the
Pod (reason `Released`) says who released it, where to, and whether quotas were set aside. Once released
the Pod counts in its pool like any Pod the leader released: the leader's index sees it through its watch.
Until then the release record counts it: the decision counts that record (the leader's releases not sent
yet, other releases by hand, Pods naming their node) and the release is recorded there, with the version
read, before it is sent (webhook.pools.charges), so a release by hand never shares a quota or room with
one of the leader's.
"""

from __future__ import annotations

import argparse
import time
from typing import NamedTuple

from webhook.admission.fence import manual_token
from webhook.admission.patch import with_token
from webhook.commands.common import add_namespace_arguments, add_source_arguments, namespace_of, open_with_queue
from webhook.commands.output import say
from webhook.domain.errors import ConfigError
from webhook.domain.model import QUEUE_GATE, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.charges import RECORD_BYTES, ChargeError, ChargeStore, pending, record_bytes
from webhook.pools.index import PoolIndex
from webhook.pools.inventory import Inventory
from webhook.queue.records import recorded
from webhook.queue.release import Release, Wait, release_one, settle
from webhook.queue.waiting import Queued
from webhook.sources.charge_store import LeaseCharges
from webhook.sources.live import api_client
from webhook.sources.writes import Conflict, Event, Gone, PodReleaser, Released, record_event, whoami

COMPONENT = "gpupool-release"  # the Event's reporting component: a person, through this command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod", metavar="POD", help="the name of the queued Pod")
    add_source_arguments(parser)
    add_namespace_arguments(parser, "the Pod's namespace")
    parser.add_argument(
        "--pool",
        metavar="POOL",
        help="release it to this pool only (vendor/class/product, as `gpupool inventory` names them)",
    )
    parser.add_argument(
        "--ignore-quota",
        action="store_true",
        help="release it past gpupool's quotas (classQuota, memoryQuota, the ResourceQuota forms gpupool counts); "
        "the annotation and the Event say so",
    )


def run(args: argparse.Namespace) -> int:
    if args.inventory is not None:
        raise ConfigError("release writes to the live cluster: it takes no --inventory snapshot")
    namespace = namespace_of(args)
    key = (namespace, args.pod)
    what = f"pod/{args.pod} in namespace {namespace}"
    policy, inventory, waiting = open_with_queue(args)
    api = api_client(args.kubeconfig, args.context)
    record = LeaseCharges(api, args.webhook.partition("/")[0])
    try:
        user = whoami(api)
        queued = waiting.get(key)
        if queued is None:
            return _not_queued(args, api, key, what)
        outcome = _decide_recorded(args, Deciding(inventory, policy, queued, record), user)
    except ChargeError as exc:
        say(args, "error", f"{what} not released: {exc}; {UNRECORDED}")
        return 1
    except OSError as exc:
        say(args, "error", str(exc))
        return 1
    finally:
        inventory.close()
    if isinstance(outcome, Wait):
        return _stays(args, outcome, what)
    if isinstance(outcome, str):
        say(args, "error", f"{what} not released: {outcome}")
        return 1
    return _write(args, api, outcome, user, what, record)


UNRECORDED = (
    "a release by hand is recorded in the queue's release record before it is sent, so that the leader and "
    "every admission count it (it needs get and update on that Lease)"
)
TRIES = 5  # decisions against a record that changed meanwhile, before the command gives up


class Deciding(NamedTuple):
    """What the decision of a release by hand reads: the cluster as listed, the policy, the Pod, and the
    release record (the charges Lease, webhook.pools.charges)."""

    inventory: Inventory
    policy: Policy
    queued: Queued
    record: ChargeStore


def _decide_recorded(args: argparse.Namespace, d: Deciding, user: str) -> Release | Wait | str:
    """The Pod's release, decided counting the release record (the leader's releases and the releases by
    hand that this command's list does not show yet, and the charges of Pods that name their node, as an
    admission counts them), and recorded there with the version read before it is sent: so a release by
    hand takes no quota or room the leader gave away meanwhile, and the leader counts it until its watch
    shows it. A record that changed meanwhile is read and decided again, at most TRIES times; what it
    says when it cannot be recorded (a str). ChargeError: the record cannot be read or written."""
    ttl = d.policy.defaults.reservation_seconds
    for _ in range(TRIES):
        charges, version = d.record.read()
        wall = time.time()
        with d.inventory.read() as index:
            pool = _pool(args.pool, index)
            with pending(index, charges, wall, time.monotonic(), itself=d.queued.key):
                outcome = release_one(d.queued, index, d.policy, pool=pool, quotas=not args.ignore_quota)
        if isinstance(outcome, Wait):
            return outcome
        mine = recorded(outcome, d.policy, wall + ttl)._replace(by=user)
        live = [c for c in charges if c.expires > wall and c.key != mine.key]
        if record_bytes([*live, mine]) > RECORD_BYTES:
            return "the queue's release record is full (releases in flight); run again in a few seconds"
        if d.record.write([*live, mine], version):
            return outcome
        with d.inventory.read() as index:
            settle(index, outcome, None)  # decided again, with what was recorded meanwhile
    return f"the queue's release record changed {TRIES} times while it was decided; run again"


def _unrecord(record: ChargeStore, key: tuple[str, str]) -> None:
    """Take a release by hand that was not made out of the record again (best effort: left there, it
    expires after `reservationSeconds`)."""
    try:
        charges, version = record.read()
        record.write([c for c in charges if not (c.by and c.key == key)], version)
    except ChargeError:
        pass


def _not_queued(args: argparse.Namespace, api: object, key: tuple[str, str], what: str) -> int:
    if PodReleaser(api).read(*key) is None:
        say(args, "error", f"{what} not found")
    else:
        why = f"it carries no {QUEUE_GATE} scheduling gate (released already, or never queued)"
        say(args, "error", f"{what} is not queued: {why}")
    return 1


def _pool(text: str | None, index: PoolIndex) -> PoolKey | None:
    """The pool `--pool` names, among those the inventory has; None without `--pool`."""
    if text is None:
        return None
    pools = sorted(str(p.key) for p in index.capacity.pools())
    wanted = PoolKey.parse(text)
    if wanted is None or str(wanted) not in pools:
        raise ConfigError(f"--pool {text!r} is not a pool of this cluster; its pools: {', '.join(pools) or 'none'}")
    return wanted


def _stays(args: argparse.Namespace, wait: Wait, what: str) -> int:
    hint = " (--ignore-quota releases it past gpupool's quotas)" if wait.code == "quota" else ""
    say(args, "error", f"{what} not released ({wait.code}): {wait.reason}{hint}")
    return 1


def _write(args: argparse.Namespace, api: object, release: Release, user: str, what: str, record: ChargeStore) -> int:
    q = release.queued
    patch = with_token(release.patch, q.view.shape, manual_token(user, ignore_quota=args.ignore_quota))
    result = PodReleaser(api).release(q.key[0], q.key[1], patch)
    if not isinstance(result, Released):
        _unrecord(record, q.key)
    if isinstance(result, Conflict):
        why = "it changed since it was read (the queue's leader may have released it); run again"
        say(args, "error", f"{what} not released: {why}")
        return 1
    if isinstance(result, Gone):
        say(args, "error", f"{what} not found (deleted meanwhile)")
        return 1
    if not isinstance(result, Released):
        say(args, "error", f"{what} not released: {result.message}")
        return 1
    past = ", past gpupool's quotas (--ignore-quota)" if args.ignore_quota else ""
    message = f"released by hand by {user} to pool {release.pool}{past}"
    failed = record_event(api, Event(q.key[0], q.key[1], q.uid, "Released", message), COMPONENT, user)
    print(f"pod/{q.key[1]} {message}")
    if failed:
        say(args, "warning", f"the Pod is released, but its Event could not be recorded: {failed}")
    return 0
