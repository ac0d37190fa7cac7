"""Synthetic clusters for benchmarks and scale tests: realistic Node, Pod and ResourceQuota objects.

Shapes follow what a real cluster returns: GPU nodes carry GPU Feature Discovery labels and
`nvidia.com/gpu` capacity, Pods have the fields kubelet and the scheduler fill in (about 1.5 KB of
JSON each), GPU Pods fit their node's capacity, and quotas' `status.used` adds up the Pods in their
namespace. With `partitioned`, that share of the GPU nodes is partitioned as GFD labels it: A100 and
H100 nodes in MIG (single or mixed strategy, alike), T4 and L4 nodes time-sliced (and some A100 and
H100 nodes too); their Pods request the node's devices. The output depends only on the arguments (one
seeded random generator, fixed clock); without `partitioned` it is what it always was.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class GpuModel:
    product: str  # nvidia.com/gpu.product as GFD writes it
    memory_mib: int
    family: str
    compute: tuple[int, int]
    gpus: tuple[int, ...]  # GPUs per node, one picked per node
    gpu_class: str  # the value an admin would put in gpu.accelerator/class
    share: float  # of the GPU nodes
    short: str  # for node names


# MIG profiles by model: (single strategy's profile, instances per GPU, MiB), (mixed: a larger profile).
MIG_PROFILES = {
    "NVIDIA-A100-SXM4-40GB": (("1g.5gb", 7, 4864), ("3g.20gb", 2, 20096)),
    "NVIDIA-H100-80GB-HBM3": (("1g.10gb", 7, 9856), ("3g.40gb", 2, 40192)),
}
REPLICAS = 4  # replicas per time-sliced GPU

GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("Tesla-T4", 15360, "turing", (7, 5), (4,), "medium", 0.30, "t4"),
    GpuModel("NVIDIA-L4", 23034, "ada-lovelace", (8, 9), (4, 8), "medium", 0.30, "l4"),
    GpuModel("NVIDIA-A100-SXM4-40GB", 40960, "ampere", (8, 0), (8,), "high", 0.25, "a100"),
    GpuModel("NVIDIA-H100-80GB-HBM3", 81559, "hopper", (9, 0), (8,), "high", 0.15, "h100"),
)
_DRIVERS = ("535.104.05", "535.161.08", "550.54.15", "550.90.07")
_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
_CLOCK = 1_767_225_600  # 2026-01-01T00:00:00Z: creation times count back from here
_MAX_PODS_PER_NODE = 110
_STAMP_STEP = 947  # seconds between table timestamps: 8192 of them span 90 days


def namespaces() -> list[str]:
    """The 50 namespaces of a synthetic cluster."""
    system = ["kube-system", "monitoring", "default", "ingress-nginx", "gpu-operator"]
    teams = [f"team-{chr(ord('a') + i)}" for i in range(26)]
    return system + teams + [f"ml-{i:02d}" for i in range(19)]


def pod_spec_defaults() -> Obj:
    """What kube-apiserver fills in on every Pod's spec (defaulting and the DefaultTolerationSeconds
    admission plugin), as a new dict."""
    return {
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            for t in ("not-ready", "unreachable")
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }


def synthetic_cluster(nodes: int = 5000, pods: int = 150_000, seed: int = 0, partitioned: float = 0.0) -> list[Obj]:
    """Nodes, then Pods, then ResourceQuotas, as a list (see `iter_synthetic_cluster` to stream).
    `partitioned`: the share of GPU nodes in MIG or time-sliced."""
    return list(iter_synthetic_cluster(nodes=nodes, pods=pods, seed=seed, partitioned=partitioned))


def iter_synthetic_cluster(
    nodes: int = 5000, pods: int = 150_000, seed: int = 0, partitioned: float = 0.0
) -> Iterator[Obj]:
    """The same objects one at a time, so loading 150,000 Pods never holds them all as dicts."""
    rng = random.Random(seed)
    gen = _Generator(rng, random.Random(f"workloads-{seed}"), partitioned)
    node_list = [gen.node(i) for i in range(nodes)]
    yield from node_list
    gen.place_pods(node_list)
    for i in range(pods):
        yield gen.pod(i)
    yield from gen.quotas()


class _Generator:
    def __init__(self, rng: random.Random, workload_rng: random.Random, partitioned: float = 0.0) -> None:
        self.rng = rng
        # Workloads are drawn from their own stream, so the rest of a seed's cluster (nodes, placements)
        # is what it was before GPU Pods had workloads.
        self.workload_rng = workload_rng
        self.partitioned = partitioned
        self.namespaces = namespaces()
        # name, model, devices, resource, pool product (the GPUs' own product for whole GPUs)
        self.gpu_nodes: list[tuple[str, GpuModel, int, str, str]] = []
        self.all_nodes: list[str] = []
        self.pods_on: Counter[str] = Counter()
        self.gpus_used: Counter[str] = Counter()  # GPUs requested per namespace, by live Pods
        self.live_pods: Counter[str] = Counter()  # Pods per namespace that count against a quota
        self.free: dict[tuple[str, str], int] = {}  # (node, resource) -> free devices
        self.stamps = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_CLOCK - k * _STAMP_STEP)) for k in range(8192)]
        self.owner_uids: dict[str, str] = {}
        self.cpu_targets: list[str] = []
        self.apps = {ns: [self._name(rng.choice(_APPS)) for _ in range(rng.randint(3, 12))] for ns in self.namespaces}

    def _uid(self, rng: random.Random | None = None) -> str:
        h = f"{(rng or self.rng).getrandbits(128):032x}"
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"

    def _time(self, max_age_s: int) -> str:
        # Formatting 300,000 timestamps costs more than the rest of a Pod: pick from a table.
        return self.stamps[self.rng.randrange(min(len(self.stamps), max_age_s // _STAMP_STEP + 1))]

    def _name(self, base: str) -> str:
        return f"{base}-{self.rng.getrandbits(40):010x}"[:40]

    # -- nodes ----------------------------------------------------------------------------------

    def node(self, i: int) -> Obj:
        rng = self.rng
        model = None if rng.random() < 0.10 else rng.choices(GPU_MODELS, [m.share for m in GPU_MODELS])[0]
        name = f"cpu-{i:05d}" if model is None else f"gpu-{model.short}-{i:05d}"
        zone = rng.choice(_ZONES)
        labels = {
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "m6i.8xlarge" if model is None else "p4d.24xlarge",
            "topology.kubernetes.io/region": "us-east-1",
            "topology.kubernetes.io/zone": zone,
        }
        capacity = {"cpu": "32", "memory": "131072000Ki", "pods": str(_MAX_PODS_PER_NODE), "ephemeral-storage": "500Gi"}
        taints: list[Obj] = []
        if model is not None:
            gpus = rng.choice(model.gpus)
            driver = rng.choice(_DRIVERS)
            major, minor, rev = driver.split(".")
            labels |= {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": model.product,
                "nvidia.com/gpu.memory": str(model.memory_mib),
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.family": model.family,
                "nvidia.com/gpu.compute.major": str(model.compute[0]),
                "nvidia.com/gpu.compute.minor": str(model.compute[1]),
                "nvidia.com/cuda.driver-version.full": driver,
                "nvidia.com/cuda.driver-version.major": major,
                "nvidia.com/cuda.driver-version.minor": minor,
                "nvidia.com/cuda.driver-version.revision": rev,
            }
            if rng.random() < 0.25:
                labels["gpu.accelerator/class"] = model.gpu_class
            if model.gpu_class == "high":
                taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
            capacity["nvidia.com/gpu"] = str(gpus)
            devices = [("nvidia.com/gpu", gpus, model.product)]
            if self.partitioned and rng.random() < self.partitioned:
                devices = self._partition(model, gpus, labels, capacity)
        ready = rng.random() >= 0.01
        cordoned = rng.random() < 0.01
        spec: Obj = {"podCIDR": f"10.{64 + i // 256}.{i % 256}.0/24", "providerID": f"aws:///{zone}/i-{i:017x}"}
        if taints:
            spec["taints"] = taints
        if cordoned:
            spec["unschedulable"] = True
        if ready and not cordoned:
            self.all_nodes.append(name)
            if model is not None:
                self.gpu_nodes.extend((name, model, n, resource, product) for resource, n, product in devices)
        beat = self._time(60)
        conditions = [
            {
                "type": t,
                "status": "False",
                "reason": f"KubeletHas{r}",
                "lastHeartbeatTime": beat,
                "lastTransitionTime": "2025-12-01T00:00:00Z",
            }
            for t, r in (
                ("MemoryPressure", "SufficientMemory"),
                ("DiskPressure", "NoDiskPressure"),
                ("PIDPressure", "SufficientPID"),
            )
        ]
        conditions.append(
            {
                "type": "Ready",
                "status": "True" if ready else "Unknown",
                "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                "lastHeartbeatTime": beat,
                "lastTransitionTime": "2025-12-01T00:00:00Z",
            }
        )
        return {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": self._uid(),
                "creationTimestamp": self._time(86400 * 90),
                "labels": labels,
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                },
            },
            "spec": spec,
            "status": {
                "capacity": capacity,
                "allocatable": capacity | {"cpu": "31850m", "memory": "127000000Ki"},
                "conditions": conditions,
                "addresses": [
                    {"type": "InternalIP", "address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "kubeletVersion": "v1.31.2",
                    "kubeProxyVersion": "v1.31.2",
                    "containerRuntimeVersion": "containerd://1.7.22",
                    "kernelVersion": "6.1.112",
                    "osImage": "Ubuntu 22.04.5 LTS",
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "machineID": f"{i:032x}",
                    "systemUUID": self._uid(),
                    "bootID": self._uid(),
                },
            },
        }

    def _partition(self, model: GpuModel, gpus: int, labels: Obj, capacity: Obj) -> list[tuple[str, int, str]]:
        """Turn a GPU node's labels and capacity into a MIG (single or mixed strategy) or time-sliced one,
        as GPU Feature Discovery and the device plugin show them; returns its (resource, devices, product)."""
        profiles = MIG_PROFILES.get(model.product)
        kind = self.rng.choice(("single", "mixed", "shared")) if profiles else "shared"
        if kind == "shared" or profiles is None:
            product = f"{model.product}-SHARED"
            labels |= {
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.replicas": str(REPLICAS),
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
            }
            capacity["nvidia.com/gpu"] = str(gpus * REPLICAS)
            return [("nvidia.com/gpu", gpus * REPLICAS, product)]
        (small, per_gpu, memory), (large, large_per_gpu, large_memory) = profiles
        if kind == "single":
            product = f"{model.product}-MIG-{small}"
            labels |= {
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus * per_gpu),
                "nvidia.com/gpu.memory": str(memory),
                "nvidia.com/mig.strategy": "single",
                "nvidia.com/mig.config.state": "success",
            }
            capacity["nvidia.com/gpu"] = str(gpus * per_gpu)
            return [("nvidia.com/gpu", gpus * per_gpu, product)]
        whole, instances = gpus // 2, (gpus - gpus // 2) * large_per_gpu
        resource, product = f"nvidia.com/mig-{large}", f"{model.product}-MIG-{large}"
        labels |= {
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config.state": "success",
            f"{resource}.count": str(instances),
            f"{resource}.memory": str(large_memory),
            f"{resource}.product": product,
            f"{resource}.replicas": "1",
        }
        capacity["nvidia.com/gpu"] = str(whole)
        capacity[resource] = str(instances)
        return [("nvidia.com/gpu", whole, model.product), (resource, instances, product)]

    def place_pods(self, node_list: list[Obj]) -> None:
        """Where Pods may go: GPU Pods on usable GPU nodes, the others on usable untainted nodes."""
        self.free = {(name, resource): n for name, _, n, resource, _ in self.gpu_nodes}
        usable = set(self.all_nodes)
        untainted = (n["metadata"]["name"] for n in node_list if not n["spec"].get("taints"))
        self.cpu_targets = [name for name in untainted if name in usable]

    # -- pods -----------------------------------------------------------------------------------

    def pod(self, i: int) -> Obj:
        rng = self.rng
        ns = self.namespaces[i % len(self.namespaces)] if i < len(self.namespaces) else rng.choice(self.namespaces)
        app = rng.choice(self.apps[ns])
        roll = rng.random()
        phase = "Running" if roll < 0.90 else "Succeeded" if roll < 0.97 else "Pending" if roll < 0.99 else "Failed"
        gpus = rng.choice((1, 1, 1, 1, 1, 1, 1, 2, 2, 4, 8)) if rng.random() < 0.05 else 0
        node, model, resource, product = self._place(gpus, phase)
        annotations: Obj = {}
        if gpus and model is None and rng.random() < 0.5:
            model = rng.choice(GPU_MODELS)  # pinned by gpupool at admission, not yet scheduled
            product = model.product
        if gpus and model is not None:
            own = f"/{resource}" if resource != "nvidia.com/gpu" else ""
            annotations["gpupool.io/pool"] = f"nvidia/{model.gpu_class}/{product}{own}"
        name = f"{app}-{rng.getrandbits(25):07x}"[:60] + f"-{i % 100000:05d}"
        resources: Obj = {
            "requests": {
                "cpu": rng.choice(("100m", "250m", "500m", "1")),
                "memory": rng.choice(("128Mi", "256Mi", "512Mi", "1Gi")),
            },
            "limits": {"memory": "1Gi"},
        }
        spec: Obj = {
            "containers": [
                {
                    "name": app.rsplit("-", 1)[0],
                    "image": f"registry.example.com/{ns}/{app.rsplit('-', 1)[0]}:v1.{rng.randrange(40)}.0",
                    "resources": resources,
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always" if phase in ("Running", "Pending") else "Never",
            **pod_spec_defaults(),
        }
        if gpus:
            resources["limits"][resource] = str(gpus)
            resources["requests"][resource] = str(gpus)
            spec["tolerations"].append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
            if model is not None:
                label = "nvidia.com/gpu.product" if resource == "nvidia.com/gpu" else f"{resource}.product"
                spec["nodeSelector"] = {label: product}
            if phase in ("Running", "Pending") and resource == "nvidia.com/gpu":
                self.gpus_used[ns] += gpus
        if phase in ("Running", "Pending"):
            self.live_pods[ns] += 1
        if node is not None:
            spec["nodeName"] = node
        started = self._time(86400 * 30)
        container = spec["containers"][0]["name"]
        labels: Obj = {"app": container, "pod-template-hash": app.rsplit("-", 1)[1]}
        api_version, kind, owner_name = "apps/v1", "ReplicaSet", app
        owner = self.owner_uids.get(app) or self.owner_uids.setdefault(app, self._uid())
        if gpus:  # GPU Pods belong to workloads: Jobs, training jobs, JobSets, sweeps, Deployments
            api_version, kind, owner_name = self._workload(app, labels, annotations)
            if owner_name != app:
                key = f"{ns}/{owner_name}"
                owner = self.owner_uids.get(key) or self.owner_uids.setdefault(key, self._uid(self.workload_rng))
        metadata: Obj = {
            "name": name,
            "namespace": ns,
            "uid": self._uid(),
            "creationTimestamp": started,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": api_version,
                    "kind": kind,
                    "name": owner_name,
                    "uid": owner,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if annotations:
            metadata["annotations"] = annotations
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": metadata,
            "spec": spec,
            "status": self._status(phase, container, node is not None, started, i),
        }

    def _workload(self, app: str, labels: Obj, annotations: Obj) -> tuple[str, str, str]:
        """The controller of a GPU Pod, and the workload label or gpupool.io/group its kind carries: six
        workloads of each kind per namespace, so in a large cluster each has several Pods (a workload group
        gpupool keeps together)."""
        base, rng = "llm", self.workload_rng
        roll, n = rng.random(), rng.randrange(6)
        if roll < 0.35:
            return "batch/v1", "Job", f"{base}-train-{n}"
        if roll < 0.55:
            labels["training.kubeflow.org/job-name"] = f"{base}-ft-{n}"
            return "kubeflow.org/v1", "PyTorchJob", f"{base}-ft-{n}"
        if roll < 0.65:
            labels["jobset.sigs.k8s.io/jobset-name"] = f"{base}-js-{n}"
            return "batch/v1", "Job", f"{base}-js-{n}-workers-0"
        if roll < 0.75:
            annotations["gpupool.io/group"] = f"{base}-sweep-{n}"
            return "batch/v1", "Job", f"{base}-sweep-{n}-{rng.randrange(4)}"
        return "apps/v1", "ReplicaSet", app

    def _place(self, gpus: int, phase: str) -> tuple[str | None, GpuModel | None, str, str]:
        """A node for a Pod, and the resource and device product it takes there: GPU Pods only where
        enough devices are free (Running ones hold them)."""
        whole = "nvidia.com/gpu"
        if phase == "Pending":
            return None, None, whole, ""
        if gpus:
            for _ in range(20):
                name, model, _, resource, product = (
                    self.rng.choice(self.gpu_nodes) if self.gpu_nodes else ("", GPU_MODELS[0], 0, whole, "")
                )
                if name and self.free[(name, resource)] >= gpus and self.pods_on[name] < _MAX_PODS_PER_NODE:
                    if phase == "Running":
                        self.free[(name, resource)] -= gpus
                    self.pods_on[name] += 1
                    return name, model, resource, product
            return None, None, whole, ""  # nowhere to fit: stays Pending like an unschedulable Pod
        for _ in range(20):
            name = self.rng.choice(self.cpu_targets) if self.cpu_targets else ""
            if name and self.pods_on[name] < _MAX_PODS_PER_NODE:
                self.pods_on[name] += 1
                return name, None, whole, ""
        return None, None, whole, ""

    def _status(self, phase: str, container: str, scheduled: bool, started: str, i: int) -> Obj:
        if not scheduled:
            return {
                "phase": "Pending",
                "qosClass": "Burstable",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "lastTransitionTime": started,
                        "message": "0/5000 nodes are available: insufficient nvidia.com/gpu.",
                    }
                ],
            }
        done = phase in ("Succeeded", "Failed")
        state: Obj = (
            {
                "terminated": {
                    "exitCode": 0 if phase == "Succeeded" else 1,
                    "reason": "Completed" if phase == "Succeeded" else "Error",
                    "startedAt": started,
                    "finishedAt": started,
                }
            }
            if done
            else {"running": {"startedAt": started}}
        )
        ready = "False" if done else "True"
        return {
            "phase": phase,
            "conditions": [
                {
                    "type": t,
                    "status": ready if t in ("Ready", "ContainersReady") else "True",
                    "lastTransitionTime": started,
                }
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            "podIP": f"10.{128 + i // 65536 % 64}.{i // 256 % 256}.{i % 256}",
            "startTime": started,
            "containerStatuses": [
                {
                    "name": container,
                    "state": state,
                    "ready": not done,
                    "restartCount": 0,
                    "image": "registry.example.com/app:v1",
                    "imageID": "registry.example.com/app@sha256:" + "0" * 64,
                    "containerID": f"containerd://{i:064x}",
                    "started": not done,
                }
            ],
            "qosClass": "Burstable",
        }

    # -- quotas ---------------------------------------------------------------------------------

    def quotas(self) -> Iterator[Obj]:
        teams = [ns for ns in self.namespaces if ns.startswith(("team-", "ml-"))]
        for n, ns in enumerate(teams[::4]):
            used = self.gpus_used[ns]
            # One quota in the unprefixed form Kubernetes stores but never enforces.
            resource = "nvidia.com/gpu" if n == 3 else "requests.nvidia.com/gpu"
            hard = {resource: str(max(8, used + self.rng.choice((0, 4, 16)))), "pods": "5000"}
            yield {
                "kind": "ResourceQuota",
                "apiVersion": "v1",
                "metadata": {
                    "name": "gpu-quota",
                    "namespace": ns,
                    "uid": self._uid(),
                    "creationTimestamp": self._time(86400 * 60),
                },
                "spec": {"hard": hard},
                # The quota controller counts only the `requests.` form of an extended resource.
                "status": {
                    "hard": hard,
                    "used": {
                        resource: str(used if resource.startswith("requests.") else 0),
                        "pods": str(self.live_pods[ns]),
                    },
                },
            }


_APPS = ("api", "worker", "frontend", "trainer", "inference", "redis", "postgres", "etl", "notebook", "batch")
