"""Kubernetes resource quantities (`24Gi`, `40G`, `16384Mi`, `1.5e9`), parsed exactly.

Follows k8s.io/apimachinery/pkg/api/resource: binary suffixes Ki..Ei, decimal suffixes n, u, m, k,
M..E, or a decimal exponent. Fractions of a unit round up, as Kubernetes does for byte values.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE]?)$")

MIB = 2**20


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def parse_quantity(text: str) -> Decimal:
    """The exact value of a quantity; raises QuantityError for anything Kubernetes would refuse."""
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (examples: 24Gi, 40G, 16384Mi)")
    number, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise QuantityError(f"{text!r} is not a number") from exc
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix[:1] in ("e", "E"):
        return value * (Decimal(10) ** int(suffix[1:]))
    return value * _DECIMAL[suffix]


def parse_bytes(text: str) -> int:
    """A byte quantity as whole bytes, rounded up."""
    return math.ceil(parse_quantity(text))


def parse_count(text: object) -> int:
    """A countable resource value (`8`, `"8"`, `1k`) as a whole number; fractions round down to what
    the device plugin really offers. Invalid values count as 0: a node that reports garbage has no GPUs
    we can promise."""
    if isinstance(text, bool):
        return 0
    if isinstance(text, int):
        return max(text, 0)
    try:
        return max(math.floor(parse_quantity(str(text))), 0)
    except QuantityError:
        return 0


def format_mib(mib: int) -> str:
    """Memory for people: `40Gi`, `23034Mi`."""
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"
