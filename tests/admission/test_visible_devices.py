"""The NVIDIA_VISIBLE_DEVICES rule (webhook.admission.request.visible_devices_problem), for the containers of
a Pod being created and for the ephemeral containers `kubectl debug` adds (core.evaluate_ephemeral).

A runtime that honours the variable for unprivileged containers gives a container the GPUs the variable
names, whatever it requests: `all` is every GPU of the node. Only void, none and empty are accepted, and
privileged containers, which see every device anyway.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import gpu_node, index_of, mig_mixed_node, pod, shared_node
from tests.builders import policy as make_policy
from webhook.admission.core import Admitter, evaluate, evaluate_ephemeral
from webhook.admission.verdict import Verdict
from webhook.sources.snapshot import SnapshotInventory

POLICY_TEXT = """
namespaces:
  students: {allowedClasses: [low, medium]}
  tools: {allowVisibleDevices: true}
"""
POLICY = make_policy(POLICY_TEXT)


def fleet() -> list[dict[str, Any]]:
    """A time-sliced T4 (medium, 4 replicas), a mixed-strategy A100 whose 1g.5gb instances the policy
    below makes medium, and whole T4s."""
    return [
        shared_node("ts-a"),
        mig_mixed_node("mixed-a", gpu_class=None, instances={"1g.5gb": (7, 4864)}),
        gpu_node("t4-a", "Tesla-T4", 4),
    ]


MIG_MEDIUM = "products: [{match: A100, class: high}, {match: A100-MIG-1g.5gb, class: medium}]\n"


def with_env(obj: dict[str, Any], value: str, *, container: int = 0, privileged: bool | None = None) -> dict[str, Any]:
    c = obj["spec"]["containers"][container]
    c["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    if privileged is not None:
        c["securityContext"] = {"privileged": privileged}
    return obj


def admit(obj: dict[str, Any], namespace: str = "students", text: str = POLICY_TEXT + MIG_MEDIUM) -> Verdict:
    pol = make_policy(text)
    return evaluate(obj, namespace, pol, index_of(fleet(), pol))


class TestContainersThatRequestGpus:
    @pytest.mark.parametrize(
        "obj",
        [
            pytest.param(pod("p", "students", gpus=1, resource="nvidia.com/mig-1g.5gb"), id="a-mig-slice"),
            pytest.param(pod("p", "students", annotations={"gpupool.io/device": "shared"}), id="a-shared-replica"),
            pytest.param(pod("p", "students", gpus=1), id="a-whole-gpu"),
        ],
    )
    def test_all_with_a_gpu_is_refused(self, obj: dict[str, Any]) -> None:
        """One MIG slice, one shared replica or one GPU, plus NVIDIA_VISIBLE_DEVICES=all: the container would
        see every GPU of the node where the runtime honours the variable. Refused, saying what it requests
        and what to do (without the variable the same Pod is placed)."""
        assert admit(obj).placement is not None
        result = admit(with_env(obj, "all"))
        assert (result.allowed, result.code, result.reason) == (False, 403, "visible-devices")
        assert "container 'main' sets NVIDIA_VISIBLE_DEVICES='all'" in result.message
        assert "leave it unset" in result.message

    @pytest.mark.parametrize("value", ["0", "GPU-8a2f3c1e-6b5d-4e0f-9a1b-2c3d4e5f6a7b", "0,1"])
    def test_a_device_list_with_a_gpu_is_refused(self, value: str) -> None:
        """Naming devices is no better than `all`: the device plugin chooses them, not the Pod."""
        result = admit(with_env(pod("p", "students", gpus=1), value))
        assert (result.allowed, result.reason) == (False, "visible-devices")

    @pytest.mark.parametrize("value", ["void", "none", "", "VOID"])
    def test_values_that_expose_nothing_are_placed(self, value: str) -> None:
        """void, none and empty hide every GPU: the Pod is placed as without the variable."""
        result = admit(with_env(pod("p", "students", gpus=1), value))
        assert result.allowed and result.placement is not None

    def test_a_sidecar_setting_it_beside_a_gpu_container_is_refused(self) -> None:
        """The rule holds for every container: a second container with no GPU that sets `all` is refused."""
        obj = pod("p", "students", gpus=1)
        obj["spec"]["containers"].append({"name": "side", "image": "x"})
        result = admit(with_env(obj, "all", container=1))
        assert not result.allowed and "container 'side'" in result.message
        assert "requests no GPU resource" in result.message

    def test_a_privileged_container_may_set_it(self) -> None:
        """A privileged container sees every device of the node with or without the variable: the rule
        does not apply (privileged: false is unprivileged)."""
        assert admit(with_env(pod("p", "students", gpus=1), "all", privileged=True)).allowed
        assert admit(with_env(pod("p", "students"), "all", privileged=True)).allowed
        refused = admit(with_env(pod("p", "students", gpus=1), "all", privileged=False))
        assert refused.reason == "visible-devices"

    def test_a_malformed_privileged_flag_is_refused_naming_it(self) -> None:
        obj = pod("p", "students", gpus=1)
        obj["spec"]["containers"][0]["securityContext"] = {"privileged": "yes"}
        result = admit(obj)
        assert (result.allowed, result.code) == (False, 400)
        assert "spec.containers[0].securityContext.privileged: expected true or false, got 'yes'" in result.message

    def test_the_namespace_opt_out_and_the_policy_switch_still_apply(self) -> None:
        """allowVisibleDevices and defaults.checkVisibleDevices: false turn the rule off, GPU or not."""
        obj = with_env(pod("p", "tools", gpus=1), "all")
        assert admit(obj, "tools").allowed
        off = POLICY_TEXT + MIG_MEDIUM + "defaults: {checkVisibleDevices: false}\n"
        assert admit(with_env(pod("p", "students", gpus=1), "all"), text=off).allowed


def running_pod(*ephemeral: dict[str, Any]) -> dict[str, Any]:
    """A running Pod as kube-apiserver sends it for pods/ephemeralcontainers: the whole Pod, with its
    ephemeral containers so far."""
    obj = pod("web-0", "students", node="t4-a")
    if ephemeral:
        obj["spec"]["ephemeralContainers"] = [dict(c) for c in ephemeral]
    return obj


def debug(name: str = "debugger", value: str | None = "all", privileged: bool | None = None) -> dict[str, Any]:
    """An ephemeral container as `kubectl debug` adds it."""
    c: dict[str, Any] = {"name": name, "image": "busybox", "stdin": True, "tty": True, "targetContainerName": "main"}
    if value is not None:
        c["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    if privileged is not None:
        c["securityContext"] = {"privileged": privileged}
    return c


class TestEphemeralContainers:
    def test_an_ephemeral_container_with_all_is_refused(self) -> None:
        """`kubectl debug` with NVIDIA_VISIBLE_DEVICES=all and no GPU (an ephemeral container cannot request
        any) is refused like any container, naming it."""
        result = evaluate_ephemeral(running_pod(debug()), running_pod(), "students", POLICY)
        assert (result.allowed, result.code, result.reason) == (False, 403, "visible-devices")
        assert "container 'debugger' sets NVIDIA_VISIBLE_DEVICES='all'" in result.message

    @pytest.mark.parametrize(
        "added",
        [
            pytest.param(debug(value=None), id="without-the-variable"),
            pytest.param(debug(value="void"), id="void"),
            pytest.param(debug(privileged=True), id="privileged"),
        ],
    )
    def test_other_ephemeral_containers_are_allowed_unchanged(self, added: dict[str, Any]) -> None:
        """Allowed with no patch: a patch on the subresource could only break `kubectl debug`."""
        result = evaluate_ephemeral(running_pod(added), running_pod(), "students", POLICY)
        assert (result.allowed, result.outcome, result.patch, result.placement) == (True, "unchanged", (), None)

    def test_only_the_containers_the_update_adds_are_held_to_the_rule(self) -> None:
        """An ephemeral container added before (they can be neither changed nor removed) does not block a
        new one; without the Pod before the update every one is new."""
        old = running_pod(debug("old"))
        assert evaluate_ephemeral(running_pod(debug("old"), debug("new", value=None)), old, "students", POLICY).allowed
        refused = evaluate_ephemeral(running_pod(debug("old"), debug("new")), old, "students", POLICY)
        assert not refused.allowed and "container 'new'" in refused.message
        assert not evaluate_ephemeral(running_pod(debug("old")), None, "students", POLICY).allowed

    def test_the_namespace_opt_out_applies(self) -> None:
        assert evaluate_ephemeral(running_pod(debug()), running_pod(), "tools", POLICY).allowed

    @pytest.mark.parametrize(
        ("obj", "words"),
        [
            pytest.param(None, "the object is not a Pod", id="no-object"),
            pytest.param({"spec": {"ephemeralContainers": [5]}}, "spec.ephemeralContainers[0]", id="not-a-container"),
            pytest.param({"spec": {"ephemeralContainers": {}}}, "spec.ephemeralContainers", id="not-a-list"),
        ],
    )
    def test_a_malformed_pod_is_refused_naming_the_field(self, obj: Any, words: str) -> None:
        result = evaluate_ephemeral(obj, None, "students", POLICY)
        assert (result.allowed, result.code) == (False, 400) and words in result.message

    def test_the_admitter_answers_without_the_inventory(self) -> None:
        """The Admitter's entry for the subresource needs no lock and reserves nothing."""
        index = index_of(fleet(), POLICY)
        admitter = Admitter(POLICY, SnapshotInventory(index, "test"))
        assert not admitter.admit_ephemeral(running_pod(debug()), namespace="students", old=running_pod()).allowed
        assert index.usage.reservations == 0
