"""Tests for the Makefile's first-day targets: the README's two commands at once on a fresh clone, the
health port of `make run`, and `make deploy` saying (and needing) the kubectl context it applies to.

The install tests run `make` in a scratch copy of what the target reads; the deploy tests run it in this
checkout, with a scratch kubeconfig and the rendered manifest written to a scratch file.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_until

MAKE = shutil.which("make")
KUBECTL = shutil.which("kubectl")
# A pip install that needs a whole virtualenv (pip included) and no network: pip is there already.
OFFLINE_INSTALL = "--no-index pip"

pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not on PATH")


def fresh_clone(tmp_path: Path) -> Path:
    """What `make install` reads, as a fresh clone has it: no .venv."""
    clone = tmp_path / "clone"
    (clone / "tools").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", "requirements.lock", "tools/ensure_venv.py"):
        shutil.copy(REPO / name, clone / name)
    return clone


def make(clone: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    assert MAKE is not None
    return subprocess.Popen(
        [MAKE, "--no-print-directory", *args, f"PYTHON={sys.executable}"],
        cwd=clone,
        # A make of its own, also when the suite runs under `make test` (whose MAKELEVEL would make it a
        # sub-make, `make[1]: ***`, and whose MAKEFLAGS it would inherit).
        env={k: v for k, v in (env or os.environ).items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_two_installs_at_once_make_one_working_virtualenv(tmp_path: Path) -> None:
    """`make run & make test` on a fresh clone: the second make starts while the first is still making
    the virtualenv (its python exists, pip does not yet), which used to fail with "No module named pip".
    Both now succeed, the virtualenv is made once, and it works."""
    clone = fresh_clone(tmp_path)
    first = make(clone, "install", f"PIP_INSTALL={OFFLINE_INSTALL}")
    wait_until(lambda: (clone / ".venv" / "bin" / "python").exists() or first.poll() is not None, 60, "a .venv")
    second = make(clone, "install", f"PIP_INSTALL={OFFLINE_INSTALL}")
    outputs = [p.communicate(timeout=300)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    assert "".join(outputs).count("creating .venv") == 1, outputs
    assert (clone / ".venv" / ".installed-stamp").exists()
    done = subprocess.run(
        [clone / ".venv" / "bin" / "python", "-m", "pip", "--version"], capture_output=True, check=False
    )
    assert done.returncode == 0


def test_an_interrupted_virtualenv_is_made_again(tmp_path: Path) -> None:
    """A .venv left without pip (a make killed half-way) is made again instead of failing for ever."""
    clone = fresh_clone(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", clone / ".venv"], check=True)
    proc = make(clone, "install", f"PIP_INSTALL={OFFLINE_INSTALL}")
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert "creating .venv" in out


def dry_run(*args: str) -> str:
    """The commands `make -n` would run in this checkout (nothing is run)."""
    assert MAKE is not None
    done = subprocess.run(
        [MAKE, "-n", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_keeps_off_kubectls_default_port() -> None:
    """kubectl without a kubeconfig talks to localhost:8080; `make run` must not answer there."""
    ports = re.findall(r"--health-port (\d+)", dry_run("run"))
    assert ports and all(port != "8080" for port in ports)


# --- make deploy and undeploy name their context ----------------------------------------------------


KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
  - name: lab
    cluster: {{server: "https://127.0.0.1:{port}"}}
users:
  - name: admin
    user: {{token: not-a-real-token}}
contexts:
  - name: lab-admin
    context: {{cluster: lab, user: admin}}
{current}
"""


def deploy_env(tmp_path: Path, *, current: bool, port: int = 9) -> dict[str, str]:
    """An environment whose kubeconfig has one context (current or not) on a port nothing listens on."""
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG.format(port=port, current="current-context: lab-admin" if current else ""))
    return {**os.environ, "KUBECONFIG": str(config)}


needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


@needs_kubectl
@pytest.mark.parametrize("target", ["deploy", "undeploy"])
def test_without_a_current_context_nothing_is_rendered_or_applied(tmp_path: Path, target: str) -> None:
    """With no current context kubectl would fall back to http://localhost:8080 (where a `make run` of old
    answered); make stops first, saying why, and renders nothing."""
    out_file = tmp_path / "out.yaml"
    proc = make(REPO, target, "OVERLAY=cert-manager", f"MANIFEST={out_file}", env=deploy_env(tmp_path, current=False))
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2, out
    assert f"make {target}: no current kubectl context" in out
    assert not out_file.exists() and "render.py" not in out and "localhost:8080" not in out


@needs_kubectl
def test_deploy_says_the_context_and_server_and_applies_only_there(tmp_path: Path) -> None:
    """The context and its server come first; every kubectl call goes to that server (here one that
    refuses, so the apply fails there, and nowhere else)."""
    out_file = tmp_path / "out.yaml"
    env = deploy_env(tmp_path, current=True)
    proc = make(REPO, "deploy", "OVERLAY=cert-manager", f"MANIFEST={out_file}", env=env)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, out
    assert out.splitlines()[0] == "make deploy: kubectl context lab-admin, server https://127.0.0.1:9", out
    assert out_file.exists()  # rendered, then refused by the (absent) cluster
    assert "127.0.0.1:9" in out.split("wrote", 1)[1]


