"""`gpupool explain` on workloads: each Pod template is explained as the Pod its controller will create,
with the name, labels and controller owner that controller gives it, so that its workload group comes
out as it will in the cluster (webhook.domain.groups decides it, from those). One section per template;
a file may hold several documents or a List. On the demo inventory (examples/cluster.yaml)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.commands.cli import main
from webhook.commands.workloads import KINDS

REPO = Path(__file__).resolve().parents[2]
INVENTORY = str(REPO / "examples" / "cluster.yaml")
POLICY = str(REPO / "examples" / "policy.yaml")
GPU = {"gpupool.io/gpu-class": "medium"}  # any template that asks gpupool for a GPU


def template(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": annotations if annotations is not None else dict(GPU)}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}]}}


def obj(
    api_version: str, kind: str, name: str, spec: dict[str, Any], namespace: str | None = "ml-train"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec}


def explain(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *docs: dict[str, Any], args: tuple[str, ...] = ()
) -> tuple[int, list[dict[str, Any]]]:
    """`gpupool explain` of a file holding `docs`, `-o json`: (exit status, its sections)."""
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all(docs), "utf-8")
    status = main(["explain", str(path), "--inventory", INVENTORY, "--policy", POLICY, "-o", "json", *args])
    out, err = capsys.readouterr()
    assert status in (0, 1), err
    answer = json.loads(out)
    return status, answer["items"] if answer.get("kind") == "List" else [answer]


def owner(section: dict[str, Any]) -> str:
    ref = section["patchedPod"]["metadata"]["ownerReferences"]
    assert len(ref) == 1 and ref[0]["controller"] is True
    return f"{ref[0]['kind']}/{ref[0]['name']}"


def labels(section: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = section["patchedPod"]["metadata"].get("labels", {})
    return found


# --- the kinds, as their controllers make their Pods ------------------------------------------------------


def test_a_job_is_explained_as_its_pods(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`gpupool explain job.yaml` used to fail with "kind 'Job' is not Pod". Its Pods are `<job>-<random>`,
    labelled and owned by the Job, which is their group; 2 run at a time (parallelism 2, completions 8)."""
    job = obj("batch/v1", "Job", "train", {"parallelism": 2, "completions": 8, "template": template()})
    status, (section,) = explain(capsys, tmp_path, job)
    assert status == 0 and section["allowed"] is True
    assert (section["namespace"], section["name"]) == ("ml-train", "train-<generated>")
    assert section["workload"] == {"kind": "Job", "name": "train", "template": "spec.template", "role": "", "pods": 2,
                                   "owner": "Job/train"}  # fmt: skip
    assert section["group"]["name"] == "Job/train" == owner(section)
    assert labels(section)["batch.kubernetes.io/job-name"] == "train"
    assert section["patchedPod"]["metadata"]["namespace"] == "ml-train"
    indexed = obj("batch/v1", "Job", "train", {"completionMode": "Indexed", "template": template()})
    assert explain(capsys, tmp_path, indexed)[1][0]["name"] == "train-0-<generated>"


def test_a_cronjobs_pods_are_those_of_the_job_of_one_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cron = obj(
        "batch/v1", "CronJob", "nightly", {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template()}}}
    )
    _, (section,) = explain(capsys, tmp_path, cron)
    assert section["workload"]["template"] == "spec.jobTemplate.spec.template"
    job = owner(section)
    assert job.startswith("Job/nightly-") and job.removeprefix("Job/nightly-").isdigit()
    assert section["group"]["name"] == job
    assert "stands in" in section["note"]


