"""`migReshaping`: off unless present; every field validated with its path."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tests.mig.configs import A100_80, OPERATOR_DEFAULT
from webhook.domain.policy import MigReshaping, PolicyError, load_policy_text
from webhook.mig.config import parse_config
from webhook.mig.layouts import Layouts

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_absent_is_off_and_an_empty_mapping_is_on_with_the_defaults() -> None:
    assert load_policy_text(None).mig_reshaping is None
    assert load_policy_text("migReshaping: null").mig_reshaping is None
    on = load_policy_text("migReshaping: {}").mig_reshaping
    assert on == MigReshaping()
    assert on.config_map == ("gpu-operator", "default-mig-parted-config")
    assert (on.configs, on.idle_seconds, on.max_in_flight, on.timeout_seconds, on.drain) == ((), 60.0, 2, 900.0, False)


def test_every_field_is_read() -> None:
    text = (
        "migReshaping:\n  configMap: nvidia/custom-mig-config\n  configs: [all-3g.40gb, all-balanced]\n"
        "  idleSeconds: 120\n  maxInFlight: 4\n  timeoutSeconds: 600\n"
    )
    assert load_policy_text(text).mig_reshaping == MigReshaping(
        ("nvidia", "custom-mig-config"), ("all-3g.40gb", "all-balanced"), 120.0, 4, 600.0
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("migReshaping: true", "migReshaping: expected a mapping, got True"),
        ("migReshaping: {every: 1}", "migReshaping.every: unknown field; accepted: configMap, configs"),
        ("migReshaping: {configMap: just-a-name}", "migReshaping.configMap: 'just-a-name' is not <namespace>/<name>"),
        ("migReshaping: {configMap: Bad_NS/x}", "migReshaping.configMap: 'Bad_NS/x' is not"),
        ("migReshaping: {configs: all-3g.40gb}", "migReshaping.configs: expected a list of strings"),
        ("migReshaping: {configs: ['a b']}", "migReshaping.configs: 'a b' cannot be a value of the label"),
        ("migReshaping: {configs: [x, x]}", "migReshaping.configs: names a layout twice"),
        ("migReshaping: {idleSeconds: -5}", "migReshaping.idleSeconds: expected a positive number of seconds"),
        ("migReshaping: {maxInFlight: 0}", "migReshaping.maxInFlight: expected a whole number from 1 to 1000"),
        ("migReshaping: {timeoutSeconds: soon}", "migReshaping.timeoutSeconds: expected a positive number"),
        ("migReshaping: {drain: 'no'}", "migReshaping.drain: expected true or false, got 'no'"),
    ],
)
def test_bad_values_name_the_field_and_what_is_accepted(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as raised:
        load_policy_text(text)
    assert message in str(raised.value)


def test_the_list_of_layouts_is_bounded() -> None:
    names = ", ".join(f"l{i}" for i in range(257))
    with pytest.raises(PolicyError, match="257 names, more than the 256 accepted"):
        load_policy_text(f"migReshaping: {{configs: [{names}]}}")


def documented_examples(doc: Path) -> list[str]:
    """The YAML blocks of `doc` that set `migReshaping`, dedented."""
    return [textwrap.dedent(b) for b in re.findall(r"```yaml\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
            if b.lstrip().startswith("migReshaping:")]  # fmt: skip


@pytest.mark.parametrize("doc", [DOCS / "policy.md", DOCS / "mig.md"], ids=lambda p: p.name)
def test_the_documented_examples_load_and_choose_layouts_of_the_operators_config(doc: Path) -> None:
    """Each example of the docs is a valid policy, and every layout it names is one the GPU Operator's
    default config has and gpupool can choose for an A100-80GB node."""
    (example,) = documented_examples(doc)
    settings = load_policy_text(example).mig_reshaping
    assert settings is not None and settings.configs
    usable = Layouts.choosable(parse_config(OPERATOR_DEFAULT), settings.configs).usable(A100_80, 8)
    assert sorted(usable) == sorted(settings.configs)


def test_the_policy_reference_example_says_what_it_sets() -> None:
    """docs/policy.md's example, as its comments describe it."""
    (example,) = documented_examples(DOCS / "policy.md")
    assert load_policy_text(example).mig_reshaping == MigReshaping(
        config_map=("gpu-operator", "default-mig-parted-config"),
        configs=("all-1g.10gb", "all-3g.40gb", "all-7g.80gb"),
        idle_seconds=300.0,
        max_in_flight=2,
        timeout_seconds=1200.0,
    )
