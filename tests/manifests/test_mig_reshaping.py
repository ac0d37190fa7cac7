"""The opt-in RBAC for MIG re-cuts (manifests/components/mig-reshaping), rendered with `kubectl kustomize`
over an overlay from a kustomization of one's own (with `namespace:`, as an admin writes it): its objects
are valid, it adds only them, and every API request the queue's leader makes while it re-cuts a node and
releases the Pods that waited, recorded from the real API client against the simulator and its
mig-manager, is allowed by it (tests/manifests/rbac.py, Kubernetes' RBAC rules), while the base alone lets
the leader neither label a node nor read mig-parted's config.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import pytest
import yaml

from tests.builders import eventually, policy
from tests.manifests.rbac import Request, allowed, request_of
from tests.manifests.rendered import (
    KUBECTL,
    MANIFESTS,
    NAMESPACE,
    SCHEMA_VERSIONS,
    SERVICE,
    Obj,
    kustomize,
    make_dry_run,
    run_render,
)
from tests.mig.configs import OPERATOR_DEFAULT
from tests.queue.fakes import Inventory, Leading
from tests.queue.migfleet import a100, config_map, sync, waiting_pod
from webhook.pools.index import PoolIndex
from webhook.queue.reshape import Reshaper
from webhook.queue.runner import Runner
from webhook.queue.waiting import PODS, Waiting
from webhook.sources.writes import ConfigMapText, EventRecorder, NodeLabeler, PodReleaser
from webhook.testing import KubeSim

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)

COMPONENT = MANIFESTS / "components" / "mig-reshaping"
OVERLAY = MANIFESTS / "overlays" / "cert-manager"
POLICY = """
namespaces:
  q: {placement: queue}
migReshaping:
  idleSeconds: 60
