"""The renderings every test of tests/manifests/ reads: each overlay rendered once per run (session
scope: rendering shells out to kubectl and `gpupool certs`, and no test changes what it reads).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.manifests.rendered import (
    CONTROL_PLANE,
    DEPLOYABLE,
    MANIFESTS,
    NAMESPACE,
    RENDERINGS,
    SERVICE,
    Rendering,
    kustomize,
    parse_objects,
    run_render,
)
from webhook.serving.certs import ensure_certificates


@pytest.fixture(scope="session")
def certs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Certificates made for these tests by render.py (through `gpupool certs`), not the repo's certs/."""
    return tmp_path_factory.mktemp("certs")


@pytest.fixture(scope="session")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("build")


@pytest.fixture(scope="session")
def client_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA certificate of kube-apiserver's client certificate (a CA of its own, made by gpupool certs)."""
    directory = tmp_path_factory.mktemp("client-ca")
    ensure_certificates(directory, SERVICE, NAMESPACE)
    return directory / "ca.crt"


@pytest.fixture(scope="session")
def rendered(certs_dir: Path, out_dir: Path, client_ca: Path) -> dict[str, Rendering]:
    """Every rendering, once: the base with plain `kubectl kustomize`, the overlays through render.py."""
    result = {"base": parse_objects(kustomize(MANIFESTS / "base"), "base")}
    locked = ["--client-ca", str(client_ca)]
    for cidr in CONTROL_PLANE:
        locked += ["--control-plane-cidr", cidr]
    options = {
        "self-signed": ["--overlay", "self-signed"],
        "self-signed+ignore": ["--overlay", "self-signed", "--failure-policy", "Ignore"],
        "cert-manager": ["--overlay", "cert-manager"],
        "cert-manager+locked": ["--overlay", "cert-manager", *locked],
        "cert-manager+single-node": ["--overlay", "cert-manager", "--single-node"],
    }
    for name, args in options.items():
        out = out_dir / f"{name}.yaml"
        done = run_render(*args, "--certs-dir", certs_dir, "--out", out)
        assert done.returncode == 0, done.stderr
        result[name] = parse_objects(out.read_text(), name)
    return result


@pytest.fixture(params=RENDERINGS)
def rendering(request: pytest.FixtureRequest, rendered: dict[str, Rendering]) -> Rendering:
    return rendered[request.param]


@pytest.fixture(params=DEPLOYABLE)
def deployable(request: pytest.FixtureRequest, rendered: dict[str, Rendering]) -> Rendering:
    return rendered[request.param]