# --- the self-signed overlay by hand ---------------------------------------------------------------------


def documented_block(containing: str) -> list[str]:
    """The commands of the install guide's shell block that contains `containing`."""
    text = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        if containing in block:
            return [line for line in block.splitlines() if line.strip()]
    raise AssertionError(f"docs/install.md has no sh block with {containing!r}")


@needs_kubectl
def test_the_self_signed_overlay_renders_with_the_documented_commands(tmp_path: Path) -> None:
    """docs/install.md's commands for plain `kubectl kustomize manifests/overlays/self-signed`, run in a
    copy of the repository: `make manifests` (for the cluster's certificates in certs/), the copy, the
    render, which holds the Secret and the caBundle."""
    commands = documented_block("kubectl kustomize manifests/overlays/self-signed")
    assert commands[0] == "make manifests"
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "manifests", copy / "manifests", ignore=shutil.ignore_patterns(*CERTS, "*.py"))
    # What `make manifests` does to certs/ (its render needs the whole checkout, and writes build/).
    build = importlib.import_module("manifests.rendering.build")
    build.ensure_certs(copy / "certs", [])
    for command in commands[1:]:
        done = subprocess.run(command, shell=True, cwd=copy, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{command}: {done.stderr}"
    assert "kind: Secret" in done.stdout and "caBundle:" in done.stdout


CERTS = ("ca.crt", "tls.crt", "tls.key")


@pytest.mark.parametrize(
    ("pod", "status", "said"),
    [
        ("bad-annotation.yaml", 0, "Decision: DENIED (400): unknown annotation gpupool.io/gpu-clas"),
        ("no-such-pod.yaml", 2, "gpupool explain: error: cannot read examples/pods/no-such-pod.yaml"),
    ],
    ids=["denied-is-an-answer", "bad-file-is-an-error"],
)
def test_make_explain_fails_only_when_explain_cannot_answer(pod: str, status: int, said: str) -> None:
    """A denied Pod is explained, and make ends without `make: *** ... Error 1`; a file that cannot be read
    still fails the target."""
    proc = make(REPO, "explain", f"POD=examples/pods/{pod}")
    out = proc.communicate(timeout=120)[0]
    assert said in out
    assert (proc.returncode == 0, "make: ***" in out) == (status == 0, status != 0)


# Stand-ins for the tools `make test` runs, in a virtualenv of its own: mypy and pytest each wait (up to
# 10 s) for the other to have started, so they only pass when make runs them side by side.
SIDE_BY_SIDE = """#!/bin/sh
touch "$0.started"
i=0
while [ ! -e "$(dirname "$0")/{other}.started" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -e "$(dirname "$0")/{other}.started" ] || {{ echo "{name} ran alone"; exit 3; }}
echo "{name} says {status}"
exit {status}
"""


def stand_in_venv(clone: Path, mypy: int, pytest_status: int) -> None:
    """A .venv whose ruff and lint-imports pass and whose mypy and pytest exit with the given statuses."""
    bin_dir = clone / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    scripts = {
        "ruff": "#!/bin/sh\nexit 0\n",
        "lint-imports": "#!/bin/sh\nexit 0\n",
        "mypy": SIDE_BY_SIDE.format(name="mypy", other="pytest", status=mypy),
        "pytest": SIDE_BY_SIDE.format(name="pytest", other="mypy", status=pytest_status),
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text, "utf-8")
        (bin_dir / name).chmod(0o755)
    (clone / ".venv" / ".installed-stamp").touch()  # after pyproject.toml and requirements.lock: made


@pytest.mark.parametrize(
    ("mypy", "pytest_status"), [(0, 0), (1, 0), (0, 1)], ids=["both-pass", "mypy-fails", "pytest-fails"]
)
def test_make_test_type_checks_beside_pytest_and_fails_when_either_fails(
    tmp_path: Path, mypy: int, pytest_status: int
) -> None:
    """mypy runs while pytest does (on a fresh clone it is most of make test's fixed cost, and the workers
    leave a core idle while they wait for the servers they start); its report is shown after pytest's, and
    make test fails when either fails."""
    clone = fresh_clone(tmp_path)
    stand_in_venv(clone, mypy, pytest_status)
    proc = make(clone, "test")
    out = proc.communicate(timeout=60)[0]
    assert "ran alone" not in out, out
    assert f"mypy says {mypy}" in out and f"pytest says {pytest_status}" in out, out
    assert out.index("pytest says") < out.index("mypy says")
    assert (proc.returncode == 0) is (mypy == pytest_status == 0), out
    assert ("make test: mypy failed" in out) is (mypy != 0), out
