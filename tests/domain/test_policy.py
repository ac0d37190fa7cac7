"""The policy file: the built-in default, a user file merged over it, and errors that name the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from webhook.domain.policy import PolicyError, default_policy_text, load_policy, load_policy_text
from webhook.domain.products import tokens

REPO = Path(__file__).resolve().parents[2]


def test_default_policy_is_the_manifests_file() -> None:
    """The code and the ConfigMap read the same file, so they cannot drift."""
    assert default_policy_text() == (REPO / "manifests" / "base" / "policy.yaml").read_text("utf-8")


def test_default_policy_classes_and_product_table() -> None:
    """The default classes are low<medium<high and the product table classes the common GPUs."""
    policy = load_policy(None)
    assert policy.classes == ("low", "medium", "high")
    nv = policy.vendors["nvidia"].product_prefixes
    classes = {
        p: policy.product_class(tokens(p, nv))
        for p in (
            "NVIDIA-H100-80GB-HBM3",
            "NVIDIA-H200",
            "NVIDIA-B200",
            "NVIDIA-A100-SXM4-40GB",
            "NVIDIA-L40S",
            "NVIDIA-L4",
            "NVIDIA-A10",
            "Tesla-T4",
            "NVIDIA-GeForce-RTX-3060",
            "NVIDIA-GeForce-RTX-4090",
        )
    }
    assert classes == {
        "NVIDIA-H100-80GB-HBM3": "high",
        "NVIDIA-H200": "high",
        "NVIDIA-B200": "high",
        "NVIDIA-A100-SXM4-40GB": "high",
        "NVIDIA-L40S": "medium",
        "NVIDIA-L4": "medium",
        "NVIDIA-A10": "medium",
        "Tesla-T4": "medium",
        "NVIDIA-GeForce-RTX-3060": "low",
        "NVIDIA-GeForce-RTX-4090": "low",
    }


def test_most_specific_product_entry_wins() -> None:
    """`A100-80GB` gets 80Gi from its own entry, a plain A100 40Gi; unknown products get nothing."""
    policy = load_policy(None)
    nv = policy.vendors["nvidia"].product_prefixes
    assert policy.product_memory_mib(tokens("NVIDIA-A100-SXM4-80GB", nv)) == 80 * 1024
    assert policy.product_memory_mib(tokens("NVIDIA-A100-SXM4-40GB", nv)) == 40 * 1024
    assert policy.product_class(tokens("NVIDIA-Quadro-P2000", nv)) == ""


def test_user_file_merges_over_the_default() -> None:
    """An admin's file changes only what it names: defaults key by key, vendors one by one."""
    policy = load_policy_text(
        "defaults: {onNoCapacity: deny}\n"
        "vendors: {amd: {resource: amd.com/gpu, productLabel: amd.com/gpu.product-name}}\n"
        "namespaces: {team-a: {allowedClasses: [medium, high], defaultClass: medium, classQuota: {high: 4}}}\n"
    )
    assert policy.defaults.on_no_capacity == "deny"
    assert policy.defaults.fallback is False  # untouched default
    assert policy.vendors["nvidia"].resource == "nvidia.com/gpu"
    assert policy.vendors["amd"].taints == ()  # replaced whole
    rule = policy.namespace("team-a")
    assert (rule.allowed_classes, rule.default_class, dict(rule.class_quota)) == (
        ("medium", "high"),
        "medium",
        {"high": 4},
    )
    assert policy.namespace("elsewhere").allowed_classes == ()


def test_memory_quota_and_the_quota_forms_switch() -> None:
    """memoryQuota is GPU memory as a quantity, kept in MiB; the tutorial's ResourceQuota forms are
    enforced by default, and a switch turns that off."""
    policy = load_policy_text("namespaces: {team-a: {memoryQuota: 320Gi}, team-b: {memoryQuota: 100G}}")
    assert policy.namespace("team-a").memory_quota_mib == 320 * 1024
    assert policy.namespace("team-b").memory_quota_mib == 100 * 10**9 // 2**20
    assert policy.namespace("elsewhere").memory_quota_mib is None
    assert policy.defaults.enforce_all_gpu_quota_forms is True
    assert load_policy_text("defaults: {enforceAllGpuQuotaForms: false}").defaults.enforce_all_gpu_quota_forms is False


