"""Tests for webhook.admission.validation: the Pod as it will be stored (CREATE) and what only gpupool may
change once a GPU Pod exists (UPDATE).

A CREATE is played as kube-apiserver plays it: the mutating call (`Admitter.admit`), its patch applied,
the name generated, whatever a later mutating webhook does, then the validating call on that object.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, event, given, settings

from tests.admission.clocked import Clock, CurrentInventory
from tests.admission.demo import demo_policy
from tests.admission.podgen import NAMESPACES, pod_st
from tests.builders import fleet, gpu_node, index_of, pod, policy, quota
from tests.conftest import DEMO_INVENTORY
from webhook.admission.core import Admitter
from webhook.admission.pieces import GateAdded, PodPatch
from webhook.admission.pod import read_pod
from webhook.admission.validation import Caller, Trusted, Validator, as_stored
from webhook.admission.verdict import Verdict
from webhook.domain.model import QUEUE_GATE
from webhook.domain.policy import Policy
from webhook.sources.snapshot import parse_objects

GPUPOOL = "system:serviceaccount:gpupool-system:gpupool-webhook"
DEMO_OBJECTS = list(parse_objects(DEMO_INVENTORY.read_text(), str(DEMO_INVENTORY)))
ALICE = Caller("alice", ("system:authenticated", "team-ml"))
T4 = "nvidia/medium/Tesla-T4"
Obj = dict[str, Any]


class Replica:
    """One gpupool replica: its Admitter (the mutating call) and Validator on one inventory."""

    def __init__(
        self, objects: list[Obj], pol: Policy | None = None, trusted: Trusted | None = None, clock: Clock | None = None
    ) -> None:
        self.policy = pol or policy()
        self.clock = clock or Clock()
        self.inventory = CurrentInventory(index_of(objects, self.policy), "test")
        self.admitter = Admitter(self.policy, self.inventory, clock=self.clock)
        self.validator = Validator(self.admitter, trusted or Trusted.of("gpupool-system", "gpupool-webhook"))

    def mutate(self, obj: Obj, namespace: str = "ml", *, dry_run: bool = False) -> Obj:
        """The mutating call; the Pod as it leaves it (patched, named as kube-apiserver names it)."""
        result = self.admitter.admit(obj, namespace=namespace, dry_run=dry_run)
        assert result.allowed, result.message
        stored: Obj = jsonpatch.apply_patch(obj, list(result.patch))
        meta = stored["metadata"]
        if not meta.get("name"):
            meta["name"] = meta["generateName"] + "x7k2p"
        return stored

    @property
    def reservations(self) -> int:
        with self.inventory.read() as index:
            return index.usage.reservations

    def probe(self, gpus: int = 1, namespace: str = "ml") -> bool:
        """Whether a dry run of another Pod of `gpus` GPUs would be admitted now (quota room left)."""
        other = pod("probe", namespace, annotations={"gpupool.io/gpu-class": "medium"}, gpus=gpus)
        return self.admitter.admit(other, namespace=namespace, dry_run=True).allowed


def quota_fleet(hard: int = 2) -> list[Obj]:
    """The core's fleet, and namespace ml with a ResourceQuota of `hard` GPUs."""
    return [*fleet(), quota("gpus", "ml", {"requests.nvidia.com/gpu": str(hard)}, {"requests.nvidia.com/gpu": "0"})]


def medium(gpus: int | None = None, **kw: Any) -> Obj:
    """A Pod made from a generateName that asks for a medium GPU (the core's fleet: a T4)."""
    obj = pod("", annotations={"gpupool.io/gpu-class": "medium"}, gpus=gpus, **kw)
    obj["metadata"].pop("name")
    obj["metadata"]["generateName"] = "train-"
    return obj


# --- CREATE: the Pod as gpupool left it ---------------------------------------------------------------


def test_a_pod_as_gpupool_placed_it_passes_and_its_reservation_is_confirmed() -> None:
    """The stored Pod (patched, named from its generateName) is allowed, counted in its pool, and the
    mutating call's reservation is found under the generateName and kept: still one, still counting."""
    replica = Replica(quota_fleet(hard=1))
    stored = replica.mutate(medium())
    assert not replica.probe()  # the quota's one GPU is held
    checked = replica.validator.validate_create(stored, namespace="ml")
    assert checked.verdict.allowed, checked.verdict.message
    assert (checked.pool, checked.reservation) == (T4, "confirmed")
    assert checked.verdict.patch == () and checked.verdict.warnings == ()
    assert replica.reservations == 1
    assert not replica.probe()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=pod_st(), namespace=NAMESPACES)
