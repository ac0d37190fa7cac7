"""Annotations to a GpuRequest: defaults, the Pod's own limits, and a clear refusal for every bad value."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import pod, policy
from webhook.admission.pod import PodShape, read_pod
from webhook.admission.request import MAX_CHARS, MAX_PROBLEMS, RequestError, parse_request, wants_gpus
from webhook.domain.groups import GroupRule
from webhook.domain.model import PoolKey, Toleration

POLICY = policy()
TEAM = policy("namespaces: {team-a: {allowedClasses: [medium, high], defaultClass: medium}}")


def shape(obj: dict[str, Any], namespace: str = "ml") -> PodShape:
    return read_pod(obj, namespace).shape


def req(annotations: dict[str, str] | None = None, namespace: str = "ml", pol: Any = POLICY, **kw: Any):  # type: ignore[no-untyped-def]
    return parse_request(shape(pod(annotations=annotations, **kw), namespace), pol)


def test_defaults() -> None:
    """One GPU of the default vendor, any class, for the first container, no fallback."""
    r = req({"gpupool.io/gpu-class": "medium"})
    assert (r.vendor.name, r.count, r.pod_total, r.classes, r.container_index, r.fallback) == (
        "nvidia",
        1,
        1,
        ("medium",),
        0,
        False,
    )
    assert (r.min_memory_mib, r.min_driver, r.products, r.pool_pin) == (0, None, (), None)
    assert r.group == GroupRule("prefer", 0)


def test_every_annotation_is_read() -> None:
    """Each documented annotation lands in the request."""
    r = req(
        {
            "gpupool.io/gpu-class": "medium, high",
            "gpupool.io/min-memory": "20Gi",
            "gpupool.io/gpu-count": "2",
            "gpupool.io/gpu-product": "L4,A10",
            "gpupool.io/min-driver": "535.104",
            "gpupool.io/vendor": "nvidia",
            "gpupool.io/container": "main",
            "gpupool.io/fallback": "true",
            "gpupool.io/pool": "nvidia/medium/NVIDIA-L4",
            "gpupool.io/group": "llama-sft",
            "gpupool.io/group-policy": "strict",
            "gpupool.io/group-size": " 8",
        }
    )
    assert r.classes == ("medium", "high") and r.class_source == "annotation"
    assert (r.min_memory_mib, r.count, r.products, r.min_driver) == (20480, 2, (("l4",), ("a10",)), (535, 104))
    assert (r.fallback, r.pool_pin) == (True, PoolKey("nvidia", "medium", "NVIDIA-L4"))
    assert r.group == GroupRule("strict", 8)


def test_namespace_default_class_applies_when_no_class_is_asked() -> None:
    """A namespace rule's default class is used; its allowed classes bound what may be asked."""
    r = req({"gpupool.io/gpu-count": "1"}, namespace="team-a", pol=TEAM)
    assert (r.classes, r.class_source, r.allowed_classes) == (("medium",), "namespace default", ("medium", "high"))
    assert req({}, namespace="other", pol=TEAM, gpus=1).classes == ()


def test_existing_gpu_limit_gives_vendor_count_and_container() -> None:
    """A Pod that already asks for GPUs is read as it is: its vendor, its count, its container."""
    containers = [
        {"name": "sidecar", "image": "busybox"},
        {"name": "trainer", "image": "rocm/pytorch", "resources": {"limits": {"amd.com/gpu": "2"}}},
    ]
    r = req(None, containers=containers)
    assert (r.vendor.name, r.count, r.container_index) == ("amd", 2, 1)


