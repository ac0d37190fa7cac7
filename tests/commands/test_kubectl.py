"""`kubectl gpupool`: the plugin applies kubectl's conventions (-n, -A, --context, --kubeconfig) and runs
gpupool's explain, inventory and quota, with the policy the installed webhook runs with. In-process on
the demo inventory for the conventions, against the API simulator for the installed policy, and through
the real kubectl binary (skipped where it is not installed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tests.builders import gpu_node, pod, quota
from tests.commands.install import installed
from tests.commands.kubeconfigs import kubeconfig
from webhook.commands.kubectl import main
from webhook.testing.kubesim import KubeSim

KUBECTL = shutil.which("kubectl")

REPO = Path(__file__).resolve().parents[2]
INVENTORY = str(REPO / "examples" / "cluster.yaml")
POLICY = str(REPO / "examples" / "policy.yaml")
DEMO = ["--inventory", INVENTORY, "--policy", POLICY]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def namespaces_listed(out: str) -> set[str]:
    return {line.split()[0] for line in out.splitlines()[1:]}


def test_quota_shows_the_contexts_namespace_or_every_one(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """As `kubectl get`: the current context's namespace, another context's with --context, the one
    -n names, or all of them with -A; a context without a namespace means `default`."""
    kc = str(kubeconfig(tmp_path / "kc"))
    assert namespaces_listed(run(capsys, "quota", *DEMO, "--kubeconfig", kc)[1]) == {"team-a"}
    assert namespaces_listed(run(capsys, "quota", *DEMO, "--kubeconfig", kc, "--context", "b")[1]) == {"team-b"}
    assert namespaces_listed(run(capsys, "quota", "-n", "team-b", *DEMO, "--kubeconfig", kc)[1]) == {"team-b"}
    assert namespaces_listed(run(capsys, "quota", *DEMO, "--kubeconfig", kc, "-A")[1]) == {"team-a", "team-b"}
    assert run(capsys, "quota", *DEMO, "--kubeconfig", kc, "--context", "plain")[1:] == (
        "",
        "No GPU quotas in namespace default.\n",
    )


def test_a_context_the_kubeconfig_does_not_have_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kc = str(kubeconfig(tmp_path / "kc"))
    status, out, err = run(capsys, "quota", *DEMO, "--kubeconfig", kc, "--context", "nope")
    assert (status, out) == (2, "")
    assert err == "kubectl gpupool quota: error: context 'nope' is not in the kubeconfig\n"


def test_explain_takes_the_pods_namespace_else_the_contexts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A Pod with no namespace is explained in the context's (team-a: default class medium); one with a
    namespace in its own; one whose namespace differs from -n is refused, as kubectl apply refuses it."""
    kc = str(kubeconfig(tmp_path / "kc"))
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "pods" / "students-default-class.yaml").read_text())
    own = tmp_path / "students.yaml"
    own.write_text(yaml.safe_dump(obj))
    del obj["metadata"]["namespace"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(obj))
    status, out, _ = run(capsys, "explain", str(bare), *DEMO, "--kubeconfig", kc, "-o", "json")
    assert status == 0 and json.loads(out)["pool"]["class"] == "medium"  # team-a's default class
    status, out, _ = run(capsys, "explain", str(own), *DEMO, "--kubeconfig", kc, "-o", "json")
    assert status == 0 and json.loads(out)["pool"]["class"] == "low"  # students' default class
    status, out, err = run(capsys, "explain", str(own), "-n", "team-a", *DEMO, "--kubeconfig", kc)
    assert (status, out) == (2, "")
    assert (
        "the namespace from the provided object 'students' (Pod homework-3) does not match the namespace 'team-a'"
        in err
    )
    assert run(capsys, "explain", str(own), "--namespace", "students", *DEMO, "--kubeconfig", kc)[0] == 0


def test_inventory_is_cluster_wide_and_help_names_kubectls_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """-n changes nothing for the pools, as for kubectl get nodes; --help lists the commands and flags."""
    assert run(capsys, "inventory", *DEMO, "-n", "team-a")[1] == run(capsys, "inventory", *DEMO)[1]
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(word in out for word in ("explain", "inventory", "quota", "--all-namespaces", "--context"))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH: the plugin is not run through it")
def test_kubectl_runs_the_plugin_against_the_contexts_cluster(tmp_path: Path) -> None:
    """`kubectl gpupool ...` finds kubectl-gpupool on PATH and reads the live cluster of the chosen
    context: the pools, and the quotas of the context's namespace, with gpupool's own count for the
    tutorial form."""
    plugin = Path(sys.executable).parent / "kubectl-gpupool"
    if not plugin.exists():
        pytest.skip("kubectl-gpupool is not installed in this environment (make install)")
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([
            gpu_node("t4-a", "Tesla-T4", 4),
            pod("p", "team-b", gpus=1, node="t4-a", phase="Running"),
            quota("tutorial", "team-b", {"nvidia.com/gpu": "4"}),
            quota("enforced", "team-a", {"requests.nvidia.com/gpu": "2"}, {"requests.nvidia.com/gpu": "0"}),
        ])  # fmt: skip
        token = json.loads(sim.write_kubeconfig(tmp_path / "sim").read_text())["users"][0]["user"]["token"]
        kc = kubeconfig(tmp_path / "kc", sim.url, token)
        env = {**os.environ, "PATH": f"{plugin.parent}{os.pathsep}{os.environ.get('PATH', '')}", "KUBECONFIG": str(kc)}

        def kubectl(*args: str) -> str:
            argv = ["kubectl", "gpupool", *args]
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
            assert proc.returncode == 0, proc.stderr
            return proc.stdout

        assert "Tesla-T4" in kubectl("inventory", "--context", "b")
        quotas = json.loads(kubectl("quota", "--context", "b", "-o", "json"))["quotas"]
        assert [(q["quota"], q["used"], q["hard"], q["enforcedBy"]) for q in quotas] == [
            ("tutorial", 1, 4, "gpupool only")
        ]
        assert [q["quota"] for q in json.loads(kubectl("quota", "-o", "json"))["quotas"]] == ["enforced"]
        assert sim.handler_errors == []


