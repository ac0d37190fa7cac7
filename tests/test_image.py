"""Tests for the image: the Dockerfile, the wheel it installs and requirements.lock.

No machine here can pull or build images, so the Dockerfile is checked statically (its instructions,
resolved across continuations and ARG defaults), and what its builder stage does is done for real where
it can be: the wheel is built from the files the builder copies, offline, and its contents read.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from webhook.commands.cli import build_parser
from webhook.commands.serve import SERVE_ENV, resolve_options

REPO = Path(__file__).resolve().parents[1]
KUBECTL = shutil.which("kubectl")
VENV = "/opt/gpupool"  # where the builder makes the venv the final stage copies
# [registry[:port]/]path:tag@sha256:digest; the tag stays, so `make pin-images` knows what to re-resolve.
DIGEST = re.compile(r"([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9._-]+(/[a-z0-9._-]+)*:[\w.-]+@sha256:[0-9a-f]{64}")


# --- the Dockerfile, read --------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def dockerfile_stages() -> list[list[Instruction]]:
    """The Dockerfile's instructions per stage (FROM starts one; the first list is what precedes the
    first FROM); comments and continuations resolved."""
    lines: list[str] = []
    pending = ""
    for raw in (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if raw.lstrip().startswith("#"):
            continue  # a comment, also inside a continued instruction
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        if (pending + raw).strip():
            lines.append(pending + raw)
        pending = ""
    stages: list[list[Instruction]] = [[]]
    for line in lines:
        keyword, _, args = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append(Instruction(keyword.upper(), args.strip()))
    return stages


def build_args() -> dict[str, str]:
    """The ARG defaults declared before the first FROM (what FROM ${...} refers to)."""
    preamble = dockerfile_stages()[0]
    return dict(ins.args.split("=", 1) for ins in preamble if ins.keyword == "ARG")


def base_image(stage: list[Instruction]) -> str:
    """The image a stage starts from, its ${ARG} resolved."""
    ref = stage[0].args.split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: build_args()[m.group(1)], ref)


def dockerfile_env(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in stage:
        if ins.keyword == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", ins.args)))
    return env


def copy_sources(stage: list[Instruction]) -> list[str]:
    sources: list[str] = []
    for ins in stage:
        if ins.keyword == "COPY" and not ins.args.startswith("--from"):
            *srcs, _dest = ins.args.split()
            sources += srcs
    return sources


def runs(stage: list[Instruction]) -> list[str]:
    return [ins.args for ins in stage if ins.keyword == "RUN"]


def deployment_pod_spec() -> dict[str, Any]:
    if KUBECTL is None:
        pytest.skip("kubectl is not on PATH: the base manifests are rendered with `kubectl kustomize`")
    done = subprocess.run(
        [KUBECTL, "kustomize", str(REPO / "manifests" / "base")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    (deployment,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


class TestDockerfile:
    def test_final_stage_runs_gpupool_serve_as_the_deployments_user(self) -> None:
        """ENTRYPOINT is the venv's gpupool serve, numeric USER = the Deployment's runAsUser, the
        Deployment's ports, no HEALTHCHECK (Kubernetes uses the probes)."""
        *_, final = dockerfile_stages()
        by_keyword = {ins.keyword: ins.args for ins in final}
        assert json.loads(by_keyword["ENTRYPOINT"]) == [f"{VENV}/bin/gpupool", "serve"]
        uid, _, gid = by_keyword["USER"].partition(":")
        pod_spec = deployment_pod_spec()
        security = pod_spec["securityContext"]
        assert (int(uid), int(gid)) == (security["runAsUser"], security["runAsGroup"])
        env = {e["name"]: e["value"] for e in pod_spec["containers"][0]["env"] if "value" in e}
        options = resolve_options(build_parser(["serve"]).parse_args(["serve"]), env)
        assert {int(p) for p in by_keyword["EXPOSE"].split()} == {options.port, options.health_port}
        assert "HEALTHCHECK" not in by_keyword

    def test_every_base_image_is_pinned_by_digest(self) -> None:
        """Each stage starts from `registry/name:tag@sha256:<digest>`, so a rebuild takes the same bases
        (`make pin-images` moves them to their tags' current digests); no unpinned `# syntax=` frontend."""
        _, *stages = dockerfile_stages()
        for stage in stages:
            assert DIGEST.fullmatch(base_image(stage)), base_image(stage)
        assert not re.search(r"^#\s*syntax=", (REPO / "Dockerfile").read_text(encoding="utf-8"), re.M)
        recipe = make_recipe("pin-images")
        assert "imagetools inspect" in recipe
        assert all(name in recipe for name in build_args())

    def test_final_stage_has_no_shell_no_package_manager_and_only_the_venv(self) -> None:
        """The runtime base is distroless Python (not its :debug variant, which has a shell); the final
        stage copies only the builder's venv, and its one RUN is exec form, which needs no shell: it
        imports the server with the venv's interpreter, so an interpreter link that does not resolve
        in that image, or a C extension that does not load, fails the build."""
        *_, final = dockerfile_stages()
        runtime = base_image(final)
        assert runtime.startswith("gcr.io/distroless/python3-") and ":debug" not in runtime
        copies = [i.args for i in final if i.keyword == "COPY"]
        assert copies == [f"--from=builder {VENV} {VENV}"]
        (check,) = runs(final)
        argv = json.loads(check)
        assert argv[0] == f"{VENV}/bin/python3"
        assert "webhook.commands.serve" in argv[-1] and "webhook.sources.live" in argv[-1]

    def test_builder_and_runtime_share_debian_and_python(self) -> None:
        """The venv links /usr/bin/python3 of the builder; the runtime must have the same Python: both are
        Debian 12 (bookworm, Python 3.11), which is what the lock was resolved for and the builder's
        site-packages path names."""
        _, builder, final = dockerfile_stages()
        assert re.match(r"debian:(12|bookworm)[-\w]*@", base_image(builder)), base_image(builder)
        assert "python3-debian12" in base_image(final)
        assert any("python3 -m venv " + VENV in run for run in runs(builder))
        assert any(f"{VENV}/lib/python3.11/site-packages" in run for run in runs(builder))
        assert "autogenerated by pip-compile with Python 3.11" in (REPO / "requirements.lock").read_text()

    def test_builder_installs_exactly_the_lock(self) -> None:
        """Python packages come from requirements.lock alone, in pip's hash-checking mode, as wheels, with
        no dependency resolution of their own; gpupool itself is built offline with the locked setuptools,
        then pip and setuptools leave the venv."""
        _, builder, _ = dockerfile_stages()
        installs = [r for r in runs(builder) if "pip install" in r]
        lock, own = installs
        for flag in ("--require-hashes", "--no-deps", "--only-binary=:all:", "-r requirements.lock"):
            assert flag in lock, flag
        for flag in ("--no-deps", "--no-build-isolation", "--no-index"):
            assert flag in own, flag
        assert "pip uninstall --yes pip setuptools" in own
        assert "test ! -e $site/webhook/testing" in own

    def test_environment_is_serve_options(self) -> None:
        """Every GPUPOOL_* variable the image sets is one `gpupool serve` reads, with a valid value."""
        *_, final = dockerfile_stages()
        env = {k: v for k, v in dockerfile_env(final).items() if k.startswith("GPUPOOL_")}
        assert set(env) <= set(SERVE_ENV)
        resolve_options(build_parser(["serve"]).parse_args(["serve"]), env)
        assert dockerfile_env(final)["PATH"].startswith(f"{VENV}/bin:")

    def test_build_context_has_what_the_builder_copies_and_not_the_simulator(self) -> None:
        """Every COPY source exists and is let through by .dockerignore (which excludes all else, and the
        API simulator within webhook/)."""
        ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        assert "*" in ignore
        allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
        for source in copy_sources(dockerfile_stages()[1]):
            assert (REPO / source).exists(), source
            assert source.rstrip("/") in allowed, source
        assert ignore.index("webhook/testing/") > ignore.index("!webhook/")  # the later line wins


