"""Tests for the ValidatingWebhookConfiguration an admin installs (manifests/base/validating-webhook.yaml,
its overlays and components, render.py): that it mirrors the mutating webhook where it must, and that its
matchConditions, evaluated with a real CEL implementation, send kube-apiserver's calls for every Pod the
core checks and keep every other update away (tests/manifests/ covers the rest of the install).
"""

from __future__ import annotations

import base64
import copy
import re
from typing import Any

import celpy
import orjson
import pytest
from celpy import celtypes
from celpy.adapter import json_to_cel
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.manifests.rendered import (
    ENV_NAMES,
    INSTALL_GUIDE,
    KUBECTL,
    MANIFESTS,
    RESOURCE_NAMES,
    Rendering,
    kustomize,
    parse_objects,
    run_render,
)
from tests.manifests.sending import MIRROR, should_be_sent
from tests.manifests.sending import pod as manifest_pod
from webhook.admission.core import Admitter
from webhook.admission.pod import read_pod
from webhook.admission.request import wants_gpus
from webhook.admission.validation import Caller, Trusted, Validator
from webhook.domain.model import QUEUE_GATE
from webhook.domain.policy import default_policy_text, load_policy_text
from webhook.pools.index import PoolIndex
from webhook.sources.snapshot import SnapshotInventory

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)
Obj = dict[str, Any]
POLICY = load_policy_text(default_policy_text())
VALIDATOR = Validator(Admitter(POLICY, SnapshotInventory(PoolIndex(POLICY), "none")), Trusted.of("gpupool-system", "x"))
ALICE = Caller("alice", ("system:authenticated",))


def configurations(r: Rendering) -> tuple[Obj, Obj]:
    """The one webhook of the mutating and of the validating configuration."""
    mutating, validating = r.one("MutatingWebhookConfiguration"), r.one("ValidatingWebhookConfiguration")
    assert len(mutating["webhooks"]) == len(validating["webhooks"]) == 1
    return mutating["webhooks"][0], validating["webhooks"][0]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendering]:
    """The base, and the overlays through render.py as `make manifests` runs it."""
    certs, out = tmp_path_factory.mktemp("certs"), tmp_path_factory.mktemp("out")
    result = {"base": parse_objects(kustomize(MANIFESTS / "base"), "base")}
    options = {
        "self-signed": ["--overlay", "self-signed"],
        "self-signed+ignore": ["--overlay", "self-signed", "--failure-policy", "Ignore"],
        "cert-manager": ["--overlay", "cert-manager"],
        "cert-manager+excluded": ["--overlay", "cert-manager", "--exclude-namespace", "nvidia-gpu-operator",
                                  "--no-ignore-label"],
    }  # fmt: skip
    for name, args in options.items():
        path = out / f"{name}.yaml"
        done = run_render(*args, "--certs-dir", certs, "--out", path)
        assert done.returncode == 0, done.stderr
        result[name] = parse_objects(path.read_text(), name)
    return result


@pytest.fixture(params=["base", "self-signed", "self-signed+ignore", "cert-manager", "cert-manager+excluded"])
def rendering(request: pytest.FixtureRequest, rendered: dict[str, Rendering]) -> Rendering:
    return rendered[request.param]