def test_pod_total_counts_other_containers() -> None:
    """Another container's GPUs must be on the same node too."""
    containers = [
        {"name": "a", "image": "x"},
        {"name": "b", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
    ]
    r = req({"gpupool.io/gpu-count": "2", "gpupool.io/container": "a"}, containers=containers)
    assert (r.count, r.pod_total, r.container_index) == (2, 3, 0)


def test_nodeselector_pins_and_tolerations_are_read() -> None:
    """Pins on pool labels are kept; other nodeSelector keys are not gpupool's business."""
    r = req(
        {"gpupool.io/gpu-class": "medium"},
        node_selector={"nvidia.com/gpu.product": "Tesla-T4", "topology.kubernetes.io/zone": "a"},
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
    )
    assert r.pins == (("nvidia.com/gpu.product", "Tesla-T4"),)
    assert r.tolerations.items == (Toleration(key="dedicated", operator="Exists"),)


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"gpupool.io/gpu-clas": "high"},
            "unknown annotation gpupool.io/gpu-clas (did you mean gpupool.io/gpu-class?)",
        ),
        ({"gpupool.io/colour": "red"}, "unknown annotation gpupool.io/colour; accepted: gpupool.io/gpu-class"),
        ({"gpupool.io/gpu-class": "huge"}, "gpupool.io/gpu-class: 'huge' is not a class; accepted: low, medium, high"),
        ({"gpupool.io/gpu-class": "medium,"}, "gpupool.io/gpu-class: 'medium,' has an empty entry"),
        ({"gpupool.io/gpu-class": "high,high"}, "names a class twice"),
        ({"gpupool.io/min-memory": "lots"}, "gpupool.io/min-memory: 'lots' is not a positive memory quantity"),
        ({"gpupool.io/min-memory": "0"}, "gpupool.io/min-memory: '0' is not a positive"),
        (
            {"gpupool.io/gpu-count": "two"},
            "gpupool.io/gpu-count: 'two' is not a whole number of GPUs; accepted: 1 to 64",
        ),
        ({"gpupool.io/gpu-count": "0"}, "accepted: 1 to 64"),
        ({"gpupool.io/gpu-count": "65"}, "accepted: 1 to 64"),
        ({"gpupool.io/gpu-count": "1.5"}, "accepted: 1 to 64"),
        ({"gpupool.io/gpu-product": "A100;rm"}, "gpupool.io/gpu-product: 'A100;rm' is not a product token"),
        ({"gpupool.io/gpu-product": ""}, "gpupool.io/gpu-product: '' is not a product token"),
        ({"gpupool.io/min-driver": "v535"}, "gpupool.io/min-driver: 'v535' is not a driver version"),
        ({"gpupool.io/vendor": "intel"}, "gpupool.io/vendor: 'intel' is not a vendor; accepted: nvidia, amd, ascend"),
        ({"gpupool.io/container": "nope"}, "gpupool.io/container: no container named 'nope'; accepted: main"),
        ({"gpupool.io/fallback": "yes"}, "gpupool.io/fallback: 'yes' is not a boolean; accepted: true, false"),
        ({"gpupool.io/pool": "nvidia-T4"}, "gpupool.io/pool: 'nvidia-T4' is not vendor/class/product"),
        (
            {"gpupool.io/group": "Job/train"},
            "gpupool.io/group: 'Job/train' is not a group name; accepted: 1 to 63 letters, digits, '-', '_' or '.'",
        ),
        ({"gpupool.io/group": " train"}, "gpupool.io/group: ' train' is not a group name"),
        ({"gpupool.io/group": ""}, "gpupool.io/group: '' is not a group name"),
        ({"gpupool.io/group-policy": "loose"}, "gpupool.io/group-policy: 'loose' is not a group policy; accepted: pre"),
        (
            {"gpupool.io/group-size": "many"},
            "gpupool.io/group-size: 'many' is not a whole number of Pods; accepted: 1 to 4096",
        ),
        ({"gpupool.io/group-size": "0"}, "group-size: '0' is not a whole number of Pods; accepted: 1 to 4096"),
        ({"gpupool.io/group-size": "4097"}, "group-size: '4097' is not a whole number of Pods"),
    ],
    ids=lambda v: str(v)[:40] if isinstance(v, dict) else None,
)
def test_bad_values_are_refused_naming_annotation_value_and_accepted(annotations: dict[str, str], message: str) -> None:
    """Nothing is silently ignored: the message names the annotation, the value and what is accepted."""
    with pytest.raises(RequestError) as err:
        req(annotations)
    assert message in str(err.value)