def test_a_pod_no_later_webhook_touched_is_answered_as_its_mutating_call_was(obj: Obj, namespace: str) -> None:
    """For any Pod on the demo cluster: the validating call of the Pod the mutating call left allows it
    exactly when the mutating call did (the rules are the same, and the mutating answer is idempotent),
    and leaves exactly the reservations the mutating call made."""
    replica = Replica(DEMO_OBJECTS, demo_policy())
    result = replica.admitter.admit(copy.deepcopy(obj), namespace=namespace)
    event(result.outcome)
    made = replica.reservations
    stored = jsonpatch.apply_patch(obj, list(result.patch)) if result.allowed else copy.deepcopy(obj)
    if not stored["metadata"].get("name"):
        stored["metadata"]["name"] = "job-x7k2p"
    checked = replica.validator.validate_create(stored, namespace=namespace)
    assert checked.verdict.allowed is result.allowed, (result.message, checked.verdict.message)
    assert checked.verdict.patch == ()
    assert replica.reservations == made
    assert checked.reservation == ("confirmed" if made else "")


# --- CREATE: what a later mutating webhook may have done --------------------------------------------


def remove_selector(p: Obj) -> None:
    del p["spec"]["nodeSelector"]


def repoint_selector(p: Obj) -> None:
    p["spec"]["nodeSelector"]["nvidia.com/gpu.product"] = "NVIDIA-L4"


def remove_limit(p: Obj) -> None:
    del p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]


def raise_count(p: Obj) -> None:
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"


def to_mig(p: Obj) -> None:
    limits = p["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/mig-1g.5gb"] = limits.pop("nvidia.com/gpu")


def remove_pool(p: Obj) -> None:
    del p["metadata"]["annotations"]["gpupool.io/pool"]


def visible_devices(p: Obj) -> None:
    p["spec"]["containers"].append(
        {"name": "debug", "image": "busybox", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    )


def bind_elsewhere(p: Obj) -> None:
    p["spec"]["nodeName"] = "a100-a"


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        (remove_selector, 403, "lacks what keeps it in pool nvidia/medium/Tesla-T4: nodeSelector gpu.accelerator/cl"),
        (repoint_selector, 403, "nodeSelector nvidia.com/gpu.product=NVIDIA-L4 excludes it"),
        (remove_limit, 403, "lacks what keeps it in pool nvidia/medium/Tesla-T4: limit nvidia.com/gpu: 1 on container"),
        (raise_count, 403, "quota gpus in namespace ml: requests.nvidia.com/gpu used 0 + requested 4 > hard 2"),
        (to_mig, 403, "its devices are nvidia.com/gpu, the Pod requests nvidia.com/mig-1g.5gb"),
        (remove_pool, 403, "lacks what keeps it in pool nvidia/medium/Tesla-T4: annotation gpupool.io/pool=nvidia"),
        (visible_devices, 403, "NVIDIA_VISIBLE_DEVICES"),
        (bind_elsewhere, 403, "node a100-a is in pool nvidia/high/NVIDIA-A100-SXM4-40GB"),
    ],
    ids=["selector-removed", "selector-repointed", "limit-removed", "count-past-quota", "resource-changed",
         "pool-annotation-removed", "visible-devices-added", "bound-to-another-pool"],
)  # fmt: skip
def test_a_later_webhooks_change_is_refused_and_the_reservation_dropped(
    change: Callable[[Obj], None], code: int, words: str
) -> None:
    """Whatever a mutating webhook called after gpupool's did to the GPU requests, the constraints, the
    pool annotation or the containers, the stored Pod is refused with the reason (what it lacks, or the
    rule it breaks), and the mutating call's reservation is gone at once: the quota is free again."""
    replica = Replica(quota_fleet(hard=2))
    stored = replica.mutate(medium())
    change(stored)
    checked = replica.validator.validate_create(stored, namespace="ml")
    assert (checked.verdict.allowed, checked.verdict.code) == (False, code)
    assert words in checked.verdict.message
    assert checked.reservation == "dropped"
    assert replica.reservations == 0
    assert replica.probe(gpus=2)