class TestConfiguration:
    def test_pod_create_and_update_are_sent_and_no_subresource(self, rendering: Rendering) -> None:
        """CREATE and UPDATE of core/v1 Pods themselves: no DELETE, no pods/status, pods/binding or
        pods/ephemeralcontainers (which cannot change what gpupool guards)."""
        _, validating = configurations(rendering)
        assert validating["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]

    def test_the_same_call_settings_and_failure_policy_as_the_mutating_webhook(self, rendering: Rendering) -> None:
        """v1 reviews, side effects only outside dry runs (a Pod naming its node is charged in a Lease,
        never on a dry run, so dry runs work), the mutating webhook's timeout and matchPolicy,
        no objectSelector, and the failure policy switched with it (failure-policy-ignore, make deploy
        FAILURE_POLICY=Ignore)."""
        mutating, validating = configurations(rendering)
        assert validating["admissionReviewVersions"] == ["v1"]
        assert validating["sideEffects"] == "NoneOnDryRun"
        for key in ("timeoutSeconds", "matchPolicy", "failurePolicy"):
            assert validating[key] == mutating[key], key
        assert validating["failurePolicy"] == ("Ignore" if rendering.name.endswith("+ignore") else "Fail")
        assert "objectSelector" not in validating
        assert validating["name"] != mutating["name"]
        assert re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+){2,}", validating["name"])

    def test_the_same_namespaces_are_left_out(self, rendering: Rendering) -> None:
        """The namespaceSelector is the mutating webhook's in every rendering, --exclude-namespace and
        --no-ignore-label included: a namespace gpupool does not place in, it does not check either."""
        mutating, validating = configurations(rendering)
        assert validating["namespaceSelector"] == mutating["namespaceSelector"]
        if rendering.name.endswith("+excluded"):
            (names,) = validating["namespaceSelector"]["matchExpressions"]
            assert "nvidia-gpu-operator" in names["values"]

    def test_calls_validate_on_the_mutating_webhooks_service_with_its_ca(self, rendering: Rendering) -> None:
        """/validate on the Service /mutate is called on; the same caBundle (self-signed) or the same
        cert-manager CA injection, so kube-apiserver trusts the one certificate for both."""
        mutating, validating = configurations(rendering)
        assert validating["clientConfig"]["service"] == {**mutating["clientConfig"]["service"], "path": "/validate"}
        assert validating["clientConfig"].get("caBundle") == mutating["clientConfig"].get("caBundle")
        if rendering.name.startswith("self-signed"):
            assert base64.b64decode(re.sub(r"\s", "", validating["clientConfig"]["caBundle"]), validate=True)
        annotation = "cert-manager.io/inject-ca-from"
        kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        injected = {rendering.one(k)["metadata"].get("annotations", {}).get(annotation) for k in kinds}
        assert len(injected) == 1
        assert (injected == {None}) is not rendering.name.startswith("cert-manager")

    def test_the_install_guide_shows_the_condition_names_kubectl_prints(self, rendered: dict[str, Rendering]) -> None:
        """Step 4 of the install checks the API server kept the validating webhook's matchConditions too."""
        _, validating = configurations(rendered["base"])
        names = " ".join(c["name"] for c in validating["matchConditions"])
        guide = INSTALL_GUIDE.read_text(encoding="utf-8")
        assert f'.matchConditions[*].name}}{{"\\n"}}\'\n# {names}\n' in guide


# --- matchConditions, evaluated with CEL ---------------------------------------------------------


class Conditions:
    """The validating webhook's matchConditions compiled with cel-python: whether kube-apiserver sends
    a request (every condition true), for a CREATE (oldObject null) or an UPDATE.

    cel-python interprets the parse tree on every evaluation (about 2.5 ms a condition, nine tenths of
    the property tests' time), and its results depend on the objects alone: each distinct pair of objects
    is evaluated once per module (hypothesis draws a fifth of them more than once, and a test that asks
    `sent` and then `results` of one Pod asks twice)."""

    def __init__(self, webhook: Obj) -> None:
        env = celpy.Environment()
        self.programs = {c["name"]: env.program(env.compile(c["expression"])) for c in webhook["matchConditions"]}
        self.evaluated: dict[bytes, dict[str, Any]] = {}

    def results(self, obj: Obj, old: Obj | None = None) -> dict[str, Any]:
        key = orjson.dumps([obj, old], option=orjson.OPT_SORT_KEYS)
        if key not in self.evaluated:
            self.evaluated[key] = self.evaluate(obj, old)
        return self.evaluated[key]

    def evaluate(self, obj: Obj, old: Obj | None) -> dict[str, Any]:
        request = {"operation": "CREATE" if old is None else "UPDATE", "namespace": "team-a", "dryRun": False,
                   "userInfo": {"username": "alice"}}  # fmt: skip
        activation = {"object": json_to_cel(obj), "oldObject": json_to_cel(old), "request": json_to_cel(request)}
        return {name: program.evaluate(activation) for name, program in self.programs.items()}

    def sent(self, obj: Obj, old: Obj | None = None) -> bool:
        results = self.results(obj, old)
        assert all(isinstance(r, celtypes.BoolType) for r in results.values()), results
        return all(bool(r) for r in results.values())


@pytest.fixture(scope="module")
def conditions(rendered: dict[str, Rendering]) -> Conditions:
    return Conditions(configurations(rendered["base"])[1])


