"""Kubernetes quantities as users write them in gpupool.io/min-memory and as nodes report counts."""

from __future__ import annotations

import pytest

from webhook.quantity import QuantityError, format_mib, parse_bytes, parse_count


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24Gi", 24 * 2**30),
        ("40G", 40 * 10**9),
        ("16384Mi", 16384 * 2**20),
        ("1.5Gi", 3 * 2**29),
        ("1e3", 1000),
        ("2E2", 200),
        ("100m", 1),  # a tenth of a byte rounds up to a whole byte
        ("+5k", 5000),
    ],
    ids=["binary", "decimal", "mebibytes", "fraction", "exponent", "upper-exponent", "milli-rounds-up", "plus"],
)
def test_parse_bytes_accepts_what_kubernetes_accepts(text: str, expected: int) -> None:
    """Every quantity form Kubernetes accepts gives its exact byte value."""
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "24GB", "24 Gi", "Gi", "twenty", "1.2.3", "24gi", "0x10"])
def test_parse_bytes_refuses_non_quantities(text: str) -> None:
    """Strings Kubernetes would refuse are refused with a message that shows them and examples."""
    with pytest.raises(QuantityError, match="24Gi"):
        parse_bytes(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("8", 8), (8, 8), ("1k", 1000), ("2.5", 2), ("-1", 0), ("bogus", 0), (True, 0), (None, 0)],
)
def test_parse_count_never_promises_gpus_a_node_does_not_report(value: object, expected: int) -> None:
    """Counts are whole and never negative; garbage counts as no GPUs rather than an error."""
    assert parse_count(value) == expected


def test_format_mib_prefers_whole_gibibytes() -> None:
    """Memory is shown as people write it."""
    assert (format_mib(40960), format_mib(23034)) == ("40Gi", "23034Mi")