def test_a_term_a_later_webhook_added_must_carry_the_pools_requirements() -> None:
    """Where the pool is told apart by node affinity (a T4 labelled high among unlabelled ones), a later
    webhook that adds a term (ORed: it could reach the high T4) is refused, naming the requirement the
    term lacks; the Pod whose one term carries it passes."""
    nodes = [gpu_node(n, "Tesla-T4", gpu_class=None) for n in ("t4-a", "t4-b")] + [
        gpu_node("t4-h", "Tesla-T4", gpu_class="high")
    ]
    replica = Replica(nodes)
    stored = replica.mutate(medium())
    assert replica.validator.validate_create(copy.deepcopy(stored), namespace="ml").verdict.allowed
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"].append({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                             "values": ["t4-h"]}]})  # fmt: skip
    checked = replica.validator.validate_create(stored, namespace="ml")
    assert not checked.verdict.allowed
    assert "node-affinity requirement gpu.accelerator/class notin (high,low) in term 1" in checked.verdict.message


def test_a_pod_refused_before_its_request_is_read_drops_its_reservation() -> None:
    """A later webhook that makes the Pod malformed: 400, and its reservation (any pool) is dropped."""
    replica = Replica(quota_fleet())
    stored = replica.mutate(medium())
    stored["metadata"]["annotations"]["gpupool.io/gpu-count"] = "two"
    checked = replica.validator.validate_create(stored, namespace="ml")
    assert (checked.verdict.allowed, checked.verdict.code, checked.reservation) == (False, 400, "dropped")
    assert replica.reservations == 0


def test_a_denial_of_the_validating_call_says_how_to_fix_it_as_the_mutating_call_does() -> None:
    """A Pod whose mutating call never ran (failurePolicy Ignore and a timeout): the validating call
    denies it as that call would have, with the same words on how to fix it (issue 21, finding 7)."""
    replica = Replica(DEMO_OBJECTS, demo_policy())
    obj = pod("big", "team-a", annotations={"gpupool.io/gpu-count": "2", "gpupool.io/min-memory": "40Gi"})
    mutating = replica.admitter.admit(obj, namespace="team-a", dry_run=True)
    checked = replica.validator.validate_create(obj, namespace="team-a")
    assert (checked.verdict.allowed, checked.verdict.reason, checked.reservation) == (False, "no-match", "")
    assert checked.verdict.message == mutating.message
    assert "team-a allows it with gpupool.io/gpu-class: high, but not now: GPU memory quota" in mutating.message


# --- CREATE: reservations ---------------------------------------------------------------------------


def test_a_confirmed_reservation_settles_counted_from_the_validating_call() -> None:
    """With a current watch a reservation settles 5 s after it was made. The validating call at 4 s
    confirms it: at 7 s (past the mutating call's 5 s) it still holds the quota, at 9.5 s (5 s after the
    validating call, no Pod in the watch) it is gone."""
    replica = Replica(quota_fleet(hard=1))
    stored = replica.mutate(medium())
    replica.clock.now += 4
    assert replica.validator.validate_create(stored, namespace="ml").reservation == "confirmed"
    replica.clock.now += 3
    assert not replica.probe()
    replica.clock.now += 2.5
    assert replica.probe()


def test_an_unconfirmed_reservation_settles_from_the_mutating_call() -> None:
    """The reference: without the validating call, the same reservation is gone after 5 s."""
    replica = Replica(quota_fleet(hard=1))
    replica.mutate(medium())
    replica.clock.now += 5.5
    assert replica.probe()


def test_the_other_replica_has_nothing_to_confirm_and_reserves_the_pod_itself() -> None:
    """The validating call may reach the replica that did not answer the mutating call: it checks the
    Pod against its own view, with the Pod counted once, and reserves it there (so its next admissions
    see it); the mutating replica's reservation is untouched and waits for its own watch."""
    first, other = Replica(quota_fleet(hard=1)), Replica(quota_fleet(hard=1))
    stored = first.mutate(medium())
    checked = other.validator.validate_create(stored, namespace="ml")
    assert (checked.verdict.allowed, checked.reservation) == (True, "made")
    assert (first.reservations, other.reservations) == (1, 1)
    assert not other.probe()