def test_with_a_snapshot_and_no_policy_file_the_plugin_says_it_uses_the_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A snapshot holds no policy: a user who forgets --policy is told that the answer follows gpupool's
    built-in default, which may not be what the webhook runs with."""
    kc = str(kubeconfig(tmp_path / "config"))
    status, out, err = run(capsys, "inventory", "--inventory", INVENTORY, "--kubeconfig", kc)
    assert status == 0 and "Tesla-T4" in out
    assert err.splitlines()[0] == (
        "kubectl gpupool inventory: note: with gpupool's built-in default policy (a snapshot holds none); "
        "pass --policy FILE"
    )
    assert "note:" not in run(capsys, "inventory", *DEMO, "--kubeconfig", kc)[2]


# --- the installed policy ---------------------------------------------------------------------------------


class Cluster(NamedTuple):
    sim: KubeSim
    kubeconfig: str  # its current context's namespace is team-a


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """The API simulator with team-a's quota, and a kubeconfig for it."""
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([gpu_node("t4-a", "Tesla-T4", 4), quota("enforced", "team-a", {"requests.nvidia.com/gpu": "2"})])
        token = json.loads(sim.write_kubeconfig(tmp_path / "sim").read_text())["users"][0]["user"]["token"]
        yield Cluster(sim, str(kubeconfig(tmp_path / "kc", sim.url, token)))
        assert sim.handler_errors == []


def quotas_listed(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines()[1:]]


def test_the_plugin_answers_with_the_policy_the_installed_webhook_runs_with(
    capsys: pytest.CaptureFixture[str], cluster: Cluster
) -> None:
    """Without --policy the plugin reads the webhook Deployment's policy volume and that ConfigMap's
    policy.yaml: team-a's classQuota and memoryQuota (the demo policy's) are listed, and stderr says which
    ConfigMap was used and that the Pods follow it. --policy FILE still wins, and says nothing."""
    for obj in installed():
        cluster.sim.serve_object(obj)
    status, out, err = run(capsys, "quota", "--kubeconfig", cluster.kubeconfig)
    assert status == 0
    assert quotas_listed(out) == ["classQuota", "classQuota", "enforced", "memoryQuota"]
    note, *warnings = err.splitlines()
    assert note == (
        "kubectl gpupool quota: note: with the installed policy: ConfigMap gpupool-system/gpupool-policy "
        "(key policy.yaml), which Deployment gpupool-system/gpupool-webhook follows: its Pods take up a change "
        "of it within about 2 minutes, without a restart"
    )
    # The demo policy places `now`: its classQuota and memoryQuota are not exact with two replicas.
    assert len(warnings) == 3 and all(w.startswith("Warning: quota team-a/") for w in warnings), warnings
    default = Path(cluster.kubeconfig).parent / "default-policy.yaml"
    default.write_text("{}\n")
    status, out, err = run(capsys, "quota", "--kubeconfig", cluster.kubeconfig, "--policy", str(default))
    assert (status, quotas_listed(out), err) == (0, ["enforced"], "")


def test_explain_follows_the_installed_policy_too(capsys: pytest.CaptureFixture[str], cluster: Cluster) -> None:
    """The demo policy lets students use no high class: with it installed, the A100 Pod is denied there,
    as the webhook would deny it; the built-in default would have placed it."""
    pod_file = str(REPO / "examples" / "pods" / "product-a100.yaml")
    cluster.sim.load([gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, gpu_class="high", memory_mib=40960)])
    status, out, _ = run(capsys, "explain", pod_file, "--as-namespace", "students", "--kubeconfig", cluster.kubeconfig)
    assert status == 0, out
    for obj in installed():
        cluster.sim.serve_object(obj)
    status, out, err = run(
        capsys, "explain", pod_file, "--as-namespace", "students", "--kubeconfig", cluster.kubeconfig
    )
    assert status == 1 and "DENIED" in out
    assert "with the installed policy: ConfigMap gpupool-system/gpupool-policy (key policy.yaml)" in err


