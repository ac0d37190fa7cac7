"""The documentation keeps up with the public interface, and its links lead somewhere.

Annotations, command-line flags, environment variables, policy fields and metrics are what users and
admins write down in Pods, Deployments, policy files and alerts. Each is read from the code here (not
from a list kept by hand), and each must appear in README.md or docs/: adding one without documenting
it fails this test. Relative links in the Markdown files, anchors included, must resolve.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.markdown import anchors, links
from webhook.admission.request import KNOWN
from webhook.commands import certs as certs_command
from webhook.commands.cli import SUBCOMMANDS, build_parser
from webhook.commands.kubectl import KUBECTL_FLAGS
from webhook.commands.serve import SERVE_ENV
from webhook.domain import policy_build as policy_module
from webhook.domain.model import PREFIX
from webhook.serving.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MARKDOWN = [README, REPO / "CHANGELOG.md", REPO / "certs" / "README.md", *DOCS]
README_MAX_LINES = 400  # the README is the user's overview; reference material goes to docs/


def documentation() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in (README, *DOCS))


def mentioned(word: str, text: str) -> bool:
    """`word` appears as a whole token: `--host` is not found in `--host-name`, nor `-o` in `-out`."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


# --- what the code exposes -------------------------------------------------------------------------


def cli_flags() -> list[str]:
    """Every option string of every subcommand, `gpupool <command> --flag`, except --help."""
    flags = []
    for command in SUBCOMMANDS:
        parser = build_parser([command])
        sub = next(a for a in parser._actions if a.dest == "command")
        for action in sub.choices[command]._actions:
            flags += [f"{command} {o}" for o in action.option_strings if o not in ("-h", "--help")]
    return flags


def environment_variables() -> list[str]:
    certs_env = [v for k, v in vars(certs_command).items() if k.startswith("ENV_") and isinstance(v, str)]
    return sorted({*SERVE_ENV, *certs_env})


def policy_fields(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every field the policy loader accepts, as docs/policy.md writes it: `defaults.fallback`,
    `vendors.<name>.taints[].key`, `products[].match`, `namespaces.<ns>.classQuota`. Recorded from the
    loader itself while it reads the built-in default and the example policy (which has namespaces)."""
    seen: set[str] = set()
    original = policy_module._Fields.__init__

    def record(self: Any, data: Any, path: str, allowed: tuple[str, ...]) -> None:
        prefix = re.sub(r"\[\d+\]", "[]", path)
        prefix = re.sub(r"^vendors\.[^.]+", "vendors.<name>", prefix)
        prefix = re.sub(r"^namespaces\.[^.]+", "namespaces.<ns>", prefix)
        prefix = "" if prefix == "policy" else prefix + "."
        seen.update(prefix + name for name in allowed)
        original(self, data, path, allowed)

    monkeypatch.setattr(policy_module._Fields, "__init__", record)
    policy_module.load_policy(str(REPO / "examples" / "policy.yaml"))
    assert any(f.startswith("namespaces.<ns>.") for f in seen), "the example policy no longer has namespaces"
    return sorted(seen)


def metric_names() -> list[str]:
    """Every metric as Prometheus exposes it (a counter `x` as `x_total`)."""
    registry = CollectorRegistry(auto_describe=False)
    Metrics(registry)
    return sorted(m.name + ("_total" if m.type == "counter" else "") for m in registry.collect())


def annotations() -> list[str]:
    return [PREFIX + name for name in KNOWN]


# --- every one is documented -----------------------------------------------------------------------


def test_the_public_interface_is_read_from_the_code() -> None:
    """Guard against a check that passes because it found nothing to check."""
    assert "serve --client-ca" in cli_flags()
    assert "explain --sync-timeout" in cli_flags()
    assert "certs --days" in cli_flags()
    assert {"quota --namespace", "quota -n", "quota --output", "explain --context"} <= set(cli_flags())
    assert "--all-namespaces" in KUBECTL_FLAGS
    assert {"gpupool_quota_used_gpus", "gpupool_quota_hard_bytes", "gpupool_build_info"} <= set(metric_names())
    assert {"GPUPOOL_CERT", "GPUPOOL_CERTS_HOSTS"} <= set(environment_variables())
    assert {"gpupool_admissions_total", "gpupool_pool_gpus_free"} <= set(metric_names())
    assert "gpupool.io/gpu-class" in annotations()


def command_section(command: str) -> str:
    """The section of docs/operations.md headed `gpupool <command>`, its subsections included."""
    lines = (REPO / "docs" / "operations.md").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        heading = re.match(rf"(#+) `gpupool {command}`$", line)
        if heading:
            level = len(heading.group(1))
            end = next(
                (j for j in range(i + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[j])),
                len(lines),
            )
            return "\n".join(lines[i:end])
    raise AssertionError(f"docs/operations.md has no section headed `gpupool {command}`")


@pytest.mark.parametrize("flag", cli_flags())
def test_every_flag_is_documented(flag: str) -> None:
    """`gpupool <command> --help` lists it; the command's section of docs/operations.md must say what it
    does (the same flag of another command does not count)."""
    command, option = flag.split(" ")
    assert mentioned(option, command_section(command)), f"gpupool {flag} is not documented in docs/operations.md"


@pytest.mark.parametrize("flag", KUBECTL_FLAGS)
def test_every_flag_of_the_kubectl_plugin_is_documented(flag: str) -> None:
    """kubectl's flags that `kubectl gpupool` reads itself are in its section of docs/operations.md."""
    lines = (REPO / "docs" / "operations.md").read_text(encoding="utf-8").split("\n## ")
    section = next(part for part in lines if part.startswith("`kubectl gpupool`"))
    assert mentioned(flag, section), f"kubectl gpupool {flag} is not documented in docs/operations.md"


@pytest.mark.parametrize("name", environment_variables())
def test_every_environment_variable_is_documented(name: str) -> None:
    assert mentioned(name, documentation()), f"{name} is not documented in README.md or docs/"


def test_every_policy_field_is_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each field has its own `path` in docs/policy.md, the reference for the policy file."""
    text = (REPO / "docs" / "policy.md").read_text(encoding="utf-8")
    missing = [f for f in policy_fields(monkeypatch) if f"`{f}`" not in text]
    assert not missing, f"policy fields not documented in docs/policy.md: {missing}"


@pytest.mark.parametrize("name", metric_names())
def test_every_metric_is_documented(name: str) -> None:
    assert f"`{name}`" in documentation(), f"metric {name} is not documented in README.md or docs/"


@pytest.mark.parametrize("annotation", annotations())
def test_every_annotation_is_in_the_readme_table(annotation: str) -> None:
    """The README's annotation table is where a developer looks first."""
    assert f"| `{annotation}` |" in README.read_text(encoding="utf-8"), f"{annotation} is not in the README's table"


def test_the_readme_stays_an_overview() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference material into docs/"


# --- links -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path: Path) -> None:
    """Every relative link names an existing file, and its #anchor a heading in it."""
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{path.relative_to(REPO)}: {broken}"