def test_a_dry_run_confirms_and_drops_nothing() -> None:
    """A dry run (`kubectl apply --dry-run=server`: both calls dry) is answered as a real one and
    reserves nothing; a dry-run validating call for a Pod whose real mutating call reserved drops
    nothing when it refuses and confirms nothing when it allows: the reservation settles as before."""
    replica = Replica(quota_fleet(hard=2))
    trial = replica.mutate(medium(), dry_run=True)
    checked = replica.validator.validate_create(trial, namespace="ml", dry_run=True)
    assert (checked.verdict.allowed, checked.pool, checked.reservation) == (True, T4, "")
    assert replica.reservations == 0
    stored = replica.mutate(medium())
    broken = copy.deepcopy(stored)
    remove_selector(broken)
    refused = replica.validator.validate_create(broken, namespace="ml", dry_run=True)
    assert (refused.verdict.allowed, refused.reservation) == (False, "")
    allowed = replica.validator.validate_create(stored, namespace="ml", dry_run=True)
    assert (allowed.verdict.allowed, allowed.reservation) == (True, "")
    assert replica.reservations == 1
    replica.clock.now += 5.5
    assert replica.probe(gpus=2), "a dry run confirmed the reservation"


def test_a_confirmed_reservation_cannot_be_dropped_by_a_review_for_the_same_pod() -> None:
    """Each Pod is validated once: a second review for its name (a forged one, refused) finds nothing to
    drop, so the real Pod stays counted until the watch shows it."""
    replica = Replica(quota_fleet(hard=1))
    stored = replica.mutate(medium())
    replica.validator.validate_create(copy.deepcopy(stored), namespace="ml")
    forged = copy.deepcopy(stored)
    remove_selector(forged)
    checked = replica.validator.validate_create(forged, namespace="ml")
    assert (checked.verdict.allowed, checked.reservation) == (False, "")
    assert not replica.probe()


def test_a_pod_that_names_its_node_is_checked_there_and_its_reservation_confirmed() -> None:
    """A Pod with spec.nodeName gets no patch; its stored form is checked on its node and the reservation
    held on that node is confirmed."""
    replica = Replica(quota_fleet(hard=2))
    bound = pod("bound", gpus=1, node="t4-a")
    stored = replica.mutate(bound)
    checked = replica.validator.validate_create(stored, namespace="ml")
    assert (checked.verdict.allowed, checked.pool, checked.reservation) == (True, T4, "confirmed")
    assert replica.reservations == 1


def test_under_on_stale_deny_a_stale_inventory_refuses_and_drops() -> None:
    """The validating call follows onStale as the mutating call does: refused (503) while stale, with the
    reservation dropped."""
    replica = Replica(quota_fleet(), policy("defaults: {onStale: deny}"))
    stored = replica.mutate(medium())
    replica.inventory.age = 600.0
    checked = replica.validator.validate_create(stored, namespace="ml")
    assert (checked.verdict.allowed, checked.verdict.code, checked.reservation) == (False, 503, "dropped")


# --- UPDATE: what only gpupool may change --------------------------------------------------------------


def placed_pod() -> Obj:
    """A GPU Pod as it is stored after gpupool placed it, in a workload group."""
    obj = pod("train-0", annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/pool": T4,
                                      "gpupool.io/group": "sweep"},
              gpus=1, node_selector={"nvidia.com/gpu.product": "Tesla-T4"},
              tolerations=[{"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute"}
                           for k in ("not-ready", "unreachable")])  # fmt: skip
    obj["metadata"]["labels"] = {"app": "train"}
    return obj


def queued_pod() -> Obj:
    """A Pod the queue holds: its GPU limit, gpupool's gate, nothing that pins a pool."""
    obj = pod("train-1", annotations={"gpupool.io/gpu-class": "medium"}, gpus=1)
    obj["spec"]["schedulingGates"] = [{"name": QUEUE_GATE}]
    return obj


