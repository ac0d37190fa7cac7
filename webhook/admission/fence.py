"""The release's fencing token: a release commits only while the leader that decided it still leads.

Leader election on a Lease keeps two leaders from *deciding* at once, not their writes from *landing* at
once: a release held in the network past its leader's term (a partition, a stalled connection) would
commit after the next leader has released other Pods into the same quota or room. So the queue's leader
writes, in the very PATCH that removes gpupool's gate, the annotation `gpupool.io/released-by:
<holder>/<term>`: its identity and the Lease's `leaseTransitions` when it took the Lease (which every
change of holder increments, so a term is never reused). kube-apiserver calls the validating webhook
inside the write, between reading the stored Pod and committing it; the webhook reads the Lease from the
API then (not from a cache) and refuses the release unless the Lease still names that holder and term
and has not expired (`renewTime + leaseDurationSeconds` is after now). A new leader takes the Lease only
once it has not changed for its whole duration, so by the time it can release anything, every release
of the old term is refused.

Only gpupool's service account and the users and groups the admin trusts may remove the gate with a
leader's token or none (webhook.admission.validation), so a tenant can neither forge a token nor release
without one. A release that carries no token is a raw release (an admin acting as gpupool in an
emergency, or another trusted controller): it is not fenced, as no leader decided it.

**A release by hand** (`kubectl gpupool release`) carries `manual/<user>` (`manual-ignore-quota/<user>`
with `--ignore-quota`) instead: the user who released it, as kube-apiserver authenticated them. Any user
whom Kubernetes' RBAC lets patch the Pod may make one, but only under their own name: the validating call
accepts it only when `request.userInfo.username` is `<user>` (`judge_manual`), so the annotation and the
Event always name who did it. (A leader's identity is a Pod name and its term a number, so `manual/...`
is never one of its tokens but of a Pod named `manual`, which gpupool's Deployment never names one.)

Pure: the Lease is read by the caller (webhook.serving wires the API), the time is given.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple, Protocol

from webhook.domain.model import PREFIX

RELEASED_BY = f"{PREFIX}released-by"  # the annotation a release carries: <holder>/<term>
MANUAL = "manual"  # a release by hand: manual/<user>
MANUAL_IGNORING_QUOTA = "manual-ignore-quota"  # a release by hand past gpupool's quotas
MAX_TOKEN_CHARS = 320  # a holder (a Pod name, 253, and a pid) and a term


class LeaseTerm(NamedTuple):
    """What the fence reads of the queue's Lease."""

    holder: str  # "" when nobody holds it
    term: int  # spec.leaseTransitions
    renew_time: datetime | None
    duration_seconds: int


class Fence(Protocol):
    """The validating call's check of a release's token against the Lease as the API has it now."""

    def check(self, token: str) -> str | None:
        """None when a release carrying `token` may commit; else why not, in a few words."""
        ...


def token(holder: str, term: int) -> str:
    """The annotation's value for a leader `holder` in its `term`."""
    return f"{holder}/{term}"


def parse_token(text: str) -> tuple[str, int] | None:
    """(holder, term) of a token; None when it is not one."""
    if len(text) > MAX_TOKEN_CHARS:
        return None
    holder, sep, term = text.rpartition("/")
    if not sep or not holder or not term.isascii() or not term.isdigit():
        return None
    return holder, int(term)


def judge(text: str, lease: LeaseTerm | None, now: datetime) -> str | None:
    """None when the Lease, as read at `now`, is still held by the token's leader in its term; else why
    the release it fences must not commit."""
    parsed = parse_token(text)
    if parsed is None:
        return f"{RELEASED_BY} is not <holder>/<term>"
    holder, term = parsed
    if lease is None:
        return "the queue's Lease does not exist"
    if not lease.holder:
        return f"the queue's Lease is held by nobody now, not {_cut(holder)} (term {term})"
    if (lease.holder, lease.term) != (holder, term):
        return (
            f"the queue's Lease is held by {_cut(lease.holder)} in term {lease.term} now, "
            f"not by {_cut(holder)} in term {term}"
        )
    if lease.renew_time is None or lease.renew_time + timedelta(seconds=lease.duration_seconds) <= now:
        return f"the queue's Lease expired: {_cut(holder)} (term {term}) has not renewed it within its duration"
    return None


class Manual(NamedTuple):
    """A release by hand, as its annotation says: who made it, and whether it passed gpupool's quotas by."""

    user: str
    ignore_quota: bool


def manual_token(user: str, *, ignore_quota: bool) -> str:
    """The annotation's value for a release by hand by `user`."""
    return f"{MANUAL_IGNORING_QUOTA if ignore_quota else MANUAL}/{user}"


def parse_manual(text: str) -> Manual | None:
    """The release by hand a token names; None when it is not one (a leader's token, or anything else)."""
    if len(text) > MAX_TOKEN_CHARS:
        return None
    kind, sep, user = text.partition("/")
    if not sep or kind not in (MANUAL, MANUAL_IGNORING_QUOTA):
        return None
    return Manual(user, kind == MANUAL_IGNORING_QUOTA)


def judge_manual(manual: Manual, username: str) -> str | None:
    """None when the release by hand `manual` is made by the user it names; else why it must not commit."""
    if manual.user and manual.user == username:
        return None
    return (
        f"a release by hand carries the name of the user who makes it ({RELEASED_BY}: "
        f"{manual_token(username or '<user>', ignore_quota=manual.ignore_quota)}), "
        f"but it names {_cut(manual.user) or 'nobody'} and is made by {_cut(username) or 'an anonymous request'}"
    )


def _cut(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