def test_devices_default_to_whole_gpus_and_a_namespace_may_choose_others() -> None:
    """gpupool.io/device defaults to the namespace's `device`, else `defaults.device`, else whole GPUs;
    `[shared, gpu]` and `shared,gpu` are the same ordered list."""
    policy = load_policy_text("namespaces: {students: {device: [shared, gpu]}, lab: {device: 'mig,gpu'}}")
    assert policy.device_default("elsewhere") == ("gpu",)
    assert policy.device_default("students") == ("shared", "gpu")
    assert policy.device_default("lab") == ("mig", "gpu")
    assert load_policy_text("defaults: {device: [mig, gpu]}").device_default("elsewhere") == ("mig", "gpu")


def test_the_product_table_knows_the_compute_capability_of_the_gpus_it_classes() -> None:
    """Compute capabilities of NVIDIA's data-center and GeForce cards, for nodes without GFD's compute
    labels; a MIG instance or a shared replica has its GPU's, and an unknown product has none."""
    policy = load_policy(None)
    nv = policy.vendors["nvidia"].product_prefixes
    expected = {
        "Tesla-V100-SXM2-16GB": (7, 0),
        "Tesla-T4": (7, 5),
        "NVIDIA-A100-SXM4-40GB": (8, 0),
        "NVIDIA-A100-SXM4-80GB": (8, 0),
        "NVIDIA-A10": (8, 6),
        "NVIDIA-A10G": (8, 6),
        "NVIDIA-GeForce-RTX-3060": (8, 6),
        "NVIDIA-L4": (8, 9),
        "NVIDIA-L40S": (8, 9),
        "NVIDIA-GeForce-RTX-4090": (8, 9),
        "NVIDIA-H100-80GB-HBM3": (9, 0),
        "NVIDIA-H200": (9, 0),
        "NVIDIA-B200": (10, 0),
        "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb": (8, 0),
        "Tesla-T4-SHARED": (7, 5),
    }
    assert {p: policy.product_compute(tokens(p, nv)) for p in expected} == expected
    assert policy.product_compute(tokens("NVIDIA-GeForce-GTX-1080", nv)) is None
    assert policy.product_compute(tokens("AMD_Instinct_MI250X", ("AMD",))) is None


def test_compute_and_cuda_labels_are_nvidias() -> None:
    """GPU Feature Discovery's compute capability and CUDA labels; the other vendors have neither."""
    policy = load_policy(None)
    nvidia, amd = policy.vendors["nvidia"], policy.vendors["amd"]
    assert nvidia.compute_labels == ("nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor")
    assert nvidia.cuda_label == "nvidia.com/cuda.runtime-version.full" and nvidia.has_cuda
    assert (amd.compute_labels, amd.has_cuda) == ((), False)


def test_reservations_of_forged_reviews_are_short_lived_and_bounded_by_default() -> None:
    """A reservation whose Pod a current watch never shows stops counting within 5 s, and one namespace
    holds at most 500 of them; both can be set."""
    defaults = load_policy(None).defaults
    assert (defaults.reservation_settle_seconds, defaults.max_reservations_per_namespace) == (5.0, 500)
    changed = load_policy_text("defaults: {reservationSettleSeconds: 12, maxReservationsPerNamespace: 2000}").defaults
    assert (changed.reservation_settle_seconds, changed.max_reservations_per_namespace) == (12.0, 2000)


def test_the_queues_bounded_wait_is_five_minutes_by_default_and_can_be_set() -> None:
    """`defaults.queueHoldAfterSeconds`: 300 s in the shipped policy; a positive number of seconds when set."""
    assert load_policy(None).defaults.queue_hold_after_seconds == 300.0
    assert load_policy_text("defaults: {queueHoldAfterSeconds: 30}").defaults.queue_hold_after_seconds == 30.0


@pytest.mark.parametrize("value", ["0", "-5", "soon", "true"])
def test_a_bounded_wait_that_is_not_a_positive_number_of_seconds_is_refused_naming_the_field(value: str) -> None:
    with pytest.raises(PolicyError, match=r"defaults\.queueHoldAfterSeconds: expected a positive number of seconds"):
        load_policy_text(f"defaults: {{queueHoldAfterSeconds: {value}}}")


