"""What the admission core answers for one Pod: the contract between the core and its edges.

The Flask app turns a Verdict into an AdmissionReview response, `gpupool explain` prints it, and the
Admitter reserves its placement in the pool index. The builders (`allow`, `deny`, `place`, `queue`) keep
the invariants in one place: a denial has no patch, a patch only comes with a chosen pool or the queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from webhook.admission.pieces import NO_PATCH, Op, PodPatch
from webhook.domain.affinity import NO_CONSTRAINT, PoolConstraint
from webhook.domain.model import PoolKey

# "audited": allowed unchanged under `enforcement: audit`, whatever gpupool would have answered (`audit`).
Outcome = Literal["mutated", "unchanged", "denied", "audited"]
# Why a Pod was denied, for metrics and logs (the message is for people and may change).
Reason = Literal[
    "", "invalid", "no-match", "no-capacity", "quota", "class-quota", "stale", "visible-devices", "bound-node",
    "memory-quota", "group", "changed", "guarded", "loading", "fenced",
    "charges", "forged",
]  # fmt: skip
# "changed": the Pod as it will be stored is not as gpupool placed it (webhook.admission.validation);
# "guarded": an UPDATE changes what only gpupool may change on a GPU Pod; "fenced": a release whose
# leader's term is over (webhook.admission.fence); "charges": the API's charges of Pods that bypass
# placement could not be read or written (webhook.admission.charging); "forged": a release by hand that
# names another user than the one making it.

# Status codes on denials, as kube-apiserver passes them on to the user.
CODE_INVALID = 400  # an annotation or the Pod itself is malformed
CODE_FORBIDDEN = 403  # policy, quota or capacity says no
CODE_UNAVAILABLE = 503  # gpupool cannot decide now (inventory still loading, or stale under onStale: deny)


class Placement(NamedTuple):
    """The chosen pool and what the Pod takes from it. (A NamedTuple: one is built per placed Pod, and a
    frozen dataclass costs several times more to build.)"""

    pool: PoolKey
    resource: str  # e.g. nvidia.com/gpu
    gpus: int  # GPUs of the target container, as the patch sets them
    pod_total: int  # GPUs of the whole Pod (what a node must have free)
    selector: tuple[tuple[str, str], ...]  # the pool labels its nodeSelector pins once patched (its hold's reach)
    has_capacity: bool  # False when admitted under on-no-capacity=warn
    fallback: bool  # True when the pool is of a class the Pod did not ask for
    device: str = "gpu"  # the kind of device: gpu, mig or shared
    constraint: PoolConstraint = NO_CONSTRAINT  # what the patch adds to send it to the pool's nodes
    node: str = ""  # the one node a Pod that bypasses placement lands on ("" for a Pod gpupool places)

    def as_json(self) -> dict[str, str]:
        """The pool, for `gpupool explain -o json`; `constraints` in kubectl's words."""
        return {
            "vendor": self.pool.vendor,
            "class": self.pool.gpu_class,
            "product": self.pool.product,
            "resource": self.resource,
            "device": self.device,
            "constraints": self.constraint.text(),
        }


class GroupNote(NamedTuple):
    """The Pod's workload group, and where its other Pods were when it was decided."""

    name: str
    pool: PoolKey | None  # the pool most of its Pods and reservations are on; None for its first Pod
    pods: int  # its Pods and reservations on that pool

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "pool": str(self.pool) if self.pool else None, "pods": self.pods}


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one Pod: allowed or not, why, and the patch against the original Pod (`changes`,
    piece by piece; `patch`, its RFC 6902 ops)."""

    allowed: bool
    outcome: Outcome
    code: int = 200
    message: str = ""
    warnings: tuple[str, ...] = ()
    placement: Placement | None = None
    changes: PodPatch = NO_PATCH
    reasons: tuple[str, ...] = field(default=(), compare=False)  # each pool considered, and why
    reason: Reason = ""  # on denials (and on an audited Pod that would be denied): which rule denied
    group: GroupNote | None = None  # the Pod's workload group, when it has one
    queued: str = ""  # the device resource a Pod queued at admission waits for ("" when not queued)
    # Under `enforcement: audit`, what gpupool would have answered: "would deny: <message>", "would place
    # on <pool>", "would queue for <n> x <resource>" (webhook.admission.audit); "" otherwise.
    audit: str = ""

    @property
    def patch(self) -> tuple[Op, ...]:
        """The RFC 6902 patch sent to kube-apiserver."""
        return self.changes.ops

    def with_warnings(self, warnings: tuple[str, ...]) -> Verdict:
        return replace(self, warnings=(*self.warnings, *warnings))

    def as_json(self) -> dict[str, Any]:
        """The `gpupool explain -o json` object."""
        return {
            "allowed": self.allowed,
            "code": self.code,
            "message": self.message,
            "warnings": list(self.warnings),
            "pool": self.placement.as_json() if self.placement else None,
            "patch": list(self.patch),
            "group": self.group.as_json() if self.group else None,
            "queued": self.queued or None,
        }


def allow(message: str = "", reasons: tuple[str, ...] = ()) -> Verdict:
    """Allowed with no patch: the Pod is not gpupool's business, or already placed."""
    return Verdict(allowed=True, outcome="unchanged", message=message, reasons=reasons)


def deny(
    message: str,
    code: int = CODE_FORBIDDEN,
    reasons: tuple[str, ...] = (),
    reason: Reason = "",
    group: GroupNote | None = None,
) -> Verdict:
    return Verdict(
        allowed=False, outcome="denied", code=code, message=message, reasons=reasons, reason=reason, group=group
    )


def queue(resource: str, patch: PodPatch, message: str, warnings: tuple[str, ...], reasons: tuple[str, ...]) -> Verdict:
    """Allowed and queued: gated until the queue releases it; no pool yet, so nothing to reserve."""
    return Verdict(
        allowed=True,
        outcome="mutated" if patch.ops else "unchanged",
        message=message,
        warnings=warnings,
        changes=patch,
        reasons=reasons,
        queued=resource,
    )


def place(
    placement: Placement,
    patch: PodPatch,
    warnings: tuple[str, ...] = (),
    reasons: tuple[str, ...] = (),
    message: str = "",
    *,
    group: GroupNote | None = None,
) -> Verdict:
    """Allowed and placed; `outcome` is "unchanged" when the Pod already carried the placement (or named
    its node: then `message` says so)."""
    return Verdict(
        allowed=True,
        outcome="mutated" if patch.ops else "unchanged",
        message=message or f"placed on {placement.pool}",
        warnings=warnings,
        placement=placement,
        changes=patch,
        reasons=reasons,
        group=group,
    )
