"""The Pods a manifest will create: a Pod is itself; a workload's Pod templates are the Pods its controller
makes of them, with the names, labels and controller owner that controller gives them, so that gpupool
decides them (their workload group included: webhook.domain.groups) as it will in the cluster.

Each kind is one function in `KINDS`, found by API group and kind. The shapes and labels are the
controllers' own: the Job controller (`batch.kubernetes.io/job-name`, Pods named `<job>-<random>`), the
Deployment's ReplicaSet (`pod-template-hash`), the StatefulSet's ordinals, JobSet's child Jobs
`<jobset>-<replicatedJob>-<index>` and `jobset.sigs.k8s.io/*` labels, the Kubeflow training operator's
`<job>-<replica type>-<index>` Pods owned by the job (mpi-operator's v2beta1 MPIJob: a launcher Job and
worker Pods), LeaderWorkerSet's leader StatefulSet `<lws>` and worker StatefulSets `<lws>-<group>`, and
KubeRay's head and worker groups (`ray.io/cluster`). A name the controller makes up at run time (a
ReplicaSet's template hash, a CronJob run's Job, the RayCluster of a RayJob) has a stand-in of the same
form, and the template says so in its `note`.

An object of another kind with a Pod template (a mapping under a `template` key with `spec.containers`)
is explained with the object as the Pods' owner, and a note that its controller's labels are not known.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from webhook.commands.manifest import PodTemplate, Workload, field_list, field_map, owner_of, standin
from webhook.domain.errors import ConfigError

MAX_TEMPLATES = 1000  # Pod templates in one run of explain: far more than any file a person writes
MAX_SEARCH_DEPTH = 12  # how deep a template is looked for in an object of an unknown kind


def pod_templates(obj: Mapping[str, Any], source: str) -> list[PodTemplate]:
    """The Pod templates of one object, each as the Pod it will create. ConfigError naming the object
    and the field for one with no template or a malformed one."""
    kind = obj.get("kind")
    api_version = obj.get("apiVersion")
    if kind is None:  # a bare `metadata:` + `spec:` manifest has always been read as a Pod
        kind, api_version = "Pod", "v1"
    if not isinstance(kind, str) or not isinstance(api_version, (str, type(None))):
        raise ConfigError(f"{source}: kind and apiVersion must be strings")
    meta = field_map(obj, "metadata", f"{source}: {kind}", "")
    name = meta["name"] if isinstance(meta.get("name"), str) else ""
    where = f"{source}: {kind} {name or '<unnamed>'}"
    group = (api_version or "v1").rpartition("/")[0] if "/" in (api_version or "") else ""
    w = Workload(obj, kind, api_version or "", name, meta, where)
    # Without an apiVersion (a hand-written manifest), the kind alone says which it is.
    build = KINDS.get((group, kind)) if api_version else next((b for (_, k), b in KINDS.items() if k == kind), None)
    if build is not None:
        return build(w)
    templates = list(_generic(w))
    if not templates:
        raise ConfigError(
            f"{where}: kind {kind!r} is not Pod and has no Pod template; accepted: a Pod, a workload "
            f"({', '.join(sorted({k for _, k in KINDS if k != 'Pod'}))}), any object with a Pod template, "
            "and Lists of them"
        )
    return templates


# --- one function per kind ------------------------------------------------------------------------------


Build = Callable[[Workload], list[PodTemplate]]


def _pod(w: Workload) -> list[PodTemplate]:
    return [PodTemplate(kind="Pod", name=w.name, namespace=w.namespace, path="", pod=dict(w.obj), owner=owner_of(w))]


def _pod_template(w: Workload) -> list[PodTemplate]:
    template, path = w.template(w.obj, "")
    return [w.made(template, path, owner=None, generate_name=f"{w.name}-")]


def _job_pods(  # noqa: PLR0913 (a JobSpec's fields by keyword, for Jobs and CronJobs alike)
    w: Workload,
    spec: Mapping[str, Any],
    path: str,
    job: str,
    labels: Mapping[str, str] | None = None,
    *,
    jobs: int = 1,
    indexed: bool = False,
    **extra: Any,
) -> PodTemplate:
    """The Pods of `jobs` batch/v1 Jobs like `job`, of the JobSpec `spec` at `path`: `<job>-<random>`
    (`<job>-<index>-<random>` with completionMode Indexed, or `indexed`), labelled and owned by the Job,
    `parallelism` (capped by `completions`) at a time."""
    template, tpath = w.template(spec, path)
    parallelism = w.count(spec, "parallelism", path) or 0
    completions = w.count(spec, "completions", path, default=None)
    at_once = parallelism if completions is None else min(parallelism, completions)
    job_labels = {"batch.kubernetes.io/job-name": job, "job-name": job, **(labels or {})}
    if indexed or spec.get("completionMode") == "Indexed":
        job_labels["batch.kubernetes.io/job-completion-index"] = "0"
        extra["annotations"] = {**extra.get("annotations", {}), "batch.kubernetes.io/job-completion-index": "0"}
        generate_name = f"{job}-0-"
    else:
        generate_name = f"{job}-"
    return w.made(
        template,
        tpath,
        owner=("batch/v1", "Job", job),
        generate_name=generate_name,
        labels=job_labels,
        pods=jobs * at_once,
        **extra,
    )


def _job(w: Workload) -> list[PodTemplate]:
    return [_job_pods(w, w.spec(), "spec", w.name)]


def _cronjob(w: Workload) -> list[PodTemplate]:
    job_template = field_map(w.spec(), "jobTemplate", w.where, "spec", required=True)
    spec = field_map(job_template, "spec", w.where, "spec.jobTemplate", required=True)
    # The CronJob controller names each run's Job `<cronjob>-<scheduled time in minutes>`: now, here.
    job = f"{w.name}-{int(time.time()) // 60}"
    return [_job_pods(w, spec, "spec.jobTemplate.spec", job, note=f"Job {job} stands in for the Job of one run")]


def _replicated(
    w: Workload, owner_kind: str, owner_name: str, labels: Mapping[str, str] | None = None, note: str = ""
) -> PodTemplate:
    template, path = w.template(w.spec(), "spec")
    return w.made(
        template,
        path,
        owner=("apps/v1" if owner_kind != "ReplicationController" else "v1", owner_kind, owner_name),
        generate_name=f"{owner_name}-",
        labels=labels,
        pods=w.count(w.spec(), "replicas", "spec"),
        note=note,
    )


def _deployment(w: Workload) -> list[PodTemplate]:
    template = w.spec().get("template")
    # The ReplicaSet is `<deployment>-<pod-template-hash>`, a hash kube-controller-manager computes.
    hash_ = standin(template, 10)
    replica_set = f"{w.name}-{hash_}"
    note = f"ReplicaSet {replica_set}: its pod-template-hash is kube-controller-manager's, a stand-in here"
    return [_replicated(w, "ReplicaSet", replica_set, {"pod-template-hash": hash_}, note)]


def _replica_set(w: Workload) -> list[PodTemplate]:
    return [_replicated(w, "ReplicaSet", w.name)]


def _replication_controller(w: Workload) -> list[PodTemplate]:
    return [_replicated(w, "ReplicationController", w.name)]


def _stateful_set(w: Workload) -> list[PodTemplate]:
    template, path = w.template(w.spec(), "spec")
    pod = f"{w.name}-0"  # ordinal 0 (spec.ordinals.start moves it; the group is the StatefulSet either way)
    labels = {"statefulset.kubernetes.io/pod-name": pod, "apps.kubernetes.io/pod-index": "0"}
    return [
        w.made(template, path, owner=("apps/v1", "StatefulSet", w.name), name=pod, labels=labels,
               pods=w.count(w.spec(), "replicas", "spec"))
    ]  # fmt: skip


def _daemon_set(w: Workload) -> list[PodTemplate]:
    template, path = w.template(w.spec(), "spec")
    note = (
        "the DaemonSet controller binds one Pod to each node; gpupool does not patch them and checks each "
        "against its node's pool when it is created"
    )
    return [
        w.made(template, path, owner=("apps/v1", "DaemonSet", w.name), generate_name=f"{w.name}-", pods=None,
               note=note, decided=False)
    ]  # fmt: skip


def _jobset(w: Workload) -> list[PodTemplate]:
    jobs = field_list(w.spec(), "replicatedJobs", w.where, "spec")
    templates = []
    for i, rjob in enumerate(jobs):
        path = f"spec.replicatedJobs[{i}]"
        if not isinstance(rjob, dict) or not isinstance(rjob.get("name"), str):
            raise ConfigError(f"{w.where}: {path}: expected a replicated job with a name")
        replicas = w.count(rjob, "replicas", path) or 0
        job_template = field_map(rjob, "template", w.where, path, required=True)
        spec = field_map(job_template, "spec", w.where, f"{path}.template", required=True)
        job = f"{w.name}-{rjob['name']}-0"  # the JobSet controller's child Job name, of index 0
        labels = {
            "jobset.sigs.k8s.io/jobset-name": w.name,
            "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
            "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
            "jobset.sigs.k8s.io/job-index": "0",
        }
        templates.append(
            _job_pods(
                w,
                spec,
                f"{path}.template.spec",
                job,
                labels,
                jobs=replicas,
                indexed=spec.get("completionMode") != "NonIndexed",  # JobSet's webhook defaults it to Indexed
                annotations=labels,
                role=rjob["name"],
            )
        )
    return templates


def _kubeflow(field_name: str) -> Build:
    """The training operator's jobs (PyTorchJob, TFJob...): `<field_name>.<ReplicaType>.template`, each
    Pod `<job>-<replica type>-<index>` owned by the job."""

    def build(w: Workload) -> list[PodTemplate]:
        if w.kind == "MPIJob" and w.api_version == "kubeflow.org/v2beta1":
            return _mpi_v2(w)
        specs = field_map(w.spec(), field_name, w.where, "spec", required=True)
        templates = []
        for replica_type, rspec in specs.items():
            path = f"spec.{field_name}.{replica_type}"
            if not isinstance(rspec, dict):
                raise ConfigError(f"{w.where}: {path}: expected a replica spec (a mapping)")
            template, tpath = w.template(rspec, path)
            rtype = str(replica_type).lower()
            labels = {
                "training.kubeflow.org/job-name": w.name,
                "training.kubeflow.org/operator-name": f"{w.kind.lower()}-controller",
                "training.kubeflow.org/replica-type": rtype,
                "training.kubeflow.org/replica-index": "0",
            }
            if rtype in ("master", "chief", "launcher"):
                labels["training.kubeflow.org/job-role"] = "master"
            templates.append(
                w.made(template, tpath, owner=w.ref, name=f"{w.name}-{rtype}-0", labels=labels, role=str(replica_type),
                       pods=w.count(rspec, "replicas", path))
            )  # fmt: skip
        return templates

    return build


def _mpi_v2(w: Workload) -> list[PodTemplate]:
    """mpi-operator's MPIJob (kubeflow.org/v2beta1): the launcher runs as the Job `<job>-launcher`, the
    workers are Pods `<job>-worker-<index>` of the MPIJob."""
    specs = field_map(w.spec(), "mpiReplicaSpecs", w.where, "spec", required=True)
    templates = []
    for replica_type, role in (("Launcher", "launcher"), ("Worker", "worker")):
        rspec = specs.get(replica_type)
        if rspec is None:
            continue
        path = f"spec.mpiReplicaSpecs.{replica_type}"
        if not isinstance(rspec, dict):
            raise ConfigError(f"{w.where}: {path}: expected a replica spec (a mapping)")
        template, tpath = w.template(rspec, path)
        labels = {
            "training.kubeflow.org/job-name": w.name,
            "training.kubeflow.org/job-role": role,
            "training.kubeflow.org/operator-name": "mpi-operator",
        }
        if role == "launcher":
            job = f"{w.name}-launcher"
            made = w.made(
                template,
                tpath,
                owner=("batch/v1", "Job", job),
                generate_name=f"{job}-",
                labels={**labels, "batch.kubernetes.io/job-name": job, "job-name": job},
                role=replica_type,
            )
        else:
            made = w.made(
                template,
                tpath,
                owner=w.ref,
                name=f"{w.name}-worker-0",
                labels={**labels, "training.kubeflow.org/replica-index": "0"},
                role=replica_type,
                pods=w.count(rspec, "replicas", path),
            )
        templates.append(made)  # fmt: skip
    return templates


def _leader_worker_set(w: Workload) -> list[PodTemplate]:
    lwt = field_map(w.spec(), "leaderWorkerTemplate", w.where, "spec", required=True)
    path = "spec.leaderWorkerTemplate"
    groups = w.count(w.spec(), "replicas", "spec")
    size = w.count(lwt, "size", path)
    worker, worker_path = w.template(lwt, path, "workerTemplate")
    leader, leader_path = (w.template(lwt, path, "leaderTemplate") if lwt.get("leaderTemplate") is not None
                           else (worker, worker_path))  # fmt: skip
    labels = {"leaderworkerset.sigs.k8s.io/name": w.name, "leaderworkerset.sigs.k8s.io/group-index": "0"}
    # The leader StatefulSet `<lws>` makes the leaders `<lws>-<group>`; each leader's worker StatefulSet,
    # named after it, makes `<lws>-<group>-<index>` from index 1.
    templates = [
        w.made(leader, leader_path, owner=("apps/v1", "StatefulSet", w.name), name=f"{w.name}-0", role="leader",
               labels={**labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"}, pods=groups)
    ]  # fmt: skip
    if size is None or size > 1:
        workers = None if size is None or groups is None else groups * (size - 1)
        templates.append(
            w.made(worker, worker_path, owner=("apps/v1", "StatefulSet", f"{w.name}-0"), name=f"{w.name}-0-1",
                   role="worker", labels={**labels, "leaderworkerset.sigs.k8s.io/worker-index": "1"}, pods=workers)
        )  # fmt: skip
    return templates


def _ray_groups(w: Workload, spec: Mapping[str, Any], path: str, cluster: str, note: str = "") -> list[PodTemplate]:
    """KubeRay's Pods of the RayCluster `cluster` with the spec `spec` (at `path`): the head, then each
    worker group, labelled `ray.io/cluster` and owned by the RayCluster."""
    owner = ("ray.io/v1", "RayCluster", cluster)
    head_spec = field_map(spec, "headGroupSpec", w.where, path, required=True)
    head, head_path = w.template(head_spec, f"{path}.headGroupSpec")
    ray = {"ray.io/cluster": cluster, "ray.io/is-ray-node": "yes"}
    templates = [
        w.made(head, head_path, owner=owner, generate_name=f"{cluster}-head-", role="head", note=note,
               labels={**ray, "ray.io/node-type": "head", "ray.io/group": "headgroup"})
    ]  # fmt: skip
    for i, group in enumerate(field_list(spec, "workerGroupSpecs", w.where, path)):
        gpath = f"{path}.workerGroupSpecs[{i}]"
        if not isinstance(group, dict) or not isinstance(group.get("groupName"), str):
            raise ConfigError(f"{w.where}: {gpath}: expected a worker group with a groupName")
        template, tpath = w.template(group, gpath)
        replicas = w.count(group, "replicas", gpath, default=None)
        if replicas is None:
            replicas = w.count(group, "minReplicas", gpath, default=None)
        hosts = w.count(group, "numOfHosts", gpath)
        name = group["groupName"]
        templates.append(
            w.made(template, tpath, owner=owner, generate_name=f"{cluster}-{name}-worker-", role=name, note=note,
                   labels={**ray, "ray.io/node-type": "worker", "ray.io/group": name},
                   pods=None if replicas is None or hosts is None else replicas * hosts)
        )  # fmt: skip
    return templates


def _ray_cluster(w: Workload) -> list[PodTemplate]:
    return _ray_groups(w, w.spec(), "spec", w.name)


def _ray_owned(field_name: str) -> Build:
    """A RayJob's or RayService's RayCluster, named `<name>-<random>` by KubeRay."""

    def build(w: Workload) -> list[PodTemplate]:
        spec = field_map(w.spec(), field_name, w.where, "spec", required=True)
        cluster = f"{w.name}-{standin(spec, 5)}"
        return _ray_groups(w, spec, f"spec.{field_name}", cluster, f"RayCluster {cluster} stands in for KubeRay's")

    return build


def _generic(w: Workload) -> Iterator[PodTemplate]:
    """Pod templates anywhere in an object of a kind not in KINDS, explained as owned by the object."""
    note = (
        f"kind {w.kind} is not one gpupool knows: its Pods are explained as owned by {w.kind}/{w.name}, "
        "without the labels its controller gives them"
    )
    count = 0

    def walk(value: Any, path: str, depth: int) -> Iterator[PodTemplate]:
        nonlocal count
        if depth > MAX_SEARCH_DEPTH or count > MAX_TEMPLATES:
            return
        if isinstance(value, dict):
            for key, child in value.items():
                child_path = f"{path}.{key}" if path else str(key)
                if key == "template" and _looks_like_pod_template(child):
                    count += 1
                    yield w.made(child, child_path, owner=w.ref, generate_name=f"{w.name}-", pods=None, note=note)
                else:
                    yield from walk(child, child_path, depth + 1)
        elif isinstance(value, list):
            for i, child in enumerate(value):
                yield from walk(child, f"{path}[{i}]", depth + 1)

    yield from walk({k: v for k, v in w.obj.items() if k not in ("metadata", "status")}, "", 0)


def _looks_like_pod_template(value: Any) -> bool:
    spec = value.get("spec") if isinstance(value, dict) else None
    return isinstance(spec, dict) and isinstance(spec.get("containers"), list)


KINDS: dict[tuple[str, str], Build] = {
    ("", "Pod"): _pod,
    ("", "PodTemplate"): _pod_template,
    ("", "ReplicationController"): _replication_controller,
    ("batch", "Job"): _job,
    ("batch", "CronJob"): _cronjob,
    ("apps", "Deployment"): _deployment,
    ("apps", "ReplicaSet"): _replica_set,
    ("apps", "StatefulSet"): _stateful_set,
    ("apps", "DaemonSet"): _daemon_set,
    ("jobset.x-k8s.io", "JobSet"): _jobset,
    ("kubeflow.org", "PyTorchJob"): _kubeflow("pytorchReplicaSpecs"),
    ("kubeflow.org", "TFJob"): _kubeflow("tfReplicaSpecs"),
    ("kubeflow.org", "MPIJob"): _kubeflow("mpiReplicaSpecs"),
    ("kubeflow.org", "XGBoostJob"): _kubeflow("xgbReplicaSpecs"),
    ("kubeflow.org", "PaddleJob"): _kubeflow("paddleReplicaSpecs"),
    ("kubeflow.org", "JAXJob"): _kubeflow("jaxReplicaSpecs"),
    ("kubeflow.org", "MXJob"): _kubeflow("mxReplicaSpecs"),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): _leader_worker_set,
    ("ray.io", "RayCluster"): _ray_cluster,
    ("ray.io", "RayJob"): _ray_owned("rayClusterSpec"),
    ("ray.io", "RayService"): _ray_owned("rayClusterConfig"),
}
