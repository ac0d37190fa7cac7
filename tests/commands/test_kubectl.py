"""`kubectl gpupool`: the plugin applies kubectl's conventions (-n, -A, --context, --kubeconfig) and runs
gpupool's explain, inventory and quota. In-process on the demo inventory for the conventions, and
through the real kubectl binary (skipped where it is not installed) against the API simulator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.builders import gpu_node, pod, quota
from webhook.commands.kubectl import main
from webhook.testing.kubesim import KubeSim

REPO = Path(__file__).resolve().parents[2]
INVENTORY = str(REPO / "examples" / "cluster.yaml")
POLICY = str(REPO / "examples" / "policy.yaml")
DEMO = ["--inventory", INVENTORY, "--policy", POLICY]


def kubeconfig(path: Path, server: str = "http://127.0.0.1:1", token: str = "t") -> Path:
    """Two contexts on one cluster: `a` (current, namespace team-a) and `b` (namespace team-b)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [
            {"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
            {"name": "b", "context": {"cluster": "c", "user": "u", "namespace": "team-b"}},
            {"name": "plain", "context": {"cluster": "c", "user": "u"}},
        ],
        "current-context": "a",
    }
    path.write_bytes(orjson.dumps(config))
    return path


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
    assert run(capsys, "quota", *DEMO, "--kubeconfig", kc, "--context", "plain")[1] == (
        "No GPU quotas in namespace default.\n"
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
    assert "the namespace from the provided object 'students' does not match the namespace 'team-a'" in err
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


def test_without_a_policy_file_the_plugin_says_it_is_not_the_installs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The cluster comes from the context, the policy does not: a user who forgets --policy is told that
    the answer follows gpupool's built-in default, which may not be what the webhook runs with."""
    kc = str(kubeconfig(tmp_path / "config"))
    status, out, err = run(capsys, "inventory", "--inventory", INVENTORY, "--kubeconfig", kc)
    assert status == 0 and "Tesla-T4" in out
    assert err == (
        "kubectl gpupool inventory: note: with gpupool's built-in default policy; pass --policy FILE for the one "
        "your install runs (the policy.yaml of its gpupool-policy-* ConfigMap)\n"
    )
    assert run(capsys, "inventory", *DEMO, "--kubeconfig", kc)[2] == ""