def test_a_deployments_pods_are_its_replicasets(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A Deployment's Pods belong to its ReplicaSet `<deployment>-<pod-template-hash>`, labelled with the
    hash: the group is the ReplicaSet, as in the cluster (the hash itself is a stand-in, and said so)."""
    deployment = obj("apps/v1", "Deployment", "web", {"replicas": 3, "template": template()})
    _, (section,) = explain(capsys, tmp_path, deployment)
    replica_set = owner(section)
    assert replica_set == f"ReplicaSet/web-{labels(section)['pod-template-hash']}" == section["group"]["name"]
    assert section["workload"]["pods"] == 3 and "pod-template-hash" in section["note"]
    _, (again,) = explain(capsys, tmp_path, deployment)
    assert owner(again) == replica_set  # the same template, the same stand-in


@pytest.mark.parametrize(
    "kind, name, pod_name",
    [("ReplicaSet", "web-5d8f", "web-5d8f-<generated>"), ("StatefulSet", "db", "db-0")],
)
def test_replica_sets_and_stateful_sets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str, name: str, pod_name: str
) -> None:
    """Owned by the ReplicaSet (Pods `<name>-<random>`) or the StatefulSet (Pods `<name>-<ordinal>`)."""
    _, (section,) = explain(capsys, tmp_path, obj("apps/v1", kind, name, {"replicas": 2, "template": template()}))
    assert (section["name"], owner(section), section["group"]["name"]) == (pod_name, f"{kind}/{name}", f"{kind}/{name}")
    assert section["workload"]["pods"] == 2


def test_a_daemonsets_pods_are_not_decided_here(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The DaemonSet controller binds each Pod to its node and gpupool does not patch them: the section
    says so instead of placing a Pod that will never be placed (exit status 0)."""
    ds = obj("apps/v1", "DaemonSet", "dcgm", {"template": template()})
    status, (section,) = explain(capsys, tmp_path, ds)
    assert status == 0
    assert (section["allowed"], section["outcome"], section["patchedPod"]) == (None, "undecided", None)
    assert "DaemonSet controller" in section["message"]


def test_a_jobsets_replicated_jobs_are_one_group(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A JobSet: one section per replicated job, Pods owned by the child Job `<jobset>-<name>-<index>` and
    in the group JobSet/<name> through the label its controller puts on them."""
    jobset = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "llama", {
        "replicatedJobs": [
            {"name": "driver", "template": {"spec": {"template": template()}}},
            {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 4, "completions": 4,
                                                                      "template": template()}}},
        ]
    })  # fmt: skip
    _, sections = explain(capsys, tmp_path, jobset)
    assert [s["workload"]["template"] for s in sections] == [
        "spec.replicatedJobs[0].template.spec.template",
        "spec.replicatedJobs[1].template.spec.template",
    ]
    assert [(s["workload"]["role"], s["workload"]["pods"], owner(s)) for s in sections] == [
        ("driver", 1, "Job/llama-driver-0"),
        ("workers", 8, "Job/llama-workers-0"),
    ]
    assert {s["group"]["name"] for s in sections} == {"JobSet/llama"}
    assert labels(sections[1])["jobset.sigs.k8s.io/replicatedjob-name"] == "workers"
    # JobSet's Jobs are Indexed unless they say otherwise: Pods `<job>-<index>-<random>`
    assert sections[1]["name"] == "llama-workers-0-0-<generated>"
    assert labels(sections[1])["batch.kubernetes.io/job-completion-index"] == "0"


def test_a_pytorchjob_joins_its_group_already_in_the_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The demo cluster runs the master of the PyTorchJob llama-7b-sft on the A100 pool. Explaining the
    PyTorchJob itself gives its Worker the training operator's name, label and owner, so its group is
    KubeflowJob/llama-7b-sft with that Pod: it goes to the A100 pool, as the example worker Pod
    (examples/pods/group-pytorchjob-worker.yaml, made by the operator) does."""
    job = obj("kubeflow.org/v1", "PyTorchJob", "llama-7b-sft", {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": template({"gpupool.io/gpu-count": "4"})},
        "Worker": {"replicas": 3, "template": template({"gpupool.io/gpu-count": "2"})},
    }})  # fmt: skip
    _, (master, worker) = explain(capsys, tmp_path, job)
    assert (master["name"], worker["name"]) == ("llama-7b-sft-master-0", "llama-7b-sft-worker-0")
    assert (master["workload"]["role"], worker["workload"]["role"], worker["workload"]["pods"]) == (
        "Master",
        "Worker",
        3,
    )
    assert owner(worker) == "PyTorchJob/llama-7b-sft"
    assert labels(worker)["training.kubeflow.org/replica-type"] == "worker"
    example = main(["explain", str(REPO / "examples" / "pods" / "group-pytorchjob-worker.yaml"), "--inventory",
                    INVENTORY, "--policy", POLICY, "-o", "json"])  # fmt: skip
    assert example == 0
    as_the_operator_made_it = json.loads(capsys.readouterr().out)
    assert worker["group"] == as_the_operator_made_it["group"]
    assert worker["group"]["pool"] == "nvidia/high/NVIDIA-A100-SXM4-40GB"
    assert worker["pool"]["product"] == "NVIDIA-A100-SXM4-40GB"
    assert worker["pool"] == as_the_operator_made_it["pool"]


@pytest.mark.parametrize(
    "kind, field, types",
    [("TFJob", "tfReplicaSpecs", ("Chief", "PS", "Worker")), ("XGBoostJob", "xgbReplicaSpecs", ("Master", "Worker"))],
)
def test_other_training_operator_jobs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str, field: str, types: tuple[str, ...]
) -> None:
    job = obj("kubeflow.org/v1", kind, "exp", {field: {t: {"replicas": 1, "template": template()} for t in types}})
    _, sections = explain(capsys, tmp_path, job)
    assert [s["name"] for s in sections] == [f"exp-{t.lower()}-0" for t in types]
    assert {s["group"]["name"] for s in sections} == {"KubeflowJob/exp"}
    assert {owner(s) for s in sections} == {f"{kind}/exp"}