def released(obj: Obj) -> Obj:
    """What the queue's one release PATCH makes of a queued Pod: nodeSelector entries, an appended
    node-affinity requirement, a toleration, gpupool.io/pool, and the gate removed."""
    new = copy.deepcopy(obj)
    new["metadata"]["annotations"]["gpupool.io/pool"] = T4
    new["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Tesla-T4"}
    new["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu.accelerator/class", "operator": "NotIn",
                                                     "values": ["high", "low"]}]}]}}}  # fmt: skip
    new["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    new["spec"].pop("schedulingGates")
    return new


def update(validator: Validator, old: Obj, new: Obj, caller: Caller = ALICE) -> Any:
    return validator.validate_update(new, old, namespace="ml", caller=caller).verdict


@pytest.mark.parametrize(
    ("key", "value"),
    [("gpupool.io/pool", "nvidia/high/NVIDIA-H100-80GB-HBM3"), ("gpupool.io/group", "other"),
     ("gpupool.io/gpu-class", "high"), ("gpupool.io/group-size", "8")],
    ids=["pool", "group", "class", "group-size"],
)  # fmt: skip
def test_a_users_change_of_a_gpupool_annotation_is_refused_and_gpupools_own_allowed(key: str, value: str) -> None:
    """The accounting reads gpupool.io/pool and gpupool.io/group: a user repointing either (or any other
    gpupool.io/ annotation) is refused with what changed and who may; gpupool's service account may."""
    validator = Replica(fleet()).validator
    old = placed_pod()
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][key] = value
    refused = update(validator, old, new)
    assert (refused.allowed, refused.code, refused.reason) == (False, 403, "guarded")
    how = "changed" if key in old["metadata"]["annotations"] else "added"
    assert f"alice changed annotation {key} ({how})" in refused.message
    assert f"only gpupool's service account {GPUPOOL} may change" in refused.message
    assert update(validator, old, new, Caller(GPUPOOL)).allowed
    removed = copy.deepcopy(new)
    del removed["metadata"]["annotations"][key]
    assert f"annotation {key} (removed)" in update(validator, new, removed).message


def test_a_release_that_leaves_out_nodes_the_leader_keeps_passes() -> None:
    """A release into a pool some of whose nodes the leader keeps from new Pods (a MIG drain, a held node)
    carries `kubernetes.io/hostname NotIn [...]` beside the pool's requirements: the validating call on
    another replica, which keeps no node, still finds nothing missing and allows it."""
    validator = Replica(fleet()).validator
    old = queued_pod()
    new = released(old)
    term = new["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    term["nodeSelectorTerms"][0]["matchExpressions"].append(
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["t4-node-0"]}
    )
    verdict = update(validator, old, new, Caller(GPUPOOL))
    assert verdict.allowed, verdict.message


def test_the_release_patch_passes_for_gpupool_only() -> None:
    """The queue's release (constraints, toleration and pool added, gate removed, in one update) is
    allowed for gpupool's service account; the same update by the Pod's owner (ungating to jump the
    queue) is refused naming every change, and why the gate is gpupool's."""
    validator = Replica(fleet()).validator
    old = queued_pod()
    assert update(validator, old, released(old), Caller(GPUPOOL)).allowed
    refused = update(validator, old, released(old))
    assert not refused.allowed
    for change in ("annotation gpupool.io/pool (added)", "nodeSelector nvidia.com/gpu.product",
                   "required node affinity", "tolerations", f"scheduling gate {QUEUE_GATE} (removed)"):  # fmt: skip
        assert change in refused.message, change
    assert "gpupool releases a queued Pod once its pool has room" in refused.message
    ungated = copy.deepcopy(old)
    ungated["spec"].pop("schedulingGates")
    assert f"alice changed scheduling gate {QUEUE_GATE} (removed)" in update(validator, old, ungated).message


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["spec"]["nodeSelector"].update({"topology.kubernetes.io/zone": "a"}),
        lambda p: p["spec"].update(tolerations=[{"operator": "Exists"}]),
        lambda p: p["spec"].update(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]}}}),
        lambda p: p["spec"].update(nodeName="a100-a"),
        lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "2"}),
    ],
    ids=["node-selector", "tolerations", "node-affinity", "node-name", "gpu-limit"],
)  # fmt: skip
def test_a_users_change_of_placement_or_gpu_resources_is_refused(change: Callable[[Obj], None]) -> None:
    """nodeSelector, tolerations, required node affinity, nodeName and GPU limits are gpupool's once the
    Pod exists (Kubernetes forbids some of these itself; the check does not rely on it)."""
    validator = Replica(fleet()).validator
    old = placed_pod()
    new = copy.deepcopy(old)
    change(new)
    assert not update(validator, old, new).allowed
    assert update(validator, old, new, Caller(GPUPOOL)).allowed