def make_recipe(target: str) -> str:
    """The commands `make TARGET` would run (-n: nothing is run)."""
    done = subprocess.run(
        ["make", "-n", "-s", "-B", target], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- the wheel -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel the builder installs, built offline from the files it copies, the API simulator's
    sources included (so that leaving it out is the packaging's doing, not .dockerignore's)."""
    context = tmp_path_factory.mktemp("context")
    for source in copy_sources(dockerfile_stages()[1]):
        if (REPO / source).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / source, context / source, symlinks=True, ignore=ignore)
        else:
            (context / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / source, context / source)
    assert (context / "webhook" / "testing" / "__init__.py").is_file()
    assert (context / "webhook" / "domain" / "default_policy.yaml").is_symlink()
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("gpupool_webhook-*.whl")
    return zipfile.ZipFile(built)


class TestWheel:
    def test_the_api_simulator_is_not_in_the_wheel(self, wheel: zipfile.ZipFile) -> None:
        """webhook/testing (a fake API server, for tests and benchmarks) is left out of the package, so no
        image ships it; the rest of webhook/ is in."""
        names = wheel.namelist()
        assert [n for n in names if n.startswith("webhook/testing")] == []
        for module in ("webhook/serving/server.py", "webhook/sources/live.py", "webhook/commands/cli.py"):
            assert module in names, module

    def test_the_default_policy_is_packaged_as_a_regular_file(self, wheel: zipfile.ZipFile) -> None:
        """webhook/domain/default_policy.yaml is a symlink into manifests/base; the wheel holds its content."""
        packaged = wheel.read("webhook/domain/default_policy.yaml").decode("utf-8")
        assert packaged == (REPO / "manifests" / "base" / "policy.yaml").read_text(encoding="utf-8")

    def test_the_wheel_requires_what_pyproject_says(self, wheel: zipfile.ZipFile) -> None:
        """The wheel's Requires-Dist are pyproject.toml's dependencies, so the lock checked below against
        pyproject.toml is checked against what the wheel needs."""
        (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        requires = {
            canonicalize_name(Requirement(line.split(":", 1)[1]).name)
            for line in wheel.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line
        }
        assert requires == {canonicalize_name(Requirement(d).name) for d in pyproject()["project"]["dependencies"]}


# --- requirements.lock -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Locked:
    version: str
    hashes: tuple[str, ...]
    via: tuple[str, ...]  # the annotations: package names, or "gpupool-webhook (pyproject.toml...)"


def parse_lock(text: str) -> dict[str, Locked]:
    """requirements.lock as pip-compile --generate-hashes writes it: `name==version \\`, its `--hash`
    lines, then `# via X` or `# via` followed by `#   X` lines."""
    entries: dict[str, Locked] = {}
    name = version = ""
    hashes: list[str] = []
    via: list[str] = []

    def close() -> None:
        if name:
            entries[name] = Locked(version, tuple(hashes), tuple(via))

    for line in text.splitlines():
        stripped = line.strip()
        if m := re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*\\?", stripped):
            close()
            name, version, hashes, via = canonicalize_name(m.group(1)), m.group(2), [], []
        elif m := re.fullmatch(r"--hash=sha256:([0-9a-f]{64})\s*\\?", stripped):
            hashes.append(m.group(1))
        elif (m := re.fullmatch(r"#\s+via\s+(.+)", stripped)) or (
            name and (m := re.fullmatch(r"#\s{3}(.+)", stripped))
        ):
            via.append(m.group(1).strip())
    close()
    return entries


def pyproject(text: str | None = None) -> dict[str, Any]:
    return tomllib.loads(text if text is not None else (REPO / "pyproject.toml").read_text(encoding="utf-8"))


def lock_problems(project: dict[str, Any], lock: dict[str, Locked]) -> list[str]:
    """Where pyproject.toml's dependencies (and build backend) and the lock disagree; [] when they agree."""
    problems = []
    wanted = {
        "pyproject.toml": [Requirement(d) for d in project["project"]["dependencies"]],
        "pyproject.toml::build-system.requires": [Requirement(d) for d in project["build-system"]["requires"]],
    }
    for source, requirements in wanted.items():
        for req in requirements:
            entry = lock.get(canonicalize_name(req.name))
            if entry is None:
                problems.append(f"{req} ({source}) is not in requirements.lock: run make lock")
            elif not req.specifier.contains(entry.version, prereleases=True):
                problems.append(f"{req} ({source}) does not accept the locked {entry.version}: run make lock")
            elif f"gpupool-webhook ({source})" not in entry.via:
                problems.append(f"{req.name} is locked, but not as a requirement of {source}: run make lock")
        named = {canonicalize_name(r.name) for r in requirements}
        for name, entry in lock.items():
            if f"gpupool-webhook ({source})" in entry.via and name not in named:
                problems.append(f"{name} is locked for {source}, which no longer asks for it: run make lock")
    for name, entry in lock.items():
        parents = [v for v in entry.via if not v.startswith("gpupool-webhook (")]
        missing = [p for p in parents if canonicalize_name(p) not in lock]
        if not entry.via or missing:
            problems.append(f"{name} is locked for {missing or 'nothing'}, which the lock does not hold: run make lock")
    return problems


@pytest.fixture(scope="module")
def lock() -> dict[str, Locked]:
    return parse_lock((REPO / "requirements.lock").read_text(encoding="utf-8"))


class TestLock:
    def test_the_lock_agrees_with_pyproject(self, lock: dict[str, Locked]) -> None:
        """Every dependency of pyproject.toml (and the build backend) is locked at a version it accepts,
        as that requirement; nothing is locked for a requirement pyproject.toml dropped; every other
        package is there for a locked one."""
        assert lock_problems(pyproject(), lock) == []

    @pytest.mark.parametrize(
        ("edit", "problem"),
        [
            (('"orjson>=3.9",', '"orjson>=3.9",\n    "httpx>=0.27",'), "httpx>=0.27 (pyproject.toml) is not in"),
            (('"gunicorn>=27.0,<28"', '"gunicorn>=28.0"'), "gunicorn>=28.0 (pyproject.toml) does not accept"),
            (('    "jsonpatch>=1.33",\n', ""), "jsonpatch is locked for pyproject.toml, which no longer"),
            (('requires = ["setuptools>=68"]', 'requires = ["setuptools>=999"]'), "setuptools>=999 (pyproject"),
        ],
        ids=["dependency-added", "range-moved", "dependency-dropped", "build-backend"],
    )
    def test_a_pyproject_the_lock_does_not_match_is_reported(
        self, lock: dict[str, Locked], edit: tuple[str, str], problem: str
    ) -> None:
        """The check above fails, naming the package, when pyproject.toml changes and the lock does not."""
        text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
        assert edit[0] in text
        problems = lock_problems(pyproject(text.replace(edit[0], edit[1])), lock)
        assert any(p.startswith(problem) for p in problems), problems

    def test_every_package_is_exact_and_hashed(self, lock: dict[str, Locked]) -> None:
        """An exact version and at least one sha256 per package: pip's hash-checking mode installs nothing
        else, whatever is newest on the index that day."""
        assert lock
        for name, entry in lock.items():
            assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", entry.version), (name, entry.version)
            assert entry.hashes, name

    def test_make_lock_resolves_it_and_the_dev_install_follows_it(self) -> None:
        """`make lock` is pip-compile with hashes over pyproject.toml, build backend included, writing the
        file its header names; `make install` installs the runtime dependencies at the locked versions."""
        recipe = make_recipe("lock")
        for flag in ("pip-compile", "--generate-hashes", "--all-build-deps", "--output-file requirements.lock"):
            assert flag in recipe, flag
        assert "#    make lock\n" in (REPO / "requirements.lock").read_text(encoding="utf-8")
        install = make_recipe(".venv/.installed-stamp")
        assert "requirements.lock > build/constraints.txt" in install
        assert "-c build/constraints.txt -e '.[dev]'" in install