@pytest.mark.parametrize(
    "fault, why",
    [
        ("none installed", "no Deployment gpupool-system/gpupool-webhook"),
        ("forbidden", "not allowed (403 Forbidden) to read Deployment gpupool-system/gpupool-webhook"),
        ("configmap gone", "no ConfigMap gpupool-system/gpupool-policy, which Deployment "
                           "gpupool-system/gpupool-webhook mounts"),
    ],
)  # fmt: skip
def test_without_the_installed_policy_the_default_is_used_and_the_reason_said(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, fault: str, why: str
) -> None:
    """No webhook installed, no right to read its Deployment, or its ConfigMap gone: the answer follows
    the built-in default, and the note says why and what to pass instead."""
    deployment, _ = installed()
    if fault != "none installed":
        cluster.sim.serve_object(deployment)
    if fault == "forbidden":
        cluster.sim.fail_next(1, 403, verb="get")
    status, out, err = run(capsys, "quota", "--kubeconfig", cluster.kubeconfig)
    assert (status, quotas_listed(out)) == (0, ["enforced"])
    assert err == (
        f"kubectl gpupool quota: note: with gpupool's built-in default policy: {why}; pass --policy FILE for the "
        "one your install runs\n"
    )


def test_another_install_of_the_webhook_is_named_with_webhook(
    capsys: pytest.CaptureFixture[str], cluster: Cluster
) -> None:
    """An install in another namespace or under another name: --webhook NAMESPACE/NAME finds it, and its
    ConfigMap whatever its name (here an older install's, with kustomize's hash suffix)."""
    for obj in installed("gpupool-policy-5c8m2k9g7t"):
        obj["metadata"]["namespace"] = "platform"
        cluster.sim.serve_object(obj)
    status, out, err = run(capsys, "quota", "--kubeconfig", cluster.kubeconfig, "--webhook", "platform/gpupool-webhook")
    assert (status, quotas_listed(out)) == (0, ["classQuota", "classQuota", "enforced", "memoryQuota"])
    assert "ConfigMap platform/gpupool-policy-5c8m2k9g7t" in err


def test_an_invalid_installed_policy_is_an_error_naming_the_configmap(
    capsys: pytest.CaptureFixture[str], cluster: Cluster
) -> None:
    """A policy the webhook itself would refuse is not silently replaced by the default."""
    deployment, configmap = installed()
    configmap["data"]["policy.yaml"] = "defaults:\n  fallbak: true\n"
    cluster.sim.serve_object(deployment)
    cluster.sim.serve_object(configmap)
    status, out, err = run(capsys, "quota", "--kubeconfig", cluster.kubeconfig)
    assert (status, out) == (2, "")
    assert "error: ConfigMap gpupool-system/gpupool-policy (key policy.yaml):" in err
    assert "fallbak" in err
    assert "the webhook refuses it too and keeps the policy it had" in err


def test_a_policy_mounted_by_sub_path_is_said_to_need_a_restart(
    capsys: pytest.CaptureFixture[str], cluster: Cluster
) -> None:
    """The kubelet never updates a file mounted by subPath, so the Pods do not follow the ConfigMap: the
    note says the policy applies once they restart, not within minutes."""
    deployment, configmap = installed()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policy")
    mount.update(mountPath="/etc/gpupool/policy/policy.yaml", subPath="policy.yaml")
    cluster.sim.serve_object(deployment)
    cluster.sim.serve_object(configmap)
    status, out, err = run(capsys, "quota", "--kubeconfig", cluster.kubeconfig)
    assert (status, quotas_listed(out)) == (0, ["classQuota", "classQuota", "enforced", "memoryQuota"])
    assert "which Deployment gpupool-system/gpupool-webhook mounts by subPath: its Pods see a change" in err


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH: the base is rendered with `kubectl kustomize`")
def test_the_policy_of_the_rendered_manifests_is_found(capsys: pytest.CaptureFixture[str], cluster: Cluster) -> None:
    """The Deployment and the ConfigMap exactly as `kubectl kustomize manifests/base` renders them (the
    ConfigMap under its fixed name, which the running Pods follow), the ConfigMap's policy replaced by the
    demo's."""
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(REPO / "manifests" / "base")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    objects = [o for o in yaml.safe_load_all(done.stdout) if o and o["kind"] in ("Deployment", "ConfigMap")]
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and "policy.yaml" in o.get("data", {})]
    assert configmap["metadata"]["name"] == "gpupool-policy"
    configmap["data"]["policy.yaml"] = Path(POLICY).read_text()
    for obj in objects:
        cluster.sim.serve_object(obj)
    status, out, err = run(capsys, "quota", "--kubeconfig", cluster.kubeconfig)
    assert (status, quotas_listed(out)) == (0, ["classQuota", "classQuota", "enforced", "memoryQuota"])
    assert "ConfigMap gpupool-system/gpupool-policy (key policy.yaml), which Deployment" in err
    assert "follows: its Pods take up a change" in err