def test_trusted_users_and_groups_may_and_the_message_names_them() -> None:
    """The users and groups the admin trusts (an emergency release by hand, another controller's
    service account) may change what gpupool guards; the denial for anyone else names them."""
    trusted = Trusted.of("gpu", "pool", users=["bob"], groups=["oncall"])
    validator = Replica(fleet(), trusted=trusted).validator
    old = queued_pod()
    new = released(old)
    assert update(validator, old, new, Caller("bob")).allowed
    assert update(validator, old, new, Caller("carol", ("system:authenticated", "oncall"))).allowed
    assert update(validator, old, new, Caller("system:serviceaccount:gpu:pool")).allowed
    refused = update(validator, old, new)
    assert "only gpupool's service account system:serviceaccount:gpu:pool, user bob and group oncall" in refused.message
    assert not update(validator, old, new, Caller(GPUPOOL)).allowed  # another install's account


def test_a_cluster_admin_releasing_by_hand_is_refused_unless_acting_as_gpupool_or_trusted() -> None:
    """Being cluster-admin (system:masters) is no exception: the emergency release by hand of
    docs/install.md impersonates gpupool's service account, or is made by a trusted group."""
    old = queued_pod()
    ungated = copy.deepcopy(old)
    ungated["spec"].pop("schedulingGates")
    admin = Caller("kubernetes-admin", ("kubeadm:cluster-admins", "system:masters", "system:authenticated"))
    refused = update(Replica(fleet()).validator, old, ungated, admin)
    assert f"kubernetes-admin changed scheduling gate {QUEUE_GATE} (removed)" in refused.message
    assert update(Replica(fleet()).validator, old, ungated, Caller(GPUPOOL)).allowed
    trusted = Trusted.of("gpupool-system", "gpupool-webhook", groups=["system:masters"])
    assert update(Replica(fleet(), trusted=trusted).validator, old, ungated, admin).allowed


KUEUE = "system:serviceaccount:kueue-system:kueue-controller-manager"
KUEUE_GATE = "kueue.x-k8s.io/admission"


def test_kueues_plain_pod_release_needs_its_service_account_trusted() -> None:
    """Kueue's plain-Pod integration admits a Pod it gated by one update: its flavor's nodeSelector and
    tolerations added, its gate removed. On a GPU Pod gpupool placed that changes what gpupool guards, so
    it is refused from Kueue's service account unless the admin trusts it (--trusted-users, as
    docs/install.md says); a flavor that adds nothing, only Kueue's gate removed, needs no trust."""
    old = placed_pod()
    old["spec"]["schedulingGates"] = [{"name": KUEUE_GATE}]
    admitted = copy.deepcopy(old)
    admitted["spec"].pop("schedulingGates")
    admitted["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"] = "t4-pool"
    admitted["spec"]["tolerations"].append({"key": "kueue.example.com/flavor", "operator": "Exists"})
    refused = update(Replica(fleet()).validator, old, admitted, Caller(KUEUE))
    assert (refused.allowed, refused.code, refused.reason) == (False, 403, "guarded")
    assert f"{KUEUE} changed nodeSelector cloud.google.com/gke-nodepool; tolerations" in refused.message
    trusted = Trusted.of("gpupool-system", "gpupool-webhook", users=[KUEUE])
    assert update(Replica(fleet(), trusted=trusted).validator, old, admitted, Caller(KUEUE)).allowed
    ungated = copy.deepcopy(old)
    ungated["spec"].pop("schedulingGates")
    assert update(Replica(fleet()).validator, old, ungated, Caller(KUEUE)).allowed


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["metadata"]["labels"].update({"app": "serve"}),
        lambda p: p["metadata"]["annotations"].update({"example.com/owner": "ml"}),
        lambda p: p["metadata"].update(finalizers=["example.com/keep"], deletionTimestamp="2026-12-01T00:00:00Z"),
        lambda p: p["spec"]["containers"][0].update(image="nvidia/cuda:12.5.0-runtime-ubuntu22.04"),
        lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"cpu": "2"}),
        lambda p: p["spec"].update(activeDeadlineSeconds=600),
        lambda p: p["spec"]["tolerations"].reverse(),
    ],
    ids=["label", "other-annotation", "finalizer-and-deletion", "image", "cpu-limit", "deadline",
         "tolerations-reordered"],
)  # fmt: skip
def test_changes_gpupool_does_not_guard_are_anyones(change: Callable[[Obj], None]) -> None:
    """Labels, other tools' annotations, finalizers, images, cpu and memory, deadlines: allowed for anyone."""
    validator = Replica(fleet()).validator
    old = placed_pod()
    new = copy.deepcopy(old)
    change(new)
    assert update(validator, old, new).allowed


