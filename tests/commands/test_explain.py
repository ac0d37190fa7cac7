"""`gpupool explain`: the decision, the reasons, the patch and the patched Pod for a Pod manifest.

Run through `webhook.commands.cli.main` (as the console script does) and, for the exit status and the absence
of tracebacks, as a real `python -m webhook` process. Exit status: 0 allowed, 1 denied, 2 for a bad
file or argument, with `gpupool explain: error:` and the file or field named. Workloads are in
test_workloads.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.commands.kubeconfigs import kubeconfig
from tests.commands.queued import A100, L4, write_snapshot
from webhook.commands.cli import main

REPO = Path(__file__).resolve().parents[2]
PODS = REPO / "examples" / "pods"
INVENTORY = str(REPO / "examples" / "cluster.yaml")
POLICY = str(REPO / "examples" / "policy.yaml")
PLACE_NOW = str(Path(__file__).resolve().parents[1] / "place_now.yaml")
ERROR_PREFIX = "gpupool explain: error:"
# What the text shows, each under its own key: the Pod, its workload, the decision, the reasons for it,
# the patch and the patched Pod.
JSON_KEYS = {
    "namespace", "name", "workload", "note", "allowed", "outcome", "code", "reason", "message", "warnings", "pool",
    "patch", "group", "queued", "queue", "pods", "poolsConsidered", "patchedPod",
}  # fmt: skip
DEFAULT_POLICY_NOTE = (
    "gpupool explain: note: with gpupool's built-in default policy (a snapshot holds none); pass --policy FILE\n"
)


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run `gpupool explain ARGS` in-process against the demo inventory: (exit status, stdout, stderr
    without the note that says which policy is used). Without --policy, the built-in default placing
    `now` (PLACE_NOW): these tests explain admission-time decisions; the queue's are in test_queue.py and
    below with a policy that queues."""
    argv = ["explain", *args]
    if "--inventory" not in args:
        argv += ["--inventory", INVENTORY]
    if "--policy" not in args:
        argv += ["--policy", PLACE_NOW]
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err.replace(DEFAULT_POLICY_NOTE, "")


def explain_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    status, out, err = explain(capsys, *args, "-o", "json")
    assert err == ""
    answer = json.loads(out)  # the whole of stdout is one JSON document
    assert isinstance(answer, dict)
    return status, answer


