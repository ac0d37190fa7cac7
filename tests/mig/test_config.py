"""mig-parted's config read as hostile input: what mig-parted refuses is refused, naming the field."""

from __future__ import annotations

import pytest

from tests.mig.configs import OPERATOR_DEFAULT, operator_default
from webhook.mig.config import MAX_TEXT, MigConfigError, parse_config


def test_the_operators_default_is_read_entry_by_entry() -> None:
    config = operator_default()
    one = config.layouts["all-1g.10gb"]
    assert len(one.entries) == 2
    assert one.entries[0].device_filter[3].device_id == 0x20B210DE
    assert one.entries[1].mig_devices == (("1g.10gb", 4),)
    assert config.layouts["all-balanced"].entries[2].device_filter[0].text == "0x20B710DE"  # a single string
    # MIG-enabled: cut into instances; all-disabled and all-enabled (no instances) are not.
    assert "all-disabled" not in config.mig_enabled() and "all-enabled" not in config.mig_enabled()
    assert "all-3g.40gb" in config.mig_enabled()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mig-configs: {a: [{devices: all, mig-enabled: false}]}", "version: nothing is not v1"),
        ("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "version: 'v2' is not v1"),
        ("version: v1\nmig-configs: {}", "mig-configs: expected a mapping"),
        ("version: v1\nmig-configs: {a: []}", "mig-configs.a: expected a non-empty list"),
        ("version: v1\nextra: 1\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "'extra': unexpected"),
        ("version: v1\nmig-configs: {a: [{mig-enabled: false}]}", "mig-configs.a[0]: missing required field devices"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}", "missing required field mig-enabled"),
        ("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}", "mig-configs.a[0].devices"),
        ("version: v1\nmig-configs: {a: [{devices: [-1], mig-enabled: false}]}", "-1 is not a GPU index"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}", "mig-devices is required"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {1g.5gb: 1}}]}",
            "mig-configs.a[0].mig-devices: MIG devices are listed while mig-enabled is false",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {big: 1}}]}",
            "mig-configs.a[0].mig-devices: 'big' is not a MIG profile",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: -1}}]}",
            "mig-configs.a[0].mig-devices.1g.5gb: -1 is not a count",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: 0}}]}",
            "every count is 0",
        ),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: yes please}]}", "expected true or false"),
        ("version: v1\nmig-configs: [a]", "mig-configs: expected a mapping"),
        ("- a\n- b", "expected a mapping with version"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, device-filter: 7}]}", "device-filter"),
        ("a: [unclosed", "not valid YAML: line"),
    ],
)
def test_what_mig_parted_refuses_is_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(MigConfigError, match="mig-parted config: ") as raised:
        parse_config(text)
    assert message in str(raised.value)


def test_aliases_are_refused_so_a_few_bytes_cannot_stand_for_a_huge_document() -> None:
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(20)
    )
    with pytest.raises(MigConfigError, match="aliases are not accepted"):
        parse_config(laughs)


def test_size_and_nesting_are_bounded() -> None:
    with pytest.raises(MigConfigError, match="more than the 1048576 a ConfigMap can hold"):
        parse_config(OPERATOR_DEFAULT + "#" * MAX_TEXT)
    with pytest.raises(MigConfigError, match="nested too deeply|not valid YAML"):
        parse_config("[" * 50_000)
    many = "version: v1\nmig-configs:\n" + "".join(
        f"  l{i}: [{{devices: all, mig-enabled: false}}]\n" for i in range(1025)
    )
    with pytest.raises(MigConfigError, match="1025 layouts, more than the 1024"):
        parse_config(many)


def test_a_filter_mig_parted_cannot_read_makes_only_its_layout_unusable() -> None:
    config = parse_config(
        "version: v1\nmig-configs:\n"
        '  odd: [{device-filter: ["A100"], devices: all, mig-enabled: true, mig-devices: {"1g.10gb": 7}}]\n'
        '  fine: [{devices: all, mig-enabled: true, mig-devices: {"3g.40gb": 2}}]\n'
    )
    assert "mig-configs.odd[0].device-filter[0]: 'A100' is not a PCI device ID" in config.layouts["odd"].problem
    assert config.layouts["fine"].problem == ""


def test_a_name_that_cannot_be_a_label_value_is_never_chosen() -> None:
    name = "x" * 64
    config = parse_config(f"version: v1\nmig-configs:\n  {name}: [{{devices: all, mig-enabled: false}}]\n")
    assert "cannot be a label value" in config.layouts[name].problem