def test_another_controllers_gate_is_its_own_business() -> None:
    """Removing another controller's scheduling gate from a GPU Pod neither releases a Pod gpupool holds
    nor moves it: allowed; gpupool's own gate stays gpupool's."""
    validator = Replica(fleet()).validator
    old = queued_pod()
    old["spec"]["schedulingGates"].append({"name": "example.com/approval"})
    new = copy.deepcopy(old)
    new["spec"]["schedulingGates"] = [{"name": QUEUE_GATE}]
    assert update(validator, old, new).allowed
    new["spec"]["schedulingGates"] = [{"name": "example.com/approval"}]
    assert not update(validator, old, new).allowed


def test_pods_that_are_not_gpu_pods_are_left_alone_until_they_claim_to_be() -> None:
    """A Pod without GPUs or gpupool.io/ annotations may change its tolerations; giving it a
    gpupool.io/pool annotation makes it gpupool's business, and is refused."""
    validator = Replica(fleet()).validator
    old = pod("web", tolerations=[])
    new = copy.deepcopy(old)
    new["spec"]["tolerations"] = [{"key": "spot", "operator": "Exists"}]
    assert update(validator, old, new).allowed
    new["metadata"]["annotations"] = {"gpupool.io/pool": T4}
    assert "annotation gpupool.io/pool (added)" in update(validator, old, new).message


def test_a_malformed_update_is_refused_naming_the_field_never_an_error() -> None:
    """A new object gpupool cannot read is a 400 naming the field; an old one too, saying it is the
    stored Pod; schedulingGates that is not a list is named as well."""
    validator = Replica(fleet()).validator
    old = placed_pod()
    bad = copy.deepcopy(old)
    bad["spec"]["tolerations"] = "all"
    refused = update(validator, old, bad)
    assert (refused.allowed, refused.code) == (False, 400) and "spec.tolerations" in refused.message
    stored = update(validator, bad, old)
    assert (stored.code, stored.message.startswith("the Pod as stored: spec.tolerations")) == (400, True)
    gates = copy.deepcopy(old)
    gates["spec"]["schedulingGates"] = {"name": QUEUE_GATE}
    assert "spec.schedulingGates: expected a list" in update(validator, old, gates).message
    assert update(validator, old, None).code == 400


def test_a_queued_pod_whose_gate_a_later_webhook_removed_is_refused_naming_the_gate() -> None:
    """A Pod the queue holds is placed nowhere yet: what keeps it waiting is gpupool's gate, and a Pod the
    mutating call would still gate (a later webhook removed it) is refused, naming the gate."""
    gate = {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": QUEUE_GATE}]}
    held = Verdict(allowed=True, outcome="mutated", changes=PodPatch((GateAdded(QUEUE_GATE, gate),)))
    view = read_pod(queued_pod(), "ml")
    refused = as_stored(held, view)
    assert (refused.allowed, refused.reason) == (False, "changed")
    assert f"it lacks what keeps it in gpupool's queue: the scheduling gate {QUEUE_GATE}" in refused.message
    assert as_stored(Verdict(allowed=True, outcome="unchanged"), view).allowed