def test_an_mpijob_v2beta1_has_a_launcher_job_and_worker_pods(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """mpi-operator runs the launcher as the Job `<mpijob>-launcher` and the workers as Pods of the MPIJob;
    both carry training.kubeflow.org/job-name, so both are the MPIJob's group."""
    job = obj("kubeflow.org/v2beta1", "MPIJob", "allreduce", {"mpiReplicaSpecs": {
        "Launcher": {"replicas": 1, "template": template({})},
        "Worker": {"replicas": 4, "template": template()},
    }})  # fmt: skip
    _, (launcher, worker) = explain(capsys, tmp_path, job)
    assert launcher["workload"]["owner"] == "Job/allreduce-launcher" and launcher["outcome"] == "unchanged"
    assert (worker["name"], owner(worker), worker["workload"]["pods"]) == ("allreduce-worker-0", "MPIJob/allreduce", 4)
    assert worker["group"]["name"] == "KubeflowJob/allreduce"


def test_a_leaderworkerset_has_a_leader_and_a_worker_template(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """LeaderWorkerSet: the leaders are Pods `<lws>-<group>` of the StatefulSet `<lws>`, the workers Pods
    `<lws>-<group>-<index>` of the StatefulSet `<lws>-<group>`; the label makes them one group."""
    lws = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "vllm", {"replicas": 2, "leaderWorkerTemplate": {
        "size": 4, "leaderTemplate": template(), "workerTemplate": template({"gpupool.io/gpu-count": "2"}),
    }})  # fmt: skip
    _, (leader, worker) = explain(capsys, tmp_path, lws)
    assert [(s["name"], owner(s), s["workload"]["pods"]) for s in (leader, worker)] == [
        ("vllm-0", "StatefulSet/vllm", 2),
        ("vllm-0-1", "StatefulSet/vllm-0", 6),
    ]
    assert leader["group"]["name"] == worker["group"]["name"] == "LeaderWorkerSet/vllm"
    without_leader = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "vllm", {
        "leaderWorkerTemplate": {"size": 2, "workerTemplate": template()}
    })  # fmt: skip
    _, (leader, worker) = explain(capsys, tmp_path, without_leader)
    assert (
        leader["workload"]["template"] == worker["workload"]["template"] == "spec.leaderWorkerTemplate.workerTemplate"
    )