def load(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text("utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def patched_pod_section(text: str) -> dict[str, Any]:
    """The patched Pod printed at the end of the text output, parsed back."""
    assert "Patched Pod:\n" in text, text
    section = textwrap.dedent(text.split("Patched Pod:\n", 1)[1])
    loaded = yaml.safe_load(section)
    assert isinstance(loaded, dict)
    return loaded


# --- text output -------------------------------------------------------------------------------------------


def test_text_output_names_pool_reasons_patch_and_patched_pod(capsys: pytest.CaptureFixture[str]) -> None:
    """The text report says where the Pod goes, why each pool was taken or passed over, the patch, and
    the patched Pod (the original with the patch applied)."""
    pod_file = PODS / "class-medium.yaml"
    status, out, err = explain(capsys, str(pod_file))
    assert (status, err) == (0, "")
    assert "ml-train/resnet50-train" in out
    assert "nvidia/medium/Tesla-T4" in out
    for pool in (
        "nvidia/medium/NVIDIA-L4",
        "nvidia/high/NVIDIA-A100-SXM4-40GB",
        "nvidia/high/NVIDIA-H100-80GB-HBM3",
        "nvidia/low/NVIDIA-GeForce-RTX-3060",
        "nvidia/low/NVIDIA-GeForce-RTX-4090",
    ):
        assert pool in out, f"no reason given for {pool}"
    l4_line = next(line for line in out.splitlines() if "NVIDIA-L4" in line)
    assert "dedicated=inference" in l4_line, "the L4 is passed over for its taint, and the line says so"
    _, answer = explain_json(capsys, str(pod_file))
    for op in answer["patch"]:
        assert op["path"] in out
    expected = jsonpatch.apply_patch(load(pod_file), answer["patch"])
    assert patched_pod_section(out) == expected


def test_text_output_shows_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    """A fallback placement is reported with its warning."""
    status, out, _ = explain(capsys, str(PODS / "fallback.yaml"))
    assert status == 0
    assert "nvidia/high/NVIDIA-A100-SXM4-40GB" in out
    assert "fell back" in out or "fallback" in out.lower()


def test_text_output_for_a_denied_pod_gives_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """A denied Pod exits with status 1 and the text says why (the quota, used, requested and hard)."""
    status, out, _ = explain(capsys, str(PODS / "team-a-quota.yaml"), "--policy", POLICY)
    assert status == 1
    assert "gpu-quota" in out and "Patched Pod" not in out


def test_a_pod_a_resourcequota_denies_has_no_pool_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    """The T4s would take team-a's Pod but for its ResourceQuota: that pool's line says the quota denies
    it, and no pool is `chosen` for a Pod that goes nowhere (text and JSON alike)."""
    status, out, _ = explain(capsys, str(PODS / "team-a-quota.yaml"), "--policy", POLICY)
    assert status == 1
    considered = out.split("Pools considered:\n")[1].splitlines()
    assert considered[0] == (
        "  nvidia/medium/Tesla-T4: denied by quota: 16Gi as sold (15Gi reported) per GPU, 3 free, at most 2 on one node"
    )
    assert not [line for line in considered if ": chosen" in line]
    _, answer = explain_json(capsys, str(PODS / "team-a-quota.yaml"), "--policy", POLICY)
    assert answer["poolsConsidered"][0].startswith("nvidia/medium/Tesla-T4: denied by quota: ")
    assert not [line for line in answer["poolsConsidered"] if ": chosen" in line]


# --- JSON output -------------------------------------------------------------------------------------------


def test_json_output_is_one_object_with_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """`-o json` prints exactly one object: allowed, code, message, warnings, pool, patch; the pool
    names vendor, class, product, resource and the kind of device, and the patch applies to the Pod."""
    pod_file = PODS / "class-medium.yaml"
    status, answer = explain_json(capsys, str(pod_file))
    assert status == 0
    assert set(answer) == JSON_KEYS
    assert (answer["namespace"], answer["name"], answer["workload"]) == ("ml-train", "resnet50-train", None)
    assert answer["allowed"] is True and answer["code"] == 200 and answer["outcome"] == "mutated"
    assert isinstance(answer["message"], str) and answer["warnings"] == []
    assert answer["pool"] == {
        "vendor": "nvidia",
        "class": "medium",
        "product": "Tesla-T4",
        "resource": "nvidia.com/gpu",
        "device": "gpu",
        "constraints": "gpu.accelerator/class=medium, nvidia.com/gpu.product=Tesla-T4",
    }
    patched = jsonpatch.apply_patch(load(pod_file), answer["patch"])
    assert patched["metadata"]["annotations"]["gpupool.io/pool"] == "nvidia/medium/Tesla-T4"


def test_json_output_for_a_denied_pod(capsys: pytest.CaptureFixture[str]) -> None:
    """A denial: exit status 1, allowed false, a 4xx code, the message, pool null and an empty patch."""
    status, answer = explain_json(capsys, str(PODS / "team-a-quota.yaml"), "--policy", POLICY)
    assert status == 1
    assert set(answer) == JSON_KEYS
    assert answer["allowed"] is False and answer["code"] == 403
    assert (answer["outcome"], answer["reason"]) == ("denied", "quota")
    assert "gpu-quota" in answer["message"]
    assert answer["pool"] is None and answer["patch"] == [] and answer["patchedPod"] is None
    assert answer["queued"] is None and answer["queue"] is None


def test_json_output_for_a_bad_annotation_is_a_400(capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed annotation is a denial with code 400 (exit 1), not a usage error."""
    status, answer = explain_json(capsys, str(PODS / "bad-annotation.yaml"))
    assert status == 1
    assert answer["code"] == 400 and "gpupool.io/gpu-clas" in answer["message"]


def test_json_output_for_a_pod_that_is_not_gpupools_business(capsys: pytest.CaptureFixture[str]) -> None:
    """A CPU Pod is allowed unchanged: exit 0, pool null, no patch."""
    status, answer = explain_json(capsys, str(PODS / "plain-cpu.yaml"))
    assert status == 0
    assert answer["allowed"] is True and answer["pool"] is None and answer["patch"] == []


def test_json_output_carries_the_wait_warning(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Without fallback, the 4-GPU medium Pod is admitted to wait, and the warning is in `warnings`."""
    obj = load(PODS / "fallback.yaml")
    del obj["metadata"]["annotations"]["gpupool.io/fallback"]
    pod_file = tmp_path / "wait.yaml"
    pod_file.write_text(yaml.safe_dump(obj), "utf-8")
    status, answer = explain_json(capsys, str(pod_file))
    assert status == 0
    assert answer["pool"]["product"] == "Tesla-T4"
    assert answer["warnings"] and any("wait" in w for w in answer["warnings"])


def test_the_group_and_the_pool_its_pods_are_on_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    """A Pod of a workload: the text names its group and where its Pods are; `-o json` has them under
    `group`; a Pod of no group has `group: null`."""
    status, out, _ = explain(capsys, str(PODS / "group-pytorchjob-worker.yaml"))
    assert status == 0
    assert "Group: KubeflowJob/llama-7b-sft: 1 Pod on pool nvidia/high/NVIDIA-A100-SXM4-40GB" in out
    _, answer = explain_json(capsys, str(PODS / "group-pytorchjob-worker.yaml"))
    assert answer["group"] == {
        "name": "KubeflowJob/llama-7b-sft",
        "pool": "nvidia/high/NVIDIA-A100-SXM4-40GB",
        "pods": 1,
    }
    _, out, _ = explain(capsys, str(PODS / "group-size.yaml"))
    assert "Group: whisper-sweep: no Pod placed yet" in out
    assert explain_json(capsys, str(PODS / "class-medium.yaml"))[1]["group"] is None


def test_pod_in_json_form_is_read_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A Pod saved with `kubectl get pod -o json` gives the same answer as its YAML."""
    pod_file = tmp_path / "pod.json"
    pod_file.write_text(json.dumps(load(PODS / "class-medium.yaml")), "utf-8")
    assert explain_json(capsys, str(pod_file)) == explain_json(capsys, str(PODS / "class-medium.yaml"))


# --- inputs and options ------------------------------------------------------------------------------------


def test_dash_reads_the_pod_from_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`-` reads the manifest from standard input, with the same answer as the file."""
    from_file = explain_json(capsys, str(PODS / "class-medium.yaml"))
    monkeypatch.setattr(sys, "stdin", io.StringIO((PODS / "class-medium.yaml").read_text("utf-8")))
    assert explain_json(capsys, "-") == from_file


def test_json_and_yaml_carry_everything_the_text_shows(capsys: pytest.CaptureFixture[str]) -> None:
    """`-o json` has the lines of "Pools considered", the warnings, the group and the patched Pod exactly
    as the text shows them, and `-o yaml` is the same document."""
    pod_file = str(PODS / "group-pytorchjob-worker.yaml")
    _, text, _ = explain(capsys, pod_file)
    _, answer = explain_json(capsys, pod_file)
    considered = text.split("Pools considered:\n", 1)[1].split("Patch (RFC 6902):", 1)[0]
    assert answer["poolsConsidered"] == [line.strip() for line in considered.splitlines()]
    assert len(answer["poolsConsidered"]) > 3
    assert answer["patchedPod"] == patched_pod_section(text)
    assert f"Group: {answer['group']['name']}: 1 Pod on pool {answer['group']['pool']}" in text
    status, out, err = explain(capsys, pod_file, "-o", "yaml")
    assert (status, err) == (0, "")
    assert yaml.safe_load(out) == answer


def test_a_pod_of_another_namespace_than_n_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """-n is the namespace of the objects read, as for kubectl apply: the students Pod with -n team-a is
    refused (exit 2, nothing on stdout) with the two ways out named; with -n students it is explained."""
    pod_file = str(PODS / "students-default-class.yaml")
    status, out, err = explain(capsys, pod_file, "--policy", POLICY, "-n", "team-a")
    assert (status, out) == (2, "")
    assert err == (
        "gpupool explain: error: the namespace from the provided object 'students' (Pod homework-3) does not "
        "match the namespace 'team-a'; pass --namespace=students, or --as-namespace=team-a to explain it as if "
        "it were there\n"
    )
    status, answer = explain_json(capsys, pod_file, "--policy", POLICY, "--namespace", "students")
    assert (status, answer["pool"]["class"]) == (0, "low")


def test_as_namespace_explains_the_pod_as_if_it_were_there(capsys: pytest.CaptureFixture[str]) -> None:
    """--as-namespace is the "what if": the students Pod gets the students' default class low as
    written, and team-a's default class medium as if in team-a. With -n too, it is refused."""
    pod_file = str(PODS / "students-default-class.yaml")
    _, as_written = explain_json(capsys, pod_file, "--policy", POLICY)
    assert as_written["pool"]["class"] == "low"
    _, what_if = explain_json(capsys, pod_file, "--policy", POLICY, "--as-namespace", "team-a")
    assert (what_if["namespace"], what_if["pool"]["class"]) == ("team-a", "medium")
    _, out, _ = explain(capsys, pod_file, "--policy", POLICY, "--as-namespace", "team-a")
    assert "Pod team-a/homework-3" in out
    status, out, err = explain(capsys, pod_file, "--as-namespace", "team-a", "-n", "team-a")
    assert (status, out) == (2, "")
    assert "--as-namespace" in err


def test_a_pod_without_namespace_takes_n_else_the_contexts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """As kubectl: a Pod that names no namespace is in -n's, else in the kubeconfig context's, for
    `gpupool` as for `kubectl gpupool`."""
    obj = load(PODS / "students-default-class.yaml")
    del obj["metadata"]["namespace"]
    pod_file = tmp_path / "bare.yaml"
    pod_file.write_text(yaml.safe_dump(obj), "utf-8")
    _, answer = explain_json(capsys, str(pod_file), "--policy", POLICY, "-n", "students")
    assert (answer["namespace"], answer["pool"]["class"]) == ("students", "low")
    kc = str(kubeconfig(tmp_path / "kubeconfig"))
    _, answer = explain_json(capsys, str(pod_file), "--policy", POLICY, "--kubeconfig", kc)
    assert (answer["namespace"], answer["pool"]["class"]) == ("team-a", "medium")


def test_a_namespace_that_kubernetes_would_refuse_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", str(PODS / "class-medium.yaml"), "-n", "Team_A"])
    assert exc.value.code == 2
    assert "'Team_A' is not a namespace name" in capsys.readouterr().err


def test_several_documents_are_explained_one_section_each(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Two Pods in one file (and a third in another): a section each in the text, a List of them with
    `-o json`; the exit status is 1 as one of them is denied."""
    both = tmp_path / "both.yaml"
    both.write_text(
        (PODS / "class-medium.yaml").read_text("utf-8") + "\n---\n" + (PODS / "team-a-quota.yaml").read_text("utf-8")
    )
    status, out, _ = explain(capsys, str(both), str(PODS / "plain-cpu.yaml"), "--policy", POLICY)
    assert status == 1
    pods = [line for line in out.splitlines() if line.startswith("Pod ")]
    assert pods == ["Pod ml-train/resnet50-train", "Pod team-a/whisper-finetune", "Pod ml-train/web"]
    status, answer = explain_json(capsys, str(both), "--policy", POLICY)
    assert (status, answer["kind"]) == (1, "List")
    assert [(i["name"], i["allowed"]) for i in answer["items"]] == [
        ("resnet50-train", True),
        ("whisper-finetune", False),
    ]


def test_pod_without_namespace_is_in_default(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A manifest without metadata.namespace is explained for the namespace `default`."""
    obj = load(PODS / "class-medium.yaml")
    del obj["metadata"]["namespace"]
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(obj), "utf-8")
    status, out, _ = explain(capsys, str(pod_file))
    assert status == 0 and "default/resnet50-train" in out


def test_policy_option_is_applied(capsys: pytest.CaptureFixture[str]) -> None:
    """--policy brings the namespace rules: the A100 Pod is placed in students under the built-in
    policy (every class allowed) and denied under the demo policy (students may not use high)."""
    pod_file = str(PODS / "product-a100.yaml")
    status, built_in = explain_json(capsys, pod_file, "--as-namespace", "students")
    assert status == 0 and built_in["pool"]["class"] == "high"
    status, demo = explain_json(capsys, pod_file, "--as-namespace", "students", "--policy", POLICY)
    assert status == 1 and demo["pool"] is None
    assert "students" in demo["message"]


def test_without_inventory_the_live_cluster_is_used(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No --inventory means the live cluster from KUBECONFIG; with no usable configuration the command
    exits 2 with one error line that points to --inventory, and touches no snapshot."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    status = main(["explain", str(PODS / "class-medium.yaml"), "-o", "json"])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert err.startswith(ERROR_PREFIX) and "Traceback" not in err
    assert "--inventory" in err


def test_snapshot_does_not_need_a_kubeconfig(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With --inventory FILE the cluster configuration is never read."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    status, answer = explain_json(capsys, str(PODS / "class-medium.yaml"))
    assert status == 0 and answer["pool"]["product"] == "Tesla-T4"


# --- bad files and arguments -------------------------------------------------------------------------------

SERVICE = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n"
POD = "@pod"  # stands for the text of examples/pods/class-medium.yaml

# name -> (pod file content or None for a missing file, inventory content, policy content, words in the message)
BAD_FILES: dict[str, tuple[str | None, str | None, str | None, tuple[str, ...]]] = {
    "missing-pod": (None, None, None, ("pod.yaml",)),
    "pod-not-yaml": ("metadata: {name: [unclosed\n", None, None, ("pod.yaml", "YAML")),
    "pod-empty": ("", None, None, ("pod.yaml",)),
    "pod-is-a-list": ("- a\n- b\n", None, None, ("pod.yaml", "document 1", "a list")),
    "second-document-not-an-object": (POD + "\n---\njust text\n", None, None, ("pod.yaml", "document 2")),
    "list-items-not-a-list": ("apiVersion: v1\nkind: List\nitems: 3\n", None, None, ("pod.yaml", "items")),
    "service-not-pod": (SERVICE, None, None, ("pod.yaml", "Service")),
    "missing-inventory": (POD, "", None, ("inventory.yaml",)),
    "inventory-not-a-list": (POD, "apiVersion: v1\nkind: Status\nfoo: bar\n", None, ("inventory.yaml",)),
    "inventory-a-mapping-without-items": (POD, "foo: bar\n", None, ("inventory.yaml", "List")),
    "inventory-a-scalar": (POD, "just some text\n", None, ("inventory.yaml",)),
    "inventory-not-yaml": (POD, "items: [\n", None, ("inventory.yaml",)),
    "inventory-without-nodes": (POD, "apiVersion: v1\nkind: List\nitems: []\n", None, ("inventory.yaml", "Node")),
    "policy-unknown-field": (POD, None, "defaults:\n  fallbak: true\n", ("policy.yaml", "fallbak")),
    "policy-bad-value": (POD, None, "defaults:\n  onNoCapacity: maybe\n", ("policy.yaml", "onNoCapacity", "maybe")),
    "policy-not-yaml": (POD, None, "classes: [low\n", ("policy.yaml",)),
    "missing-policy": (POD, None, "", ("policy.yaml",)),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_exit_2_with_a_clear_error(case: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A missing or unusable Pod, inventory or policy file: exit status 2, one `gpupool explain: error:`
    line naming the file (and the field), nothing on stdout, no traceback."""
    pod_text, inventory_text, policy_text, words = BAD_FILES[case]
    pod_file, inventory_file, policy_file = tmp_path / "pod.yaml", tmp_path / "inventory.yaml", tmp_path / "policy.yaml"
    if pod_text is not None:
        pod_file.write_text(pod_text.replace(POD, (PODS / "class-medium.yaml").read_text("utf-8")), "utf-8")
    args = [str(pod_file)]
    if inventory_text is not None:
        if inventory_text:
            inventory_file.write_text(inventory_text, "utf-8")
        args += ["--inventory", str(inventory_file)]
    if policy_text is not None:
        if policy_text:
            policy_file.write_text(policy_text, "utf-8")
        args += ["--policy", str(policy_file)]
    status, out, err = explain(capsys, *args)
    assert status == 2
    assert out == ""
    assert err.startswith(ERROR_PREFIX), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"


def test_unknown_output_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`-o xml` is refused by the argument parser with status 2, naming the accepted choices."""
    with pytest.raises(SystemExit) as exc:
        main(["explain", str(PODS / "class-medium.yaml"), "-o", "xml"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "json" in err and "text" in err and "yaml" in err


# --- as a real process -------------------------------------------------------------------------------------


def run_module(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m webhook ARGS` in the repository, killed if it runs longer than a generous timeout."""
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_module_reads_stdin_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m webhook explain - -o json` with the Pod on stdin: exit 0 and the same object as the
    in-process command."""
    proc = run_module(
        "explain",
        "-",
        "--inventory",
        INVENTORY,
        "--policy",
        PLACE_NOW,
        "-o",
        "json",
        stdin=(PODS / "class-medium.yaml").read_text("utf-8"),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == explain_json(capsys, str(PODS / "class-medium.yaml"))[1]


def test_module_denied_pod_exits_1() -> None:
    """A denied Pod makes the process exit with status 1 (scripts can test it)."""
    proc = run_module("explain", str(PODS / "team-a-quota.yaml"), "--inventory", INVENTORY, "--policy", POLICY)
    assert proc.returncode == 1, proc.stderr
    assert "gpu-quota" in proc.stdout


def test_module_bad_policy_exits_2_without_traceback(tmp_path: Path) -> None:
    """A policy with an unknown field: the process exits 2 with one error line naming file and field."""
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("namespaces:\n  team-a:\n    defaultClas: medium\n", "utf-8")
    proc = run_module(
        "explain", str(PODS / "class-medium.yaml"), "--inventory", INVENTORY, "--policy", str(policy_file)
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith(ERROR_PREFIX) and "Traceback" not in proc.stderr
    assert str(policy_file) in proc.stderr and "defaultClas" in proc.stderr


# --- a Pod the queue takes -----------------------------------------------------------------------------------


def queued_manifest(tmp_path: Path, name: str, annotations: dict[str, str], **spec: Any) -> str:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
           "spec": {"containers": [{"name": "main", "image": "pytorch"}], **spec}}  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(obj), "utf-8")
    return str(path)


@pytest.fixture
def queue_cluster(tmp_path: Path) -> list[str]:
    """The cluster of tests/commands/queued.py: five Pods queued, one L4 and the A100s free."""
    inventory, policy_file = write_snapshot(tmp_path)
    return ["--inventory", inventory, "--policy", policy_file]


def test_a_pod_whose_namespace_queues_is_said_to_be_queued_and_where_it_would_go(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue_cluster: list[str]
) -> None:
    """A high Pod in q2: queued with its device resource fixed (not "allowed unchanged"), last of six in
    the queue, and the leader's pass with it added would release it now to the A100s (after `hi`, before
    it, takes one of their four free GPUs)."""
    pod_file = queued_manifest(tmp_path, "train", {"gpupool.io/gpu-class": "high"})
    status, out, err = explain(capsys, pod_file, *queue_cluster, "-n", "q2")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[:3] == [
        "Pod q2/train",
        "Decision: queued: 1 x nvidia.com/gpu (the device resource is fixed now), behind the scheduling gate "
        "gpupool.io/queue until the queue's leader releases it to a pool",
        f"Queue: position 6 of 6, priority 0: would be released now to {A100} (constraints: "
        "gpu.accelerator/class=high, nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB)",
    ]
    assert "allowed unchanged" not in out


def test_a_job_whose_namespace_queues_says_how_many_of_its_pods_the_leader_would_release_now(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue_cluster: list[str]
) -> None:
    """A Job of 4 high Pods in q2, all four queued as its controller creates them: the A100s have 3 GPUs
    free and `hi`, before them in the order, takes one, so the leader's pass would release 2 and the other
    2 would wait for room; its first Pod's place counts the whole queue with the Job's 4 in it."""
    template = {"metadata": {"annotations": {"gpupool.io/gpu-class": "high"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "pytorch"}]}}  # fmt: skip
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "q2"},
           "spec": {"parallelism": 4, "template": template}}  # fmt: skip
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), "utf-8")
    status, out, _ = explain(capsys, str(path), *queue_cluster)
    assert status == 0
    lines = out.splitlines()
    assert lines[3].startswith(f"Queue: position 6 of 9, priority 0: would be released now to {A100} ")
    assert lines[4] == (
        f"Pods: 2 of the 4 would be released now (2 to {A100}); the other 2 would wait: no node of "
        "NVIDIA-A100-SXM4-40GB has 1 free now"
    )
    status, answer = explain_json(capsys, str(path), *queue_cluster)
    assert answer["pods"] == {"pods": 4, "of": 4, "fitNow": 2, "pools": {A100: 2},
                              "rest": {"outcome": "wait", "reason": "capacity",
                                       "message": "no node of NVIDIA-A100-SXM4-40GB has 1 free now"}}  # fmt: skip


def test_a_queued_pod_that_would_wait_is_told_what_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue_cluster: list[str]
) -> None:
    """A medium Pod in q: `fits`, before it in the order, takes the one free L4 (which `big` cannot use
    now), so it would wait for room; with spec.priority above big's it would come first and take that L4;
    one of class high in q3 would wait for its class quota."""
    medium = {"gpupool.io/gpu-class": "medium"}
    _, out, _ = explain(capsys, queued_manifest(tmp_path, "later", medium), *queue_cluster, "-n", "q")
    assert out.splitlines()[2] == (
        "Queue: position 6 of 6, priority 0: would wait: no node of NVIDIA-L4, Tesla-T4 has 1 free now"
    )
    urgent = queued_manifest(tmp_path, "urgent", medium, priority=100)
    _, out, _ = explain(capsys, urgent, *queue_cluster, "-n", "q")
    assert out.splitlines()[2].startswith(f"Queue: position 1 of 6, priority 100: would be released now to {L4} ")
    over = queued_manifest(tmp_path, "over2", {"gpupool.io/gpu-class": "high"})
    _, out, _ = explain(capsys, over, *queue_cluster, "-n", "q3")
    assert out.splitlines()[2] == (
        "Queue: position 6 of 6, priority 0: would wait: class quota high in namespace q3 exceeded: used 1 + "
        "requested 1 > hard 1"
    )


def test_a_priority_class_the_explain_cannot_resolve_is_noted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue_cluster: list[str]
) -> None:
    pod_file = queued_manifest(tmp_path, "pc", {"gpupool.io/gpu-class": "high"}, priorityClassName="research")
    _, out, _ = explain(capsys, pod_file, *queue_cluster, "-n", "q2")
    assert out.splitlines()[3] == (
        "Note: priorityClassName research: kube-apiserver sets spec.priority from it when the Pod is created; its "
        "place above counts priority 0"
    )


def test_the_queue_outcome_is_in_json_and_yaml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue_cluster: list[str]
) -> None:
    """`queued` is the device resource fixed at admission; `queue` what the `Queue:` line says, as the
    `gpupool queue -o json` entries say it; null for a Pod its namespace places at admission."""
    pod_file = queued_manifest(tmp_path, "later", {"gpupool.io/gpu-class": "medium"})
    status, answer = explain_json(capsys, pod_file, *queue_cluster, "-n", "q")
    assert status == 0 and set(answer) == JSON_KEYS
    assert (answer["queued"], answer["pool"]) == ("nvidia.com/gpu", None)
    assert answer["queue"] == {
        "position": 6, "waiting": 6, "priority": 0, "outcome": "wait", "pool": None, "constraints": None,
        "code": "capacity", "reason": "no node of NVIDIA-L4, Tesla-T4 has 1 free now", "recut": None,
        "waitsFor": "no node of NVIDIA-L4, Tesla-T4 has 1 free now",
    }  # fmt: skip
    _, out, _ = explain(capsys, pod_file, *queue_cluster, "-n", "q", "-o", "yaml")
    assert yaml.safe_load(out) == answer
    placed = explain_json(capsys, pod_file, *queue_cluster, "-n", "now")[1]
    assert (placed["queued"], placed["queue"], placed["pool"]["product"]) == (None, None, "NVIDIA-L4")


def test_each_pod_of_a_file_is_put_in_the_queue_as_it_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue_cluster: list[str]
) -> None:
    """Two urgent Pods in one List: nothing is reserved, so each is judged on the queue as the cluster has
    it and each would take the one free L4; the second is not behind the first."""
    path = Path(queued_manifest(tmp_path, "urgent", {"gpupool.io/gpu-class": "medium"}, priority=100))
    one = yaml.safe_load(path.read_text())
    two = {**one, "metadata": {**one["metadata"], "name": "urgent-2"}}
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [one, two]}))
    status, answer = explain_json(capsys, str(path), *queue_cluster, "-n", "q")
    assert status == 0
    assert [(i["name"], i["queue"]["position"], i["queue"]["pool"]) for i in answer["items"]] == [
        ("urgent", 1, L4),
        ("urgent-2", 1, L4),
    ]