def test_class_names_are_case_insensitive_like_products() -> None:
    """`gpu-class: High` is the policy's `high` (products were already matched without regard to case), and
    the namespace's rule applies to it as to `high`."""
    assert req({"gpupool.io/gpu-class": "High"}).classes == ("high",)
    assert req({"gpupool.io/gpu-class": "MEDIUM, high"}).classes == ("medium", "high")
    with pytest.raises(RequestError, match="class 'low' is not allowed in namespace team-a"):
        req({"gpupool.io/gpu-class": "LOW"}, namespace="team-a", pol=TEAM)
    with pytest.raises(RequestError, match="names a class twice"):
        req({"gpupool.io/gpu-class": "high,HIGH"})


def test_class_outside_namespace_rule_is_refused() -> None:
    """A namespace limited to medium/high cannot ask for low."""
    with pytest.raises(
        RequestError, match="class 'low' is not allowed in namespace team-a; accepted here: medium, high"
    ):
        req({"gpupool.io/gpu-class": "low"}, namespace="team-a", pol=TEAM)


@pytest.mark.parametrize(
    ("annotations", "limits", "message"),
    [
        (
            {"gpupool.io/gpu-count": "2"},
            {"nvidia.com/gpu": "1"},
            "gpupool.io/gpu-count: 2 contradicts container 'main'",
        ),
        (
            {"gpupool.io/vendor": "amd"},
            {"nvidia.com/gpu": "1"},
            "'amd' contradicts the Pod's own nvidia.com/gpu request",
        ),
        ({}, {"nvidia.com/gpu": "1", "amd.com/gpu": "1"}, "requests GPUs of several vendors"),
        ({}, {"nvidia.com/gpu": "500m"}, "'500m' is not a whole number of GPUs"),
    ],
)
def test_contradictions_with_the_pod_are_refused(
    annotations: dict[str, str], limits: dict[str, str], message: str
) -> None:
    """Annotations and the Pod's own resources must agree."""
    containers = [{"name": "main", "image": "x", "resources": {"limits": limits}}]
    with pytest.raises(RequestError, match=message.replace("(", r"\\(")):
        req(annotations, containers=containers)


def test_limits_and_requests_that_differ_are_refused() -> None:
    """Kubernetes requires equal GPU limits and requests; say so before it does."""
    containers = [
        {
            "name": "main",
            "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}},
        }
    ]
    with pytest.raises(RequestError, match="limits nvidia.com/gpu=2 and requests nvidia.com/gpu=1 differ"):
        req(None, containers=containers)


def test_pod_without_containers_is_refused() -> None:
    """There is nothing to give GPUs to."""
    with pytest.raises(RequestError, match="no containers"):
        req({"gpupool.io/gpu-count": "1"}, containers=[])


@pytest.mark.parametrize(
    ("obj", "wanted"),
    [
        (pod(), False),
        (pod(annotations={"team": "x"}), False),
        (pod(annotations={"gpupool.io/gpu-count": "1"}), True),
        (pod(gpus=1), True),
        (pod(gpus=1, resource="huawei.com/Ascend910"), True),
        (pod(gpus=1, resource="example.com/fpga"), False),
    ],
    ids=["plain", "other-annotation", "annotated", "gpu-limit", "ascend", "other-resource"],
)
def test_which_pods_are_gpupools_business(obj: dict[str, Any], wanted: bool) -> None:
    """A gpupool.io/ annotation or a policy GPU resource opts a Pod in; nothing else does."""
    assert wants_gpus(shape(obj), POLICY) is wanted


