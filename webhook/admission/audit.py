"""Audit mode (policy `enforcement: audit`): every Pod is allowed unchanged, and told what gpupool would
have answered.

The would-be answer is the enforcing answer itself, never a second decision: the Admitter and the
Validator decide the Pod exactly as under `enforce` (`prepare`, then `place`, whose pools come from the
one decision, webhook.admission.choice's `choose`), as a dry run that reserves nothing, and `audited`
turns that verdict into an allowed one with no patch, whose first warning says what it would have been:

- `gpupool (audit): would deny: <the denial's message>` (its code stays in `reason`, for the metrics);
- `gpupool (audit): would place on nvidia/medium/NVIDIA-L4`;
- `gpupool (audit): would queue for 1 x nvidia.com/gpu`;
- `gpupool (audit): would allow: <why>` for a Pod gpupool would have admitted unchanged but counted (one
  that names its node).

The enforcing answer's own warnings follow, each as `gpupool (audit): would warn: ...`. A Pod gpupool
leaves alone under `enforce` (no GPU Pod, a mirror Pod) gets the same answer under `audit`.
"""

from __future__ import annotations

from webhook.admission.verdict import Verdict

AUDIT_PREFIX = "gpupool (audit): "  # every audit warning starts so; webhook.serving.review keeps them whole
_OWN_PREFIX = "gpupool: "


def audited(result: Verdict) -> Verdict:
    """The answer under `enforcement: audit` for a Pod whose enforcing answer is `result`."""
    would = would_do(result)
    if not would:
        return result
    notes = tuple(f"{AUDIT_PREFIX}would warn: {w.removeprefix(_OWN_PREFIX)}" for w in result.warnings)
    return Verdict(
        allowed=True,
        outcome="audited",
        message=f"audit: {would}",
        warnings=(f"{AUDIT_PREFIX}{would}", *notes),
        reasons=result.reasons,
        reason=result.reason if not result.allowed else "",
        group=result.group,
        audit=would,
    )


def would_do(result: Verdict) -> str:
    """What an enforcing answer does to the Pod, in the audit warning's words; "" when it leaves the Pod
    alone (allowed, unchanged, nothing counted), which audit mode answers alike."""
    if not result.allowed:
        return f"would deny: {result.message}"
    if result.queued:
        return f"would queue for {result.message.removeprefix('queued for ')}"
    placement = result.placement
    if placement is not None and not placement.node:
        return f"would place on {placement.pool}"
    if placement is not None or result.patch:
        return f"would allow: {result.message}"
    return ""
