"""kube-apiserver's validation of the writes the simulator serves: the rules a client can trip over.

From pkg/apis/core/validation (ValidatePodCreate, ValidatePodUpdate and the parts of ValidatePodSpec
that concern placement) and apimachinery's ValidateObjectMeta(Update); Leases' and Events' rules, and
which rules each kind runs, are in webhook.testing.kubekinds. Each function returns the field errors
kube-apiserver would, in its order, with its field paths and details; an empty list means the write is
valid. Objects are JSON as decoded and checked by webhook.testing.kubedecode, so every field read here
has the type the Go struct gives it.

For a Pod update (KEP-3521 scheduling gates and KEP-3838 mutable scheduling directives, GA in 1.30):
containers may not be added or removed; images may change; activeDeadlineSeconds may be set or lowered;
tolerations may only be added to (an existing one may change only its tolerationSeconds); scheduling
gates may only be removed; and only while the OLD Pod still has a gate may its nodeSelector get new keys
and its required node affinity be set or get expressions appended to each term. Everything else in the
spec is immutable: "pod updates may not change fields other than …".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.testing.kubefield import (
    FieldError,
    dns1123_subdomain_problems,
    duplicate,
    forbidden,
    invalid,
    label_value_problems,
    not_supported,
    objects_in,
    qualified_name_problems,
    required,
    validate_annotations,
    validate_labels,
)
from webhook.testing.kubepods import semantic

Obj = dict[str, Any]
MAX_INT32 = 2**31 - 1
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
UPDATABLE_POD_SPEC_FIELDS = ",".join(
    (
        "`spec.containers[*].image`",
        "`spec.initContainers[*].image`",
        "`spec.activeDeadlineSeconds`",
        "`spec.tolerations` (only additions to existing tolerations)",
        "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
    )
)
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def as_dict(value: Any) -> Obj:
    """A JSON object's member read as an object (absent or null: empty)."""
    return value if isinstance(value, dict) else {}


# -- metadata ------------------------------------------------------------------------------------


def validate_meta(meta: Obj, *, namespaced: bool) -> list[FieldError]:
    """ValidateObjectMeta with the DNS-subdomain name rule every served kind uses."""
    errors: list[FieldError] = []
    name = meta.get("name") or ""
    errors += [invalid("metadata.name", name, msg) for msg in dns1123_subdomain_problems(name)]
    if namespaced:
        namespace = meta.get("namespace") or ""
        errors += [invalid("metadata.namespace", namespace, msg) for msg in _namespace_problems(namespace)]
    errors += validate_labels(meta.get("labels"), "metadata.labels")
    errors += validate_annotations(meta.get("annotations"), "metadata.annotations")
    return errors


def _namespace_problems(namespace: str) -> list[str]:
    # ValidateNamespaceName: a DNS-1123 label (at most 63 characters, no dots).
    problems = dns1123_subdomain_problems(namespace)
    if not problems and ("." in namespace or len(namespace) > 63):
        problems = ["a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"]
    return problems


def validate_meta_update(new: Obj, old: Obj) -> list[FieldError]:
    """ValidateObjectMetaUpdate: identity fields are immutable, labels and annotations valid."""
    errors: list[FieldError] = []
    for field in ("name", "namespace", "uid", "deletionTimestamp", "deletionGracePeriodSeconds"):
        if new.get(field) != old.get(field):
            errors.append(invalid(f"metadata.{field}", new.get(field), "field is immutable"))
    if old.get("deletionTimestamp"):
        added = [f for f in new.get("finalizers") or () if f not in (old.get("finalizers") or ())]
        if added:
            found = "[]string{" + ", ".join(f'"{f}"' for f in added) + "}"
            detail = f"no new finalizers can be added if the object is being deleted, found new finalizers {found}"
            errors.append(forbidden("metadata.finalizers", detail))
    errors += validate_labels(new.get("labels"), "metadata.labels")
    errors += validate_annotations(new.get("annotations"), "metadata.annotations")
    return errors


