"""kube-scheduler's filters as the simulator applies them (webhook/testing/kubefit.py): `why_unfit` on raw
Kubernetes JSON, rule by rule, with kube-scheduler's reasons; how a Pod's request is counted; quantities.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.testing.kubefit import pod_requests, quantity, why_unfit

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"


def node(name: str = "gpu-1", *, labels: Obj | None = None, ready: str | None = "True", **extra: Any) -> Obj:
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "4", **extra.pop("allocatable", {})}
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "Tesla-T4", **(labels or {})}},
        "spec": extra,
        "status": {"allocatable": allocatable, "conditions": conditions},
    }


def pod(
    gpus: int = 1, *, cpu: str | None = None, node_name: str | None = None, phase: str = "Pending", **spec: Any
) -> Obj:
    limits: Obj = {GPU: str(gpus)} if gpus else {}
    requests: Obj = {"cpu": cpu} if cpu else {}
    body: Obj = {
        "containers": [{"name": "main", "image": "x", "resources": {"limits": limits, "requests": requests}}],
        **spec,
    }
    if node_name:
        body["nodeName"] = node_name
    return {"kind": "Pod", "metadata": {"name": "p", "namespace": "a"}, "spec": body, "status": {"phase": phase}}


def required(*terms: list[Obj], fields: list[Obj] | None = None) -> Obj:
    term_list: list[Obj] = [{"matchExpressions": t} for t in terms]
    if fields is not None:
        term_list.append({"matchFields": fields})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": term_list}}}


class TestResources:
    def test_a_pod_fits_within_allocatable_minus_what_bound_pods_request(self) -> None:
        bound = [pod(2, node_name="gpu-1", phase="Running"), pod(1, node_name="gpu-1", phase="Pending")]
        assert why_unfit(pod(1), node(), bound) is None
        assert why_unfit(pod(2), node(), bound) == "Insufficient nvidia.com/gpu"

    def test_terminated_pods_and_pods_elsewhere_hold_nothing(self) -> None:
        bound = [
            pod(4, node_name="gpu-1", phase="Succeeded"),
            pod(4, node_name="gpu-1", phase="Failed"),
            pod(4, node_name="gpu-2", phase="Running"),
        ]
        assert why_unfit(pod(4), node(), bound) is None

    def test_cpu_memory_and_mig_resources_are_checked_alike(self) -> None:
        mig = "nvidia.com/mig-1g.5gb"
        big_cpu = pod(0, cpu="8500m")
        mig_pod = pod(0)
        mig_pod["spec"]["containers"][0]["resources"]["limits"] = {mig: "2"}
        assert why_unfit(big_cpu, node()) == "Insufficient cpu"
        assert why_unfit(mig_pod, node()) == f"Insufficient {mig}"
        assert why_unfit(mig_pod, node(allocatable={mig: "7"})) is None

    def test_a_full_node_takes_no_more_pods(self) -> None:
        assert (
            why_unfit(pod(0), node(allocatable={"pods": "1"}), [pod(0, node_name="gpu-1", phase="Running")])
            == "Too many pods"
        )

    def test_the_request_counts_init_containers_sidecars_and_overhead(self) -> None:
        spec = {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1"}}},
                {"name": "b", "resources": {"limits": {"cpu": "500m"}}},
            ],
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
                {"name": "setup", "resources": {"requests": {"cpu": "3", GPU: "1"}}},
            ],
            "overhead": {"cpu": "100m"},
        }
        # containers 1.5 + sidecar 0.25 = 1.75; the init step needs 3 + 0.25 = 3.25: the larger, plus overhead.
        assert pod_requests(spec) == {"cpu": 3350, GPU: 1, "pods": 1}

    def test_pod_level_requests_replace_the_containers_sum(self) -> None:
        spec = {
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
            "resources": {"requests": {"cpu": "2"}},
        }
        assert pod_requests(spec) == {"cpu": 2000, "memory": 2**30, "pods": 1}


class TestTaints:
    @pytest.mark.parametrize(
        ("toleration", "fits"),
        [
            pytest.param({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True, id="exists"),
            pytest.param({"key": "nvidia.com/gpu", "value": "present"}, True, id="equal-any-effect"),
            pytest.param({"key": "nvidia.com/gpu", "value": "absent", "effect": "NoSchedule"}, False, id="other-value"),
            pytest.param({"operator": "Exists"}, True, id="everything"),
            pytest.param(
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False, id="other-effect"
            ),
        ],
    )
    def test_no_schedule_taints_must_be_tolerated(self, toleration: Obj, fits: bool) -> None:
        tainted = node(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
        expected = None if fits else "node(s) had untolerated taint {nvidia.com/gpu: present}"
        assert why_unfit(pod(1, tolerations=[toleration]), tainted) == expected

    def test_prefer_no_schedule_taints_do_not_filter(self) -> None:
        assert why_unfit(pod(1), node(taints=[{"key": "spot", "effect": "PreferNoSchedule"}])) is None

    @pytest.mark.parametrize(
        ("ready", "taint"),
        [
            ("False", "node.kubernetes.io/not-ready"),
            ("Unknown", "node.kubernetes.io/unreachable"),
            (None, "node.kubernetes.io/unreachable"),
        ],
    )
    def test_a_node_that_is_not_ready_carries_the_lifecycle_taint(self, ready: str | None, taint: str) -> None:
        """The default NoExecute tolerations do not tolerate the NoSchedule taint: nothing new goes there."""
        defaults = [{"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
        assert (
            why_unfit(pod(1, tolerations=defaults), node(ready=ready)) == f"node(s) had untolerated taint {{{taint}: }}"
        )
        assert why_unfit(pod(1, tolerations=[{"key": taint, "operator": "Exists"}]), node(ready=ready)) is None

    def test_a_cordoned_node_takes_only_pods_tolerating_unschedulable(self) -> None:
        cordoned = node(unschedulable=True)
        tolerating = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
        assert why_unfit(pod(1), cordoned) == "node(s) were unschedulable"
        assert why_unfit(pod(1, tolerations=tolerating), cordoned) is None


class TestNodeAffinity:
    MISMATCH = "node(s) didn't match Pod's node affinity/selector"

    def test_every_node_selector_label_must_match(self) -> None:
        assert why_unfit(pod(1, nodeSelector={"nvidia.com/gpu.product": "Tesla-T4"}), node()) is None
        assert why_unfit(pod(1, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"}), node()) == self.MISMATCH

    @pytest.mark.parametrize(
        ("expression", "fits"),
        [
            pytest.param(
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4", "L4"]}, True, id="in"
            ),
            pytest.param(
                {"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["Tesla-T4"]}, False, id="not-in"
            ),
            pytest.param({"key": "zone", "operator": "NotIn", "values": ["b"]}, True, id="not-in-missing-label"),
            pytest.param({"key": "zone", "operator": "Exists"}, False, id="exists"),
            pytest.param({"key": "zone", "operator": "DoesNotExist"}, True, id="does-not-exist"),
            pytest.param({"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["15000"]}, True, id="gt"),
            pytest.param({"key": "nvidia.com/gpu.memory", "operator": "Lt", "values": ["15000"]}, False, id="lt"),
            pytest.param(
                {"key": "nvidia.com/gpu.product", "operator": "Gt", "values": ["1"]}, False, id="gt-not-a-number"
            ),
        ],
    )
    def test_operators(self, expression: Obj, fits: bool) -> None:
        labelled = node(labels={"nvidia.com/gpu.memory": "15360"})
        assert why_unfit(pod(1, affinity=required([expression])), labelled) == (None if fits else self.MISMATCH)

    def test_terms_are_ored_and_their_expressions_anded(self) -> None:
        t4 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}
        zone = {"key": "zone", "operator": "In", "values": ["a"]}
        l4 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}
        assert why_unfit(pod(1, affinity=required([t4, zone])), node()) == self.MISMATCH
        assert why_unfit(pod(1, affinity=required([t4, zone], [t4])), node()) is None
        assert why_unfit(pod(1, affinity=required([l4], [zone])), node()) == self.MISMATCH

    def test_match_fields_name_the_node_and_an_empty_term_matches_nothing(self) -> None:
        by_name = required(fields=[{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}])
        assert why_unfit(pod(1, affinity=by_name), node("gpu-1")) is None
        assert why_unfit(pod(1, affinity=by_name), node("gpu-2")) == self.MISMATCH
        assert why_unfit(pod(1, affinity=required([])), node()) == self.MISMATCH

    def test_selector_and_affinity_both_apply(self) -> None:
        l4 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}
        assert (
            why_unfit(pod(1, nodeSelector={"nvidia.com/gpu.product": "Tesla-T4"}, affinity=required([l4])), node())
            == self.MISMATCH
        )


@pytest.mark.parametrize(
    ("text", "resource", "value"),
    [
        ("500m", "cpu", 500),
        ("1.5", "cpu", 1500),
        ("2", GPU, 2),
        ("1Gi", "memory", 2**30),
        ("127000000Ki", "memory", 127_000_000 * 1024),
        ("1e3", "memory", 1000),
        ("1.5k", "memory", 1500),
        ("0.5", "memory", 1),
        ("1x", GPU, 0),
        (3, GPU, 3),
    ],
)
def test_quantities_count_in_the_schedulers_units(text: Any, resource: str, value: int) -> None:
    """cpu in millicores (MilliValue), everything else in whole units rounded up (Value)."""
    assert quantity(text, resource) == value


@given(gpus=st.integers(0, 6), bound=st.lists(st.integers(0, 4), max_size=4))
def test_more_bound_pods_never_make_a_pod_fit(gpus: int, bound: list[int]) -> None:
    """Room only shrinks as Pods are bound: a Pod that does not fit beside some Pods does not fit beside
    more of them, and one that fits beside more fits beside fewer."""
    pods = [pod(n, node_name="gpu-1", phase="Running") for n in bound]
    for cut in range(len(pods)):
        if why_unfit(pod(gpus), node(), pods[:cut]) is not None:
            assert why_unfit(pod(gpus), node(), pods) is not None
    # A Pod asking for no GPU is never refused for GPUs, even beside an overcommitted node's Pods.
    assert (why_unfit(pod(gpus), node(), pods) is None) == (gpus == 0 or gpus + sum(bound) <= 4)