GPU_POD = manifest_pod(annotations={"gpupool.io/pool": "nvidia/medium/Tesla-T4"}, limits={"nvidia.com/gpu": "1"})


class TestCreateConditions:
    @settings(max_examples=150, deadline=None)
    @given(
        parts=st.fixed_dictionaries(
            {
                "annotations": st.none()
                | st.dictionaries(
                    st.sampled_from(["gpupool.io/gpu-count", "app", "x.gpupool.io/y", MIRROR]), st.just("1")
                ),
                "limits": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "requests": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "env": st.none() | st.lists(st.sampled_from(ENV_NAMES), max_size=3),
                "init_limits": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "init_env": st.none() | st.lists(st.sampled_from(ENV_NAMES), max_size=3),
                "node_name": st.none() | st.sampled_from(["", "node-1"]),
                "owner_kind": st.none() | st.sampled_from(["ReplicaSet", "DaemonSet"]),
            }
        )
    )
    def test_every_pod_create_the_core_checks_is_sent(self, conditions: Conditions, parts: dict[str, Any]) -> None:
        """On CREATE the conditions send exactly the Pods the mutating webhook's send (`should_be_sent`),
        so every Pod gpupool placed is checked as stored, and every Pod the core would check with the
        default policy is sent."""
        obj = manifest_pod(**parts)
        assert conditions.sent(obj) is should_be_sent(obj)
        view = read_pod(obj, "team-a")
        if not view.mirror and wants_gpus(view.shape, POLICY):
            assert conditions.sent(obj)


# What an UPDATE may change, each as a function of the Pod: those gpupool guards (the core refuses them
# from a user), and those it does not (which must never be sent, so nothing else ever waits for gpupool).
GUARDED = {
    "pool-annotation": lambda p: p["metadata"].setdefault("annotations", {}).update({"gpupool.io/pool": "x/y/z"}),
    "group-annotation": lambda p: p["metadata"].setdefault("annotations", {}).update({"gpupool.io/group": "g"}),
    "annotation-removed": lambda p: (p["metadata"].get("annotations") or {}).pop("gpupool.io/pool", None),
    "node-selector": lambda p: p["spec"].setdefault("nodeSelector", {}).update({"zone": "a"}),
    "toleration": lambda p: p["spec"].setdefault("tolerations", []).append({"operator": "Exists"}),
    "node-affinity": lambda p: p["spec"].update(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "Exists"}]}]}}}),
    "gate-removed": lambda p: p["spec"].pop("schedulingGates", None),
    "node-name": lambda p: p["spec"].update(nodeName="node-7"),
    "gpu-limit": lambda p: p["spec"]["containers"][0].setdefault("resources", {}).setdefault("limits", {}).update(
        {"nvidia.com/gpu": "3"}),
}  # fmt: skip
UNGUARDED = {
    "label": lambda p: p["metadata"].setdefault("labels", {}).update({"app": "new"}),
    "other-annotation": lambda p: p["metadata"].setdefault("annotations", {}).update({"example.com/x": "1"}),
    "finalizer": lambda p: p["metadata"].update(finalizers=["example.com/keep"]),
    "deletion": lambda p: p["metadata"].update(deletionTimestamp="2026-12-01T00:00:00Z", deletionGracePeriodSeconds=30),
    "image": lambda p: p["spec"]["containers"][0].update(image="cuda:13"),
    "deadline": lambda p: p["spec"].update(activeDeadlineSeconds=60),
}  # fmt: skip


