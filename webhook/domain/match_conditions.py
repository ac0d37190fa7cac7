"""The GPU resources of the webhook configurations' matchConditions, as CEL, from the policy's own list.

Both webhook configurations (manifests/base/webhook.yaml, the mutating one, and validating-webhook.yaml)
select GPU Pods by the resources their containers ask for. Which resources those are is the policy's
`gpu_resources` (every vendor's whole-device and renamed shared resources, `nvidia.com/gpu.shared`
among them) and `partition_prefixes` (MIG profiles, virtual NPUs): the very lists admission reads a Pod's
GPU requests with. `gpu_resource_cel` writes them as one CEL predicate; tools/match_conditions.py puts it
into both files from the shipped default policy, and tests/manifests/test_match_resources.py fails when
a file is out of step with it, so no configuration can forget a resource the webhook counts.
"""

from __future__ import annotations

from webhook.domain.policy_model import Policy


def gpu_resource_cel(policy: Policy, var: str = "r") -> str:
    """A CEL predicate true exactly when the resource name `var` is one of the policy's GPU resources
    (by name) or starts with one of its partition prefixes, in a stable order."""
    names = [f"{var} == '{r}'" for r in sorted(policy.gpu_resources)]
    prefixes = [f"{var}.startsWith('{p}')" for p in sorted(set(policy.partition_prefixes))]
    return " || ".join(names + prefixes)