@pytest.mark.parametrize(
    ("resource", "vendor", "kinds"),
    [
        ("nvidia.com/gpu", "nvidia", ()),
        ("nvidia.com/gpu.shared", "nvidia", ("shared",)),
        ("nvidia.com/mig-3g.20gb", "nvidia", ("mig", "shared")),
        ("nvidia.com/mig-1g.5gb.shared", "nvidia", ("shared",)),
        ("amd.com/gpu", "amd", ()),
        ("huawei.com/Ascend910", "ascend", ()),
        ("huawei.com/Ascend310P", "ascend", ()),
        ("huawei.com/Ascend310", "ascend", ()),
        ("huawei.com/Ascend910-4c", "ascend", ("mig", "shared")),
        ("huawei.com/Ascend310P-4c.3cpu.ndvpp", "ascend", ("mig", "shared")),
    ],
)
def test_every_device_resource_belongs_to_its_vendor(resource: str, vendor: str, kinds: tuple[str, ...]) -> None:
    """Renamed replicas, other cards and virtual NPUs are their vendor's, and a Pod that requests one gets
    the kinds of device it carries (() for whole devices: the Pod's device preference says)."""
    policy = load_policy(None)
    owner = policy.vendor_of(resource)
    assert owner is not None and owner.name == vendor
    assert owner.device_kinds(resource) == kinds
    assert resource in policy.gpu_resources or resource.startswith(policy.partition_prefixes)


@pytest.mark.parametrize(
    "resource", ["nvidia.com/gpux", "nvidia.com/gpu.shared.shared", "nvidia.com/mig-", "huawei.com/Ascend", "cpu"]
)
def test_look_alike_resources_belong_to_no_vendor(resource: str) -> None:
    assert load_policy(None).vendor_of(resource) is None


def test_a_partition_prefix_list_and_a_suffix_are_read() -> None:
    policy = load_policy_text(
        "vendors: {acme: {resource: acme.io/npu, productLabel: acme.io/model, otherResources: [acme.io/lite],"
        " partitionResourcePrefix: [acme.io/npu-, acme.io/lite-], sharedResourceSuffix: .shared}}"
    )
    acme = policy.vendors["acme"]
    assert (acme.partition_prefixes, acme.other_resources, acme.shared_suffix) == (
        ("acme.io/npu-", "acme.io/lite-"),
        ("acme.io/lite",),
        ".shared",
    )
    assert acme.resources == ("acme.io/npu", "acme.io/lite", "acme.io/npu.shared", "acme.io/lite.shared")
    assert acme.device_kinds("acme.io/lite-2c.shared") == ("shared",)


def test_empty_user_file_is_the_default() -> None:
    """An empty ConfigMap entry is valid and means the default."""
    assert load_policy_text("") == load_policy(None)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("classes: []", "classes"),
        ("classes: [low, low]", "classes"),
        ("clases: [low]", "policy.clases: unknown field"),
        ("defaults: {onNoCapacity: maybe}", "defaults.onNoCapacity: 'maybe' is not one of warn, deny"),
        ("defaults: {fallback: yes please}", "defaults.fallback: expected true or false"),
        ("defaults: {staleAfterSeconds: -1}", "defaults.staleAfterSeconds"),
        (
            "defaults: {maxReservationsPerNamespace: 0}",
            "defaults.maxReservationsPerNamespace: expected a whole number from 1 to 1000000, got 0",
        ),
        ("defaults: {maxReservationsPerNamespace: 2.5}", "defaults.maxReservationsPerNamespace: expected a whole"),
        ("defaults: {maxReservationsPerNamespace: true}", "defaults.maxReservationsPerNamespace: expected a whole"),
        ("defaultVendor: intel", "defaultVendor: 'intel' is not a vendor"),
        ("vendors: {nvidia: {resource: nvidia.com/gpu}}", "vendors.nvidia.productLabel"),
        ("vendors: {nvidia: {resource: x, productLabel: y, memoryUnit: KB}}", "vendors.nvidia.memoryUnit"),
        (
            "vendors: {nvidia: {resource: x, productLabel: y, taints: [{key: k, effect: Sometimes}]}}",
            "vendors.nvidia.taints[0].effect",
        ),
        ("vendors: {amd: {resource: nvidia.com/gpu, productLabel: y}}", "two vendors share a resource"),
        (
            "vendors: {amd: {resource: amd.com/gpu, productLabel: y, otherResources: [nvidia.com/gpu.shared]}}",
            "two vendors share a resource",
        ),
        (
            "vendors: {amd: {resource: amd.com/gpu, productLabel: y, partitionResourcePrefix: amd.com/}}",
            "vendors.amd.partitionResourcePrefix: 'amd.com/' would take 'amd.com/gpu', a resource of whole devices",
        ),
        (
            "vendors: {amd: {resource: amd.com/gpu, productLabel: y, partitionResourcePrefix: [5]}}",
            "vendors.amd.partitionResourcePrefix: expected a list of strings",
        ),
        (
            "vendors: {amd: {resource: amd.com/gpu, productLabel: y, sharedResourceSuffix: [x]}}",
            "vendors.amd.sharedResourceSuffix: expected a non-empty string",
        ),
        ("products: [{match: T4, class: mid}]", "products[0].class: 'mid' is not a class"),
        ("products: [{match: T4, memory: lots}]", "products[0].memory"),
        ("products: [{match: T4}]", "products[0]: gives neither class, memory nor computeCapability"),
        ("products: [{match: T4, computeCapability: '7.5.1'}]", "products[0].computeCapability: '7.5.1' is not"),
        ("products: [{match: T4, computeCapability: true}]", "products[0].computeCapability: True is not"),
        ("defaults: {device: [tpu]}", "defaults.device: ['tpu'] 'tpu' is not a device kind"),
        ("defaults: {device: 'gpu,gpu'}", "defaults.device: 'gpu,gpu' names a device kind twice"),
        ("namespaces: {a: {device: 5}}", "namespaces.a.device: expected a device kind or an ordered list"),
        (
            "vendors: {nvidia: {resource: x, productLabel: y, computeCapabilityLabels: [m]}}",
            "vendors.nvidia.computeCapabilityLabels: expected 2 labels (major, minor)",
        ),
        ("namespaces: {a: {allowedClasses: [huge]}}", "namespaces.a.allowedClasses: 'huge' is not a class"),
        ("namespaces: {a: {allowedClasses: [low], defaultClass: high}}", "namespaces.a.defaultClass"),
        ("namespaces: {a: {classQuota: {high: -1}}}", "namespaces.a.classQuota.high"),
        ("namespaces: {a: {classQuota: {huge: 1}}}", "namespaces.a.classQuota.huge: not a class"),
        ("namespaces: {a: {memoryQuota: lots}}", "namespaces.a.memoryQuota: expected GPU memory as a quantity such"),
        ("namespaces: {a: {memoryQuota: -1Gi}}", "namespaces.a.memoryQuota: expected GPU memory"),
        ("namespaces: {a: {memoryQuota: [1]}}", "namespaces.a.memoryQuota: expected GPU memory"),
        ("defaults: {enforceAllGpuQuotaForms: no thanks}", "defaults.enforceAllGpuQuotaForms: expected true or false"),
        ("kind: ConfigMap", "kind: 'ConfigMap' is not Policy"),
        ("- a list", "expected a mapping at the top level"),
        ("classes: [low\n", "not valid YAML"),
    ],
)
def test_invalid_policy_is_refused_naming_the_field(text: str, names: str) -> None:
    """Each mistake is refused at start with a message that points at the field."""
    with pytest.raises(PolicyError) as err:
        load_policy_text(text, source="my-policy.yaml")
    assert names in str(err.value)
    assert str(err.value).startswith("my-policy.yaml")