@st.composite
def stored_pods(draw: st.DrawFn) -> Obj:
    """A Pod as stored: GPU or not, annotated or not, gated by gpupool or not, placed or not."""
    obj = manifest_pod(
        annotations=draw(st.none() | st.sampled_from([{"gpupool.io/pool": "nvidia/medium/Tesla-T4"}, {"app": "x"}])),
        limits=draw(st.none() | st.dictionaries(st.sampled_from((*RESOURCE_NAMES[:3], "cpu")), st.just("1"))),
        env=draw(st.none() | st.lists(st.sampled_from(ENV_NAMES[:2]), max_size=1)),
    )
    obj["metadata"]["name"] = "job-x7k2p"
    if draw(st.booleans()):
        obj["spec"]["schedulingGates"] = [{"name": draw(st.sampled_from([QUEUE_GATE, "example.com/gate"]))}]
    if draw(st.booleans()):
        obj["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Tesla-T4"}
    if draw(st.booleans()):
        obj["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return obj


class TestUpdateConditions:
    @settings(max_examples=250, deadline=None)
    @given(
        old=stored_pods(),
        guarded=st.lists(st.sampled_from(sorted(GUARDED)), max_size=3, unique=True),
        unguarded=st.lists(st.sampled_from(sorted(UNGUARDED)), max_size=3, unique=True),
    )
    def test_every_update_the_core_refuses_is_sent(
        self, conditions: Conditions, old: Obj, guarded: list[str], unguarded: list[str]
    ) -> None:
        """For any stored Pod and any mix of changes: an update the core refuses from a user (it changes
        what gpupool guards on a GPU Pod) is sent to gpupool; one that changes only what it does not
        guard is never sent, however many such changes it makes."""
        new = copy.deepcopy(old)
        for name in (*guarded, *unguarded):
            (GUARDED | UNGUARDED)[name](new)
        refused = not VALIDATOR.validate_update(new, old, namespace="team-a", caller=ALICE).verdict.allowed
        event("refused" if refused else "allowed")
        if refused:
            assert conditions.sent(new, old), (guarded, unguarded)
        if not guarded and not is_mirror(new):
            assert not conditions.sent(new, old), unguarded

    @pytest.mark.parametrize("change", sorted(GUARDED))
    def test_each_guarded_change_of_a_placed_gpu_pod_is_sent(self, conditions: Conditions, change: str) -> None:
        old = copy.deepcopy(GPU_POD)
        old["spec"]["schedulingGates"] = [{"name": QUEUE_GATE}]
        new = copy.deepcopy(old)
        GUARDED[change](new)
        assert conditions.sent(new, old)

    def test_a_pod_that_stops_being_a_gpu_pod_is_sent(self, conditions: Conditions) -> None:
        """Its last gpupool.io/ annotation removed: the old object is what makes it gpupool's business."""
        old = manifest_pod(annotations={"gpupool.io/pool": "nvidia/medium/Tesla-T4"})
        new = manifest_pod(annotations={})
        assert conditions.sent(new, old)

    def test_updates_of_other_pods_are_never_sent(self, conditions: Conditions) -> None:
        """A Pod without GPUs, gpupool.io/ annotations or gpupool's gate: its tolerations and nodeSelector
        are nobody's business here; a mirror Pod is never sent either."""
        old = manifest_pod(limits={"cpu": "1"})
        new = copy.deepcopy(old)
        new["spec"]["tolerations"] = [{"operator": "Exists"}]
        new["spec"]["nodeSelector"] = {"zone": "a"}
        assert not conditions.sent(new, old)
        mirror = copy.deepcopy(GPU_POD)
        mirror["metadata"]["annotations"][MIRROR] = "hash"
        moved = copy.deepcopy(mirror)
        moved["spec"]["nodeName"] = "node-7"
        assert not conditions.sent(moved, mirror)

    @pytest.mark.parametrize(
        ("obj", "old"),
        [
            ({"metadata": {}, "spec": {"containers": [{"name": "a"}]}}, {"metadata": {}, "spec": {}}),
            ({"metadata": {"annotations": {}}, "spec": {}}, {"metadata": {}}),
            (
                {"metadata": {}},
                {"metadata": {"annotations": {"gpupool.io/pool": "x"}}, "spec": {"schedulingGates": []}},
            ),
            ({"metadata": {}, "spec": {"containers": [{"name": "a"}]}}, None),
        ],
        ids=["no-old-containers", "no-specs", "no-new-spec", "create"],
    )
    def test_conditions_never_fail_to_evaluate(self, conditions: Conditions, obj: Obj, old: Obj | None) -> None:
        """Odd but decodable objects give true or false, never an error (failurePolicy Fail would refuse)."""
        for name, result in conditions.results(obj, old).items():
            assert isinstance(result, celtypes.BoolType), name


def is_mirror(obj: Obj) -> bool:
    return MIRROR in (obj["metadata"].get("annotations") or {})


def test_kube_apiservers_admission_configuration_is_in_the_guide() -> None:
    """The client-certificate step names both webhook plugins (both call gpupool's Service)."""
    guide = INSTALL_GUIDE.read_text(encoding="utf-8")
    assert "ValidatingAdmissionWebhook" in guide and "MutatingAdmissionWebhook" in guide