def test_a_rayclusters_head_and_worker_groups(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cluster = obj("ray.io/v1", "RayCluster", "rc", {
        "headGroupSpec": {"template": template({})},
        "workerGroupSpecs": [{"groupName": "gpus", "replicas": 3, "minReplicas": 1, "template": template()}],
    })  # fmt: skip
    _, (head, workers) = explain(capsys, tmp_path, cluster)
    assert (head["name"], workers["name"]) == ("rc-head-<generated>", "rc-gpus-worker-<generated>")
    assert (workers["workload"]["role"], workers["workload"]["pods"], owner(workers)) == ("gpus", 3, "RayCluster/rc")
    assert workers["group"]["name"] == "RayCluster/rc"
    assert labels(workers)["ray.io/node-type"] == "worker"
    job = obj("ray.io/v1", "RayJob", "tune", {"rayClusterSpec": cluster["spec"]})
    _, (_, workers) = explain(capsys, tmp_path, job)
    assert workers["group"]["name"].startswith("RayCluster/tune-") and "stands in" in workers["note"]


# --- files, Lists, namespaces, kinds not known ------------------------------------------------------------


def test_a_list_and_several_documents(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`kubectl get -o yaml` of several objects is a List: each item is read, in order, with the
    documents after it."""
    items = [
        obj("batch/v1", "Job", "a", {"template": template()}),
        obj("apps/v1", "StatefulSet", "b", {"template": template()}),
    ]
    pod = yaml.safe_load((REPO / "examples" / "pods" / "class-medium.yaml").read_text())
    status, sections = explain(capsys, tmp_path, {"apiVersion": "v1", "kind": "List", "items": items}, pod)
    assert status == 0
    assert [s["name"] for s in sections] == ["a-<generated>", "b-0", "resnet50-train"]
    assert [s["workload"] and s["workload"]["kind"] for s in sections] == ["Job", "StatefulSet", None]


def test_the_text_has_one_section_per_template(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "jobset.yaml"
    path.write_text(yaml.safe_dump(obj("jobset.x-k8s.io/v1alpha2", "JobSet", "llama", {"replicatedJobs": [
        {"name": "driver", "template": {"spec": {"template": template({})}}},
        {"name": "workers", "replicas": 2, "template": {"spec": {"template": template()}}},
    ]})))  # fmt: skip
    assert main(["explain", str(path), "--inventory", INVENTORY, "--policy", POLICY]) == 0
    out = capsys.readouterr().out
    sections = out.split("\n\n")
    assert len(sections) == 2
    assert sections[0].startswith(
        "JobSet ml-train/llama: driver (spec.replicatedJobs[0].template.spec.template), 1 Pod, "
        "owned by Job/llama-driver-0\nPod ml-train/llama-driver-0-0-<generated>\nDecision: allowed unchanged"
    )
    assert sections[1].startswith(
        "JobSet ml-train/llama: workers (spec.replicatedJobs[1].template.spec.template), 2 Pods"
    )
    assert "Group: JobSet/llama: no Pod placed yet" in sections[1]


def test_a_workload_is_in_its_own_namespace_and_n_is_kubectls(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A workload's Pods are created in its namespace (the template's own metadata has none); one without
    a namespace is in -n's; one of another namespace than -n's is refused, unless --as-namespace."""
    job = obj("batch/v1", "Job", "train", {"template": template()}, namespace=None)
    _, (section,) = explain(capsys, tmp_path, job, args=("-n", "team-a"))
    assert section["namespace"] == section["patchedPod"]["metadata"]["namespace"] == "team-a"
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(obj("batch/v1", "Job", "train", {"template": template()}, namespace="students")))
    status = main(["explain", str(path), "--inventory", INVENTORY, "--policy", POLICY, "-n", "team-a"])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert "the namespace from the provided object 'students' (Job train) does not match the namespace 'team-a'" in err
    status = main(
        ["explain", str(path), "--inventory", INVENTORY, "--policy", POLICY, "--as-namespace", "team-a", "-o", "json"]
    )
    assert json.loads(capsys.readouterr().out)["patchedPod"]["metadata"]["namespace"] == "team-a"


def test_a_kind_not_known_is_explained_from_its_template_with_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Any object with a Pod template: explained as owned by the object, and the note says the labels
    its controller adds are not known."""
    custom = obj("example.com/v1", "Trainer", "t1", {"runner": {"template": template()}})
    _, (section,) = explain(capsys, tmp_path, custom)
    assert (section["workload"]["template"], owner(section)) == ("spec.runner.template", "Trainer/t1")
    assert "not one gpupool knows" in section["note"]


@pytest.mark.parametrize(
    "manifest, words",
    [
        ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}},
         ("kind 'Service' is not Pod and has no Pod template", "JobSet", "PyTorchJob", "LeaderWorkerSet")),
        (obj("batch/v1", "Job", "j", {"template": "nope"}), ("Job j", "spec.template", "expected a mapping")),
        (obj("batch/v1", "Job", "j", {"parallelism": -1, "template": template()}), ("spec.parallelism", "-1")),
        (obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js", {"replicatedJobs": [{"template": {}}]}),
         ("spec.replicatedJobs[0]", "name")),
        (obj("kubeflow.org/v1", "PyTorchJob", "p", {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}),
         ("spec.pytorchReplicaSpecs.Worker", "template")),
    ],
    ids=["service", "template-not-a-mapping", "negative-parallelism", "replicated-job-without-name", "no-template"],
)  # fmt: skip
def test_a_manifest_without_a_usable_template_is_refused_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, manifest: dict[str, Any], words: tuple[str, ...]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["explain", str(path), "--inventory", INVENTORY]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith(f"gpupool explain: error: {path}: ")
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"


def test_every_workload_kind_is_documented() -> None:
    """docs/operations.md lists each kind explain knows."""
    text = (REPO / "docs" / "operations.md").read_text("utf-8")
    missing = [kind for _, kind in KINDS if f"`{kind}`" not in text]
    assert not missing, f"not in docs/operations.md: {missing}"


def test_a_job_of_several_pods_says_how_many_of_them_fit_now(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A Job of 4 workers x 2 GPUs on the demo inventory, where the T4s have 3 GPUs free and at most 2 on
    one node: its Pods admitted in turn, as the Job controller creates them, 1 fits now and the other 3
    would wait on the T4 pool. The text says so below the decision; JSON carries the same as data."""
    annotations = {**GPU, "gpupool.io/gpu-count": "2"}
    job = obj("batch/v1", "Job", "train", {"parallelism": 4, "template": template(annotations)})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), "utf-8")
    assert main(["explain", str(path), "--inventory", INVENTORY, "--policy", POLICY]) == 0
    lines = capsys.readouterr().out.splitlines()
    t4 = "nvidia/medium/Tesla-T4"
    assert lines[4] == (
        f"Pods: 1 of the 4 fits now (1 on {t4}); the other 3 would be placed on pool {t4} and wait there for room"
    )
    _, [section] = explain(capsys, tmp_path, job)
    assert section["pods"] == {"pods": 4, "of": 4, "fitNow": 1, "pools": {t4: 1},
                               "rest": {"outcome": "mutated", "reason": None, "pool": t4,
                                        "message": section["pods"]["rest"]["message"]}}  # fmt: skip


def test_a_job_whose_pods_all_fit_and_a_single_pod_say_nothing_more(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Two Pods of 1 GPU fit on the T4s: `both fit now`; a Job of one Pod has no `Pods:` line (its
    decision is the Pod's), nor `pods` in JSON."""
    two = obj("batch/v1", "Job", "two", {"parallelism": 2, "template": template()})
    one = obj("batch/v1", "Job", "one", {"parallelism": 1, "template": template()})
    _, sections = explain(capsys, tmp_path, two, one)
    assert sections[0]["pods"]["fitNow"] == 2 and sections[0]["pods"]["rest"] is None
    assert sections[1]["pods"] is None
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(two), "utf-8")
    assert main(["explain", str(path), "--inventory", INVENTORY, "--policy", POLICY]) == 0
    assert "Pods: both fit now (2 on nvidia/medium/Tesla-T4)" in capsys.readouterr().out.splitlines()
