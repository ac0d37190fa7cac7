"""Kubernetes quantities as users write them in gpupool.io/min-memory and as nodes report counts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.domain.quantity import QuantityError, format_mib, parse_bytes, parse_count


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


@pytest.mark.parametrize(
    "text",
    ["٣Gi", "２", "²", "1e٣", "1.٥"],
    ids=["arabic-indic", "full-width", "superscript", "exponent-digit", "fraction-digit"],
)
def test_only_ascii_digits_are_digits(text: str) -> None:
    """Unicode digits are not quantities: Kubernetes reads ASCII digits only (Python's \\d and isdigit
    would accept these, and Decimal would even compute them)."""
    with pytest.raises(QuantityError):
        parse_bytes(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1" * 40_000 + "x", "40001 characters"),
        ("1e999999", "exponent is out of range"),
        ("1e999", "out of range"),
        ("9" * 30, "out of range"),
        ("-1Gi", "out of range"),
    ],
    ids=["long-digit-run", "huge-exponent", "beyond-int64", "many-digits", "negative"],
)
def test_hostile_quantities_are_refused_at_once_naming_the_problem(text: str, words: str) -> None:
    """Values that used to cost seconds (regex backtracking, a million-digit power of ten) are refused
    by the linear parser, with a message that shows a bounded part of the value."""
    with pytest.raises(QuantityError, match=words) as err:
        parse_bytes(text)
    assert len(str(err.value)) < 200


def test_counts_beyond_any_node_are_garbage() -> None:
    """A node or Pod reporting 1e5000 GPUs (or a YAML integer of thousands of digits) counts as none,
    without ever building the number's decimal digits."""
    assert (parse_count("1e5000"), parse_count(10**5000), parse_count("3000000000")) == (0, 0, 0)


@given(st.text(max_size=200) | st.from_regex(r"\A[+-]?[0-9]{0,80}(\.[0-9]{0,80})?([eE][+-]?[0-9]{0,8}|[KMGTPE]i?)?\Z"))
def test_any_text_is_a_byte_count_in_range_or_a_quantity_error(text: str) -> None:
    """Whatever the text, the parser answers: a whole number of bytes within an int64, or QuantityError."""
    try:
        value = parse_bytes(text)
    except QuantityError:
        return
    assert 0 <= value <= 2**63 - 1
