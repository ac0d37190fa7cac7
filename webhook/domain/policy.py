"""The policy file: classes, products, vendors, namespace rules and defaults.

Loaded and validated at start (and again when `gpupool serve` sees its file change). A user file is
merged over the built-in default (`default_policy.yaml`, the same file the manifests ship as a
ConfigMap): top-level keys replace the default's, `defaults` merges key by key and `vendors` vendor by
vendor, so an admin's ConfigMap only needs the parts it changes. Every error names the field, the bad
value and what is accepted.

This module is the one the rest of gpupool imports: the values are in webhook.domain.policy_model, the
reading of the file in webhook.domain.policy_build.
"""

from webhook.domain.policy_build import default_policy_text, load_policy, load_policy_text
from webhook.domain.policy_model import (
    ENFORCEMENTS,
    PLACEMENTS,
    Defaults,
    Enforcement,
    MigReshaping,
    NamespaceRule,
    OnNoCapacity,
    OnStale,
    PlacementMode,
    Policy,
    PolicyError,
    ProductRule,
    TaintRule,
    VendorPolicy,
)

__all__ = [
    "ENFORCEMENTS",
    "PLACEMENTS",
    "Defaults",
    "Enforcement",
    "MigReshaping",
    "NamespaceRule",
    "OnNoCapacity",
    "OnStale",
    "PlacementMode",
    "Policy",
    "PolicyError",
    "ProductRule",
    "TaintRule",
    "VendorPolicy",
    "default_policy_text",
    "load_policy",
    "load_policy_text",
]