def test_missing_policy_file_is_a_clear_error(tmp_path: Path) -> None:
    """A path that does not exist names the path."""
    with pytest.raises(PolicyError, match="cannot read policy file .*nope.yaml"):
        load_policy(str(tmp_path / "nope.yaml"))


def test_a_policy_with_another_product_table_answers_from_its_own_table() -> None:
    """The product table's answers are remembered per policy: a policy made from another with a different
    table (dataclasses.replace, as reloading and pooling make them) answers from its own table, even after
    the first one was asked about the same product."""
    policy = load_policy(None)
    t4 = tokens("Tesla-T4", policy.vendors["nvidia"].product_prefixes)
    assert (policy.product_class(t4), policy.product_memory_mib(t4)) == ("medium", 16384)
    other = dataclasses.replace(policy, products=())
    assert (other.product_class(t4), other.product_memory_mib(t4), other.product_compute(t4)) == ("", 0, None)
    assert policy.product_class(t4) == "medium"


def test_a_policy_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    """`gpupool explain --policy` on a file that is not UTF-8 text: an error naming the file, not a traceback."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"\xff\xfe classes: [a]")
    with pytest.raises(PolicyError, match=r"policy\.yaml: not UTF-8 text"):
        load_policy(str(path))


def test_pods_queue_by_default_and_now_is_kept_where_the_policy_says_so() -> None:
    """The shipped policy queues every namespace it does not mention; `placement: now`, in defaults or
    per namespace, keeps admission-time pinning, also for a file merged over the default."""
    shipped = load_policy(None)
    assert shipped.defaults.placement == "queue"
    assert shipped.placement("any-namespace") == "queue"
    assert shipped.queues
    kept = load_policy_text("defaults: {placement: now}\nnamespaces: {team-q: {placement: queue}}\n")
    assert (kept.placement("any-namespace"), kept.placement("team-q")) == ("now", "queue")
    one = load_policy_text("namespaces: {team-n: {placement: now}}\n")
    assert (one.placement("any-namespace"), one.placement("team-n")) == ("queue", "now")