# -- Pods ----------------------------------------------------------------------------------------


def validate_pod_create(pod: Obj) -> list[FieldError]:
    """ValidatePodCreate: the Pod's metadata and spec, no ephemeral containers, no node for a gated Pod."""
    spec = as_dict(pod.get("spec"))
    errors = validate_meta(as_dict(pod.get("metadata")), namespaced=True) + _pod_spec(spec)
    if spec.get("ephemeralContainers"):
        errors.append(forbidden("spec.ephemeralContainers", "cannot be set on create"))
    if spec.get("nodeName") and spec.get("schedulingGates"):
        errors.append(forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared"))
    return errors


def validate_pod_update(new: Obj, old: Obj) -> list[FieldError]:
    """ValidatePodUpdate, rule for rule (see the module's docstring)."""
    new_meta, old_meta = as_dict(new.get("metadata")), as_dict(old.get("metadata"))
    spec, old_spec = as_dict(new.get("spec")), as_dict(old.get("spec"))
    # As kube-apiserver does, the new metadata is validated both as an update and as metadata.
    errors = validate_meta_update(new_meta, old_meta) + validate_meta(new_meta, namespaced=True) + _pod_spec(spec)
    errors += _mirror_annotation(as_dict(new_meta.get("annotations")), as_dict(old_meta.get("annotations")))
    for field in ("containers", "initContainers"):
        problems, stop = _container_updates(spec.get(field), old_spec.get(field), f"spec.{field}")
        errors += problems
        if stop:
            return errors
    deadline_problems, stop = _active_deadline_update(
        spec.get("activeDeadlineSeconds"), old_spec.get("activeDeadlineSeconds")
    )
    errors += deadline_problems
    if stop:
        return errors
    errors += _only_added_tolerations(spec.get("tolerations"), old_spec.get("tolerations"))
    errors += _only_deleted_gates(spec.get("schedulingGates"), old_spec.get("schedulingGates"))
    if semantic(spec) == semantic(old_spec):
        return errors
    munged = _munge(spec, old_spec)
    if old_spec.get("schedulingGates"):
        errors += _gated_mutations(munged, old_spec)
    if semantic(munged) != semantic(old_spec):
        diff = "\n".join(_diff(semantic(old_spec), semantic(munged), "spec"))
        errors.append(
            forbidden("spec", f"pod updates may not change fields other than {UPDATABLE_POD_SPEC_FIELDS}\n{diff}")
        )
    return errors


def _pod_spec(spec: Obj) -> list[FieldError]:
    """The placement part of ValidatePodSpec: nodeSelector, affinity, tolerations, gates, deadline."""
    errors = validate_labels(spec.get("nodeSelector"), "spec.nodeSelector")
    errors += _node_affinity(as_dict(as_dict(spec.get("affinity")).get("nodeAffinity")), "spec.affinity.nodeAffinity")
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and not 1 <= deadline <= MAX_INT32:
        errors.append(invalid("spec.activeDeadlineSeconds", deadline, f"must be between 1 and {MAX_INT32}, inclusive"))
    errors += validate_tolerations(spec.get("tolerations"), "spec.tolerations")
    seen: set[str] = set()
    for i, gate in objects_in(spec.get("schedulingGates")):
        name = gate.get("name") or ""
        errors += [invalid(f"spec.schedulingGates[{i}]", name, msg) for msg in qualified_name_problems(name)]
        if name in seen:
            errors.append(duplicate(f"spec.schedulingGates[{i}]", name))
        seen.add(name)
    return errors


def validate_tolerations(tolerations: Any, path: str) -> list[FieldError]:
    """ValidateTolerations."""
    errors: list[FieldError] = []
    for i, t in objects_in(tolerations):
        at = f"{path}[{i}]"
        key, operator, value, effect = (t.get(f) or "" for f in ("key", "operator", "value", "effect"))
        if key:
            errors += [invalid(f"{at}.key", key, msg) for msg in qualified_name_problems(key)]
        if not key and operator != "Exists":
            errors.append(
                invalid(
                    f"{at}.operator",
                    operator,
                    'operator must be Exists when `key` is empty, which means "match all values and all keys"',
                )
            )
        if t.get("tolerationSeconds") is not None and effect != "NoExecute":
            errors.append(invalid(f"{at}.effect", effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
        if operator in ("Equal", ""):
            problems = label_value_problems(value)
            if problems:
                errors.append(invalid(f"{at}.operator", value, ";".join(problems)))
        elif operator == "Exists":
            if value:
                errors.append(invalid(f"{at}.operator", value, "value must be empty when `operator` is 'Exists'"))
        else:
            errors.append(not_supported(f"{at}.operator", operator, ("Equal", "Exists")))
        if effect and effect not in _EFFECTS:
            errors.append(not_supported(f"{at}.effect", effect, _EFFECTS))
    return errors


def _node_affinity(affinity: Obj, path: str) -> list[FieldError]:
    """validateNodeAffinity: required terms (at least one) and weighted preferred terms."""
    errors: list[FieldError] = []
    required_terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required_terms, dict):
        at = f"{path}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        terms = required_terms.get("nodeSelectorTerms") or []
        if not terms:
            errors.append(required(at, "must have at least one node selector term"))
        for i, term in objects_in(terms):
            errors += _node_selector_term(term, f"{at}[{i}]", allow_invalid_values=False)
    for i, preferred in objects_in(affinity.get("preferredDuringSchedulingIgnoredDuringExecution")):
        at = f"{path}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        weight = preferred.get("weight") or 0
        if not 1 <= weight <= 100:
            errors.append(invalid(f"{at}.weight", weight, "must be in the range 1-100"))
        errors += _node_selector_term(
            as_dict(preferred.get("preference")), f"{at}.preference", allow_invalid_values=True
        )
    return errors


def _node_selector_term(term: Mapping[str, Any], path: str, *, allow_invalid_values: bool) -> list[FieldError]:
    """ValidateNodeSelectorTerm: each requirement's operator, values, key; fields only metadata.name."""
    errors: list[FieldError] = []
    for j, req in objects_in(term.get("matchExpressions")):
        at = f"{path}.matchExpressions[{j}]"
        operator, values = req.get("operator") or "", req.get("values") or []
        if operator in ("In", "NotIn") and not values:
            errors.append(required(f"{at}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
        elif operator in ("Exists", "DoesNotExist") and values:
            errors.append(
                forbidden(f"{at}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
            )
        elif operator in ("Gt", "Lt") and len(values) != 1:
            errors.append(required(f"{at}.values", "must be specified single value when `operator` is 'Lt' or 'Gt'"))
        elif operator not in _OPERATORS:
            errors.append(invalid(f"{at}.operator", operator, "not a valid selector operator"))
        key = req.get("key") or ""
        errors += [invalid(f"{at}.key", key, msg) for msg in qualified_name_problems(key)]
        if not allow_invalid_values:
            for k, v in enumerate(values):
                errors += [invalid(f"{at}.values[{k}]", v, msg) for msg in label_value_problems(v)]
    for j, req in objects_in(term.get("matchFields")):
        at = f"{path}.matchFields[{j}]"
        operator, values = req.get("operator") or "", req.get("values") or []
        if operator in ("In", "NotIn"):
            if len(values) != 1:
                errors.append(
                    required(
                        f"{at}.values",
                        "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
                    )
                )
        else:
            errors.append(invalid(f"{at}.operator", operator, "not a valid selector operator"))
        if req.get("key") != "metadata.name":
            errors.append(invalid(f"{at}.key", req.get("key") or "", "not a valid field selector key"))
        else:
            for k, v in enumerate(values):
                errors += [invalid(f"{at}.values[{k}]", v, msg) for msg in dns1123_subdomain_problems(v)]
    return errors


def _mirror_annotation(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[FieldError]:
    """ValidatePodSpecificAnnotationUpdates: a mirror Pod's annotation cannot be added, changed or removed."""
    path = f"metadata.annotations[{MIRROR_ANNOTATION}]"
    if MIRROR_ANNOTATION in old and new.get(MIRROR_ANNOTATION) != old[MIRROR_ANNOTATION]:
        return [forbidden(path, "may not remove or update mirror pod annotation")]
    if MIRROR_ANNOTATION in new and MIRROR_ANNOTATION not in old:
        return [forbidden(path, "may not add mirror pod annotation")]
    return []


def _container_updates(new: Any, old: Any, path: str) -> tuple[list[FieldError], bool]:
    """ValidateContainerUpdates: the same number of containers (else stop here), images set."""
    new_list, old_list = list(objects_in(new)), list(objects_in(old))
    if len(new_list) != len(old_list):
        return [forbidden(path, "pod updates may not add or remove containers")], True
    errors: list[FieldError] = []
    for i, container in new_list:
        image = container.get("image") or ""
        if not image:
            errors.append(required(f"{path}[{i}].image"))
        if image.strip() != image:
            errors.append(invalid(f"{path}[{i}].image", image, "must not have leading or trailing whitespace"))
    return errors, False


def _active_deadline_update(new: Any, old: Any) -> tuple[list[FieldError], bool]:
    """activeDeadlineSeconds may go from unset to a value, or down; not back to unset."""
    path = "spec.activeDeadlineSeconds"
    if new is not None:
        if not 0 <= new <= MAX_INT32:
            return [invalid(path, new, f"must be between 0 and {MAX_INT32}, inclusive")], True
        if old is not None and old < new:
            return [invalid(path, new, "must be less than or equal to previous value")], True
    elif old is not None:
        return [invalid(path, None, "must not update from a positive integer to nil value")], False
    return [], False


def _toleration_key(t: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (t.get("key") or "", t.get("operator") or "", t.get("value") or "", t.get("effect") or "")


def _only_added_tolerations(new: Any, old: Any) -> list[FieldError]:
    """validateOnlyAddedTolerations: every old toleration is still there, tolerationSeconds aside (and the
    new list is validated once more, as kube-apiserver does)."""
    present = {_toleration_key(t) for _, t in objects_in(new)}
    if any(_toleration_key(t) not in present for _, t in objects_in(old)):
        return [forbidden("spec.tolerations", "existing toleration can not be modified except its tolerationSeconds")]
    return validate_tolerations(new, "spec.tolerations")


def _only_deleted_gates(new: Any, old: Any) -> list[FieldError]:
    """validateOnlyDeletedSchedulingGates: a gate the old Pod did not have is an addition."""
    old_names = {g.get("name") for _, g in objects_in(old)}
    added: dict[str, int] = {}
    for i, gate in objects_in(new):
        added[gate.get("name") or ""] = i
    return [
        forbidden(
            f"spec.schedulingGates[{i}].name", f"only deletion is allowed, but found new scheduling gate '{name}'"
        )
        for name, i in sorted(added.items(), key=lambda item: item[1])
        if name not in old_names
    ]


def _munge(spec: Obj, old: Obj) -> Obj:
    """The new spec with what may change taken from the old one: images (by index), the deadline, gates,
    tolerations, and a terminationGracePeriodSeconds of 1 that replaces a negative one."""
    munged = dict(spec)
    for field in ("containers", "initContainers"):
        old_items = [c for _, c in objects_in(old.get(field))]
        if isinstance(spec.get(field), list):
            munged[field] = [
                {**c, "image": old_items[i].get("image")} if isinstance(c, dict) and i < len(old_items) else c
                for i, c in enumerate(spec[field])
            ]
    for field in ("activeDeadlineSeconds", "schedulingGates", "tolerations"):
        if field in old:
            munged[field] = old[field]
        else:
            munged.pop(field, None)
    grace, old_grace = munged.get("terminationGracePeriodSeconds"), old.get("terminationGracePeriodSeconds")
    if old_grace is not None and old_grace < 0 and grace == 1:
        munged["terminationGracePeriodSeconds"] = old_grace
    return munged


def _gated_mutations(munged: Obj, old: Obj) -> list[FieldError]:
    """For a Pod whose old spec has gates: nodeSelector keys may be added, required node affinity set or
    extended; both are then taken from the old spec for the final comparison (in `munged`, in place)."""
    errors: list[FieldError] = []
    selector, old_selector = as_dict(munged.get("nodeSelector")), as_dict(old.get("nodeSelector"))
    if semantic(selector) != semantic(old_selector):
        if any(k not in selector or selector[k] != v for k, v in old_selector.items()):
            errors.append(
                invalid(
                    "spec.nodeSelector",
                    selector,
                    "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
                )
            )
        _take(munged, old, "nodeSelector")
    affinity, old_affinity = munged.get("affinity"), old.get("affinity")
    new_na, old_na = as_dict(affinity).get("nodeAffinity"), as_dict(old_affinity).get("nodeAffinity")
    if semantic(new_na) != semantic(old_na):
        errors += _node_affinity_mutation(as_dict(new_na), as_dict(old_na))
        new_affinity = dict(as_dict(affinity))
        if old_na is None:
            new_affinity.pop("nodeAffinity", None)
        else:
            new_affinity["nodeAffinity"] = old_na
        if affinity is not None and old_affinity is None and semantic(new_affinity) is None:
            munged.pop("affinity", None)
        elif affinity is None and old_na is not None:
            munged["affinity"] = {"nodeAffinity": old_na}
        elif affinity is not None:
            munged["affinity"] = new_affinity
    return errors


def _take(munged: Obj, old: Obj, field: str) -> None:
    if field in old:
        munged[field] = old[field]
    else:
        munged.pop(field, None)


def _node_affinity_mutation(new: Obj, old: Obj) -> list[FieldError]:
    """validateNodeAffinityMutation: with old required terms, the same number of terms, each keeping its
    expressions and fields as a prefix (a term with none must stay empty)."""
    old_required = old.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(old_required, dict):
        return []
    old_terms = [t for _, t in objects_in(old_required.get("nodeSelectorTerms"))]
    new_required = as_dict(new.get("requiredDuringSchedulingIgnoredDuringExecution"))
    new_terms = [t for _, t in objects_in(new_required.get("nodeSelectorTerms"))]
    path = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    if old_terms and len(old_terms) != len(new_terms):
        return [invalid(path, new_terms, "no additions/deletions to non-empty NodeSelectorTerms list are allowed")]
    return [
        invalid(f"{path}[{i}]", new_terms[i], "only additions are allowed (no mutations or deletions)")
        for i, old_term in enumerate(old_terms)
        if not _only_additions(new_terms[i], old_term)
    ]


def _only_additions(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    old_exprs, old_fields = old.get("matchExpressions") or [], old.get("matchFields") or []
    new_exprs, new_fields = new.get("matchExpressions") or [], new.get("matchFields") or []
    if not old_exprs and not old_fields and (new_exprs or new_fields):
        return False
    for old_list, new_list in ((old_exprs, new_exprs), (old_fields, new_fields)):
        if old_list and (len(new_list) < len(old_list) or semantic(new_list[: len(old_list)]) != semantic(old_list)):
            return False
    return True


def _diff(old: Any, new: Any, path: str) -> list[str]:
    """The changed leaves, `-` old and `+` new (a plain stand-in for the cmp.Diff Go prints)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            line
            for key in sorted(old.keys() | new.keys())
            for line in _diff(old.get(key), new.get(key), f"{path}.{key}")
        ]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [line for i, (o, n) in enumerate(zip(old, new, strict=True)) for line in _diff(o, n, f"{path}[{i}]")]
    if old == new:
        return []
    return [f"  - {path}: {_short(old)}", f"  + {path}: {_short(new)}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
