"""Product names: matching is token-exact, device products included; driver versions."""

from __future__ import annotations

import pytest

from webhook.domain.products import matches, parse_version, tokens, version_at_least

NV = ("NVIDIA", "Tesla")


@pytest.mark.parametrize(
    ("query", "product", "expected"),
    [
        ("A100", "NVIDIA-A100-SXM4-40GB", True),
        ("A100", "A100-PCIE-80GB", True),
        ("A10", "NVIDIA-A100-SXM4-40GB", False),
        ("A100", "NVIDIA-A10", False),
        ("H20", "NVIDIA-H200", False),
        ("H200", "NVIDIA-H20", False),
        ("H20", "NVIDIA-H20", True),
        ("a100-80gb", "NVIDIA-A100-SXM4-80GB", True),
        ("80GB-A100", "NVIDIA-A100-SXM4-80GB", False),
        ("NVIDIA-A100", "A100-SXM4-40GB", True),
        ("Tesla-T4", "Tesla-T4", True),
        ("T4", "Tesla-T4", True),
        ("RTX-4090", "NVIDIA-GeForce-RTX-4090", True),
        ("RTX4090", "NVIDIA-GeForce-RTX-4090", False),
        ("3g.20gb", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", True),
        ("A100-MIG", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", True),
        ("3g.20gb", "NVIDIA-A100-SXM4-40GB-MIG-3g.40gb", False),
        ("T4-SHARED", "Tesla-T4-SHARED", True),
    ],
)
def test_product_tokens_match_whole_tokens_in_order(query: str, product: str, expected: bool) -> None:
    """`A100` matches every A100 and never an A10; `H20` never matches `H200`; prefixes are optional."""
    assert matches(tokens(query, NV), tokens(product, NV)) is expected


def test_prefix_alone_is_still_a_token() -> None:
    """A product that is only a prefix word keeps it, so it can still be matched."""
    assert tokens("NVIDIA", NV) == ("nvidia",)


@pytest.mark.parametrize(
    ("have", "need", "ok"),
    [("535.104.05", "535", True), ("535", "535.0.0", True), ("525.60.13", "535", False), ("550.54.15", "545.23", True)],
)
def test_driver_versions_compare_numerically(have: str, need: str, ok: bool) -> None:
    """Dotted versions compare part by part as numbers, shorter ones padded with zeros."""
    h, n = parse_version(have), parse_version(need)
    assert h is not None and n is not None
    assert version_at_least(h, n) is ok


@pytest.mark.parametrize("text", ["", "535.", "v535", "535.104.05.1.2", "five"])
def test_parse_version_refuses_non_versions(text: str) -> None:
    """Only dotted numbers are versions."""
    assert parse_version(text) is None
