"""Workload groups: which Pods belong together, by annotation, workload label or controller owner."""

from __future__ import annotations

import pytest

from webhook.domain.groups import MAX_OWNERS, controller_of, valid_name, workload_group

JOB_OWNER = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train-7", "uid": "u", "controller": True}]


def test_the_annotation_names_the_group() -> None:
    """A name the user sets wins over labels and owners: it can join Pods of different controllers."""
    labels = {"jobset.sigs.k8s.io/jobset-name": "llama"}
    assert workload_group("sweep-3", labels, ("Job", "train-7")) == "sweep-3"


def test_a_job_pod_is_grouped_by_its_job() -> None:
    """Pods a controller creates carry its ownerReference: a Job's Pods are one group with no annotation."""
    assert workload_group(None, {}, controller_of(JOB_OWNER)) == "Job/train-7"


def test_only_the_controller_owner_counts() -> None:
    """An ownerReference without `controller: true` (a garbage-collection link) groups nothing."""
    owners = [{"kind": "ConfigMap", "name": "cfg"}, {"kind": "StatefulSet", "name": "db", "controller": True}]
    assert controller_of(owners) == ("StatefulSet", "db")
    assert controller_of([{"kind": "ConfigMap", "name": "cfg", "controller": False}]) is None
    assert workload_group(None, {}, None) == ""


@pytest.mark.parametrize(
    ("label", "shown"),
    [
        ("jobset.sigs.k8s.io/jobset-name", "JobSet/llama"),
        ("training.kubeflow.org/job-name", "KubeflowJob/llama"),
        ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet/llama"),
        ("ray.io/cluster", "RayCluster/llama"),
    ],
)
def test_workload_labels_group_the_pods_of_multi_job_workloads(label: str, shown: str) -> None:
    """The label names the whole workload, so it wins over the controller owner, which for a JobSet is
    one of its Jobs: all the JobSet's Pods are one group, not one group per Job."""
    assert workload_group(None, {label: "llama"}, ("Job", "llama-workers-0")) == shown


def test_malformed_values_are_passed_over() -> None:
    """A value that is not a name (too long, a '/' that could pass for another form) is skipped, and the
    next source decides."""
    assert workload_group("a/b", {}, ("Job", "j")) == "Job/j"
    assert workload_group("x" * 64, {"ray.io/cluster": "-bad"}, ("Job", "j")) == "Job/j"
    assert workload_group(None, {}, ("Job", "a" * 254)) == ""
    assert workload_group(None, {}, ("Bad Kind", "j")) == ""
    assert workload_group(5, {"ray.io/cluster": 3}, (None, "j")) == ""


def test_names_are_label_values() -> None:
    """Accepted: 1 to 63 ASCII letters, digits, '-', '_', '.', starting and ending with a letter or digit."""
    assert all(valid_name(v) for v in ("a", "llama-70b.sft_2", "A" * 63))
    assert not any(valid_name(v) for v in ("", "-a", "a-", "a b", "a/b", "ｌｌａｍａ", "A" * 64))


def test_only_the_first_owners_are_read() -> None:
    """A controller entry past the first MAX_OWNERS is not looked for: the work per Pod is bounded."""
    owners = [{"kind": "ConfigMap", "name": f"c{i}"} for i in range(MAX_OWNERS)]
    assert controller_of([*owners, JOB_OWNER[0]]) is None
    assert controller_of([*owners[1:], JOB_OWNER[0]]) == ("Job", "train-7")