def test_every_problem_is_reported_at_once() -> None:
    """A Pod with several mistakes hears about all of them in one denial."""
    with pytest.raises(RequestError) as err:
        req({"gpupool.io/gpu-clas": "high", "gpupool.io/gpu-count": "two", "gpupool.io/min-memory": "lots"})
    message = str(err.value)
    assert "unknown annotation gpupool.io/gpu-clas" in message
    assert "gpupool.io/gpu-count: 'two'" in message and "gpupool.io/min-memory: 'lots'" in message


def test_gpus_of_an_init_container_alone_leave_the_containers_alone() -> None:
    """A Pod whose only GPU user is an init container keeps its own count: no limit is added elsewhere."""
    obj = pod(annotations=None)
    obj["spec"]["initContainers"] = [{"name": "prep", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
    r = parse_request(shape(obj), POLICY)
    assert (r.count, r.pod_total) == (0, 2)


@pytest.mark.parametrize("key", sorted(MAX_CHARS), ids=sorted(MAX_CHARS))
def test_every_annotation_value_is_bounded_before_it_is_parsed(key: str) -> None:
    """A value longer than its annotation accepts is refused by its length, naming the limit; the
    message does not echo the value."""
    limit = MAX_CHARS[key]
    with pytest.raises(
        RequestError, match=f"{key}: the value is {limit + 1} characters long; accepted: at most {limit}"
    ) as err:
        req({f"gpupool.io/{key}": "1" * (limit + 1)})
    assert len(str(err.value)) < 200


@pytest.mark.parametrize(
    ("annotations", "words"),
    [
        ({"gpupool.io/gpu-count": "²"}, "gpu-count: '²' is not a whole number"),
        ({"gpupool.io/gpu-count": "２"}, "gpu-count: '２' is not a whole number"),
        ({"gpupool.io/gpu-count": "٣"}, "gpu-count: '٣' is not a whole number"),
        ({"gpupool.io/min-driver": "535.²"}, "min-driver: '535.²' is not a driver version"),
        ({"gpupool.io/min-memory": "٣Gi"}, "min-memory: '٣Gi' is not a positive memory quantity"),
        ({"gpupool.io/min-memory": "1e999999"}, "min-memory: '1e999999' is not a positive memory quantity"),
        ({"gpupool.io/group-size": "１６"}, "group-size: '１６' is not a whole number of Pods"),
    ],
    ids=["superscript-count", "full-width-count", "arabic-indic-count", "superscript-driver", "arabic-indic-memory",
         "huge-exponent-memory", "full-width-group-size"],
)  # fmt: skip
def test_numbers_are_ascii_digits_only(annotations: dict[str, str], words: str) -> None:
    """Unicode digits are refused as the value they are (they used to be read as numbers, or to end in an
    internal error)."""
    with pytest.raises(RequestError, match=words):
        req(annotations)


@pytest.mark.parametrize("raw", ["1e5000", "9" * 5000, "٣"], ids=["huge-exponent", "5000-digits", "arabic-indic"])
def test_a_container_limit_that_is_no_count_of_gpus_is_refused(raw: str) -> None:
    """The Pod's own GPU limit must be a whole number; a hostile one is refused, shown shortened."""
    containers = [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": raw}}}]
    with pytest.raises(RequestError, match="limits nvidia.com/gpu: .* is not a whole number of GPUs") as err:
        req(None, containers=containers)
    assert len(str(err.value)) < 200


def test_a_denial_names_the_first_problems_and_counts_the_rest() -> None:
    """Sixty unknown gpupool.io/ keys (ten thousand are refused before they are read, see test_pod) give
    a message of a few hundred characters."""
    annotations = {f"gpupool.io/key-{i:05d}": "x" for i in range(60)}
    with pytest.raises(RequestError) as err:
        req(annotations)
    message = str(err.value)
    assert "unknown annotations gpupool.io/key-00000, gpupool.io/key-00001" in message
    assert f"gpupool.io/key-0000{MAX_PROBLEMS - 1} and {60 - MAX_PROBLEMS} more; accepted:" in message
    assert len(message) < 2000