"""


def render(directory: Path, *, component: bool, extra: str = "") -> list[Obj]:
    """The cert-manager overlay from a kustomization in `directory` that sets `namespace:`, with the
    component or without it, and `extra` lines (patches) after it."""
    lines = ["apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization", f"namespace: {NAMESPACE}"]
    lines += ["resources:", f"  - {os.path.relpath(OVERLAY, directory)}"]
    if component:
        lines += ["components:", f"  - {os.path.relpath(COMPONENT, directory)}"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text("\n".join(lines) + "\n" + extra)
    return [d for d in yaml.safe_load_all(kustomize(directory)) if d]


@pytest.fixture(scope="module")
def renderings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    top = tmp_path_factory.mktemp("mig-reshaping")
    return {"base": render(top / "base", component=False), "component": render(top / "component", component=True)}


class Recording(kubernetes.client.ApiClient):  # type: ignore[misc]
    """An API client that notes every request it sends, as RBAC sees it."""

    def __init__(self, configuration: Any) -> None:
        super().__init__(configuration)
        self.requests: list[Request] = []

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        self.requests.append(request_of(method, url))
        return super().call_api(method, url, *args, **kwargs)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Request]]:
    """Every request of the leader's API client while it re-cuts an idle opted-in node for four queued
    35 GiB Pods, follows the change to done, tells the node and the Pods, and releases them."""
    clock = [1_800_000_000.0]  # the leader's wall clock: moved past idleSeconds once, then still
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.add(config_map())
        sim.add(a100("gpu-idle"))
        for k in range(4):
            sim.add(waiting_pod(f"big-{k}"))
        sim.mig_manager(OPERATOR_DEFAULT, delay=0.2)
        configuration = kubernetes.client.Configuration()
        path = sim.write_kubeconfig(tmp_path_factory.mktemp("kubeconfig") / "kubeconfig")
        kubernetes.config.load_kube_config(config_file=str(path), client_configuration=configuration)
        client = Recording(configuration)
        events = EventRecorder(client, "leader-1").start()
        pol = policy(POLICY)
        index, waiting = PoolIndex(pol), Waiting(pol)
        reshaper = Reshaper(
            NodeLabeler(client), ConfigMapText(client), events, _Metrics(), wall=lambda: clock[0], plan_seconds=0.0
        )
        runner = Runner(Inventory(index), waiting, Leading(), PodReleaser(client), events=events, reshaper=reshaper)  # type: ignore[arg-type]

        def pass_() -> None:
            sync(sim, index, pol)
            for obj in sim.objects("Pod"):
                waiting.apply(PODS, "MODIFIED", obj)
            runner.run_pass()

        def released() -> bool:
            pass_()
            pods = sim.objects("Pod", "q")
            return len(pods) == 4 and not any(p["spec"].get("schedulingGates") for p in pods)

        clock[0] += 61
        try:
            eventually(released, what="the four Pods released into the re-cut node")
            eventually(lambda: len(sim.events("q")) >= 4 and bool(sim.events("default")), what="the Events")
        finally:
            events.stop()
        yield client.requests


class _Metrics:
    def mig_reshaped(self, outcome: str) -> None:
        return None


def granted(objects: list[Obj], request: Request) -> bool:
    return allowed(objects, NAMESPACE, SERVICE, request)


class TestComponent:
    @pytest.mark.parametrize("version", SCHEMA_VERSIONS)
    def test_every_object_validates(self, renderings: dict[str, list[Obj]], version: str) -> None:
        """With the component, every Kubernetes object validates strictly against the OpenAPI schema."""
        for obj in renderings["component"]:
            if not obj["apiVersion"].startswith("cert-manager.io/"):
                kubernetes_validate.validate(obj, version, strict=True)

    def test_it_adds_one_cluster_role_and_its_binding_and_changes_nothing_else(
        self, renderings: dict[str, list[Obj]]
    ) -> None:
        """The component adds RBAC only, cluster-scoped (so a kustomization's `namespace:` cannot move it),
        bound to the ServiceAccount the Deployment runs as; the install is otherwise the same."""
        added = [o for o in renderings["component"] if o not in renderings["base"]]
        assert all(o in renderings["component"] for o in renderings["base"])
        assert sorted(o["kind"] for o in added) == ["ClusterRole", "ClusterRoleBinding"]
        binding = next(o for o in added if o["kind"] == "ClusterRoleBinding")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE, "namespace": NAMESPACE}]
        (deployment,) = [o for o in renderings["component"] if o["kind"] == "Deployment"]
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == SERVICE

    def test_only_the_named_config_map_may_be_read(self, renderings: dict[str, list[Obj]]) -> None:
        """The ConfigMap grant names mig-parted's default config (get, and the replicas' list and watch
        that select it by name), and reads nothing else: no other ConfigMap, no list or watch of all."""
        objects = renderings["component"]
        for verb in ("get", "list", "watch"):
            assert granted(objects, Request(verb, "", "configmaps", "gpu-operator", "default-mig-parted-config"))
        for other in (
            Request("get", "", "configmaps", "gpu-operator", "other"),
            Request("list", "", "configmaps", "gpu-operator", None),
            Request("watch", "", "configmaps", None, None),
            Request("update", "", "nodes", None, "gpu-idle"),
            Request("delete", "", "nodes", None, "gpu-idle"),
            Request("patch", "", "nodes/status", None, "gpu-idle"),
        ):
            assert not granted(objects, other), other

    def test_the_documented_patch_grants_another_config_map(self, tmp_path: Path) -> None:
        """The component's comment shows how to name another mig-parted ConfigMap; rendered as written,
        it lets the leader read that one too."""
        text = (COMPONENT / "kustomization.yaml").read_text()
        comment = [line[1:] for line in text.splitlines() if line.startswith("#")]
        start = comment.index("   patches:")
        block = []
        for line in comment[start:]:
            if not line.startswith("   "):
                break
            block.append(line[3:])
        objects = render(tmp_path, component=True, extra="\n".join(block) + "\n")
        assert granted(objects, Request("get", "", "configmaps", "gpu-operator", "custom-mig-config"))
        assert granted(objects, Request("get", "", "configmaps", "gpu-operator", "default-mig-parted-config"))


class TestMakeManifests:
    def test_mig_reshaping_true_renders_the_component(self, renderings: dict[str, list[Obj]], tmp_path: Path) -> None:
        """`make manifests MIG_RESHAPING=true` (render.py --mig-reshaping) installs what the component
        adds to the overlay, and says so; without it, what the overlay alone installs."""
        for flag, expected in ((["--mig-reshaping"], "component"), ([], "base")):
            out = tmp_path / f"{expected}.yaml"
            done = run_render("--overlay", "cert-manager", *flag, "--certs-dir", tmp_path / "certs", "--out", out)
            assert done.returncode == 0, done.stderr
            assert ("may label MIG nodes" in done.stdout) == bool(flag)
            objects = [d for d in yaml.safe_load_all(out.read_text()) if d]
            assert objects == renderings[expected]

    def test_the_makefile_passes_it_on(self) -> None:
        assert "--mig-reshaping" in make_dry_run("manifests", "OVERLAY=cert-manager", "MIG_RESHAPING=true")
        assert "--mig-reshaping" not in make_dry_run("manifests", "OVERLAY=cert-manager")

    def test_make_undeploy_deletes_its_cluster_role_and_binding(self) -> None:
        """The namespace's deletion leaves cluster-scoped objects behind: undeploy names them."""
        assert "clusterrolebinding,clusterrole gpupool-webhook gpupool-mig-reshaping" in make_dry_run("undeploy")


@pytest.mark.slow
class TestWhatTheLeaderDoes:
    def test_every_request_of_a_re_cut_is_allowed_with_the_component(
        self, renderings: dict[str, list[Obj]], recorded: list[Request]
    ) -> None:
        """The re-cut reads mig-parted's config, reads and patches the node, posts Events and releases the
        Pods: every one of its requests is allowed with the component."""
        kinds = {(r.verb, r.resource) for r in recorded}
        assert {("get", "configmaps"), ("get", "nodes"), ("patch", "nodes"), ("create", "events")} <= kinds
        assert ("patch", "pods") in kinds
        refused = [str(r) for r in recorded if not granted(renderings["component"], r)]
        assert refused == []

    def test_the_base_alone_lets_the_leader_neither_label_a_node_nor_read_the_config(
        self, renderings: dict[str, list[Obj]], recorded: list[Request]
    ) -> None:
        """Without the component exactly the node's patch and the ConfigMap's get are refused: the base
        install never labels a node."""
        refused = {(r.verb, r.resource) for r in recorded if not granted(renderings["base"], r)}
        assert refused == {("patch", "nodes"), ("get", "configmaps")}
