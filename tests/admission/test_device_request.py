"""What a Pod asks of its device: gpupool.io/device (and its defaults), min-compute-capability and
min-cuda, read into the GpuRequest; every bad value refused naming the annotation, value and what is
accepted."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import pod, policy
from webhook.admission.pod import read_pod
from webhook.admission.request import KNOWN, MAX_CHARS, GpuRequest, RequestError, parse_request

POLICY = policy("namespaces: {students: {device: [shared, gpu]}}")


def req(annotations: dict[str, str] | None = None, namespace: str = "ml", **kw: Any) -> GpuRequest:
    return parse_request(read_pod(pod(annotations=annotations, **kw), namespace).shape, POLICY)


def refused(annotations: dict[str, str], namespace: str = "ml", **kw: Any) -> str:
    with pytest.raises(RequestError) as err:
        req(annotations, namespace, **kw)
    return str(err.value)


def test_the_device_annotations_are_known_and_bounded() -> None:
    """gpupool.io/device, min-compute-capability and min-cuda are annotations, each with a length bound."""
    for name in ("device", "min-compute-capability", "min-cuda"):
        assert name in KNOWN and name in MAX_CHARS


def test_a_pod_that_names_no_device_gets_whole_gpus() -> None:
    """Without the annotation nor a namespace default, whole GPUs only (the policy's defaults.device)."""
    r = req({"gpupool.io/gpu-class": "medium"})
    assert (r.devices, r.device_source) == (("gpu",), "policy default")


def test_the_namespace_default_applies_and_the_annotation_wins() -> None:
    """students default to shared replicas, then GPUs; a Pod's own list replaces the default, in order."""
    assert (req(namespace="students").devices, req(namespace="students").device_source) == (
        ("shared", "gpu"),
        "namespace default",
    )
    r = req({"gpupool.io/device": "mig, gpu"}, namespace="students")
    assert (r.devices, r.device_source) == (("mig", "gpu"), "annotation")


def test_a_pod_requesting_a_mig_instance_takes_that_resources_devices() -> None:
    """A Pod whose container requests nvidia.com/mig-3g.20gb pins its pools to that resource, and its
    count is what it requests there."""
    r = req(gpus=2, resource="nvidia.com/mig-3g.20gb")
    assert (r.resource, r.devices, r.device_source, r.count, r.pod_total) == (
        "nvidia.com/mig-3g.20gb",
        ("mig", "shared"),
        "requested resource",
        2,
        2,
    )
    assert req(gpus=1).resource == "nvidia.com/gpu" and req().resource == ""


def test_a_device_contradicting_the_pods_own_mig_request_is_refused() -> None:
    message = refused({"gpupool.io/device": "gpu"}, gpus=1, resource="nvidia.com/mig-1g.5gb")
    assert "annotation gpupool.io/device: 'gpu' contradicts the Pod's own nvidia.com/mig-1g.5gb request" in message
    assert "accepted here: mig, shared" in message


def test_more_than_one_shared_replica_alone_is_refused_naming_both_annotations() -> None:
    """A replica is one share of a GPU: gpu-count 2 with device shared alone is refused (400), naming both
    annotations; with a list, the Pod is accepted (shared pools are skipped when deciding)."""
    message = refused({"gpupool.io/device": "shared", "gpupool.io/gpu-count": "2"})
    assert "gpupool.io/gpu-count: 2 with gpupool.io/device: shared" in message
    assert req({"gpupool.io/device": "shared,gpu", "gpupool.io/gpu-count": "2"}).count == 2


def test_more_than_one_replica_from_a_shared_only_namespace_default_is_refused() -> None:
    config = policy("namespaces: {lab: {device: [shared]}}")
    with pytest.raises(
        RequestError,
        match=r"2 devices \(gpupool.io/gpu-count\) with gpupool.io/device: shared \(the namespace default\)",
    ):
        parse_request(read_pod(pod(gpus=2), "lab").shape, config)


@pytest.mark.parametrize(
    ("value", "problem"),
    [("tpu", "'tpu' is not a device kind"), ("gpu,,mig", "has an empty entry"), ("gpu,gpu", "twice"),
     ("", "has an empty entry"), ("GPU", "not a device kind")],
)  # fmt: skip
def test_bad_device_lists_are_refused_saying_what_is_accepted(value: str, problem: str) -> None:
    message = refused({"gpupool.io/device": value})
    assert message.startswith("annotation gpupool.io/device:") and problem in message
    assert "accepted: a device kind or an ordered list such as 'mig,gpu' of: gpu, mig, shared" in message


def test_compute_capability_and_cuda_are_read_as_versions() -> None:
    r = req({"gpupool.io/min-compute-capability": "8.9", "gpupool.io/min-cuda": "12.4"})
    assert (r.min_compute, r.min_cuda) == ((8, 9), (12, 4))
    assert req({"gpupool.io/min-compute-capability": "9"}).min_compute == (9,)


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [("min-compute-capability", "8.0.1", "major.minor such as 8.0"), ("min-compute-capability", "sm_80", "8.0"),
     ("min-compute-capability", "８.0", "8.0"), ("min-cuda", "12.4.1", "major.minor such as 12.4"),
     ("min-cuda", "cuda12", "12.4"), ("min-cuda", "", "12.4")],
)  # fmt: skip
def test_bad_versions_are_refused_naming_annotation_value_and_what_is_accepted(
    name: str, value: str, accepted: str
) -> None:
    message = refused({f"gpupool.io/{name}": value})
    assert message.startswith(f"annotation gpupool.io/{name}: {value!r}") and accepted in message


def test_compute_capability_and_cuda_on_another_vendor_are_refused() -> None:
    """Compute capability and CUDA are NVIDIA's: on an AMD Pod they are refused (400), not ignored."""
    message = refused({"gpupool.io/vendor": "amd", "gpupool.io/min-compute-capability": "8.0"})
    assert "annotation gpupool.io/min-compute-capability: '8.0': amd devices have no compute capability" in message
    assert "accepted: only for nvidia" in message
    message = refused({"gpupool.io/vendor": "amd", "gpupool.io/min-cuda": "12.0"})
    assert "annotation gpupool.io/min-cuda: '12.0': amd devices do not run CUDA" in message


@pytest.mark.parametrize("name", ["device", "min-compute-capability", "min-cuda"])
def test_long_values_are_refused_before_they_are_read(name: str) -> None:
    message = refused({f"gpupool.io/{name}": "8" * 10_000})
    assert f"annotation gpupool.io/{name}: the value is 10000 characters long; accepted: at most" in message


def test_a_mig_profiles_product_label_pins_pools_like_the_gpu_product_label() -> None:
    """`nvidia.com/mig-3g.20gb.product` in the Pod's nodeSelector is a pin: pools whose selector lacks it
    (whole GPUs) cannot take the Pod, so it is never sent where its own nodeSelector reaches no node."""
    selector = {"nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "kubernetes.io/os": "linux"}
    r = req(node_selector=selector)
    assert r.pins == (("nvidia.com/mig-3g.20gb.product", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"),)
    assert r.node_selector == tuple(sorted(selector.items()))
