"""Kubernetes resource quantities (`24Gi`, `40G`, `16384Mi`, `1.5e9`), parsed exactly and in bounded time.

Follows k8s.io/apimachinery/pkg/api/resource: binary suffixes Ki..Ei, decimal suffixes n, u, m, k,
M..E, or a decimal exponent. Fractions of a unit round up, as Kubernetes does for byte values.

Every quantity gpupool parses may come from a hostile Pod, so the parser is one left-to-right scan over
ASCII digits (no regular expression that can backtrack, no Unicode digits), the text is bounded before
it is read, and so is the exponent: `1e999999` is refused at once instead of being computed.
"""

from __future__ import annotations

import math
from fractions import Fraction

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}  # powers of two
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}  # powers of ten
_DIGITS = frozenset("0123456789")
MAX_QUANTITY_CHARS = 64  # Kubernetes writes quantities in at most a few dozen characters
MAX_EXPONENT_DIGITS = 3  # `1e999` at most; larger exponents are refused before any arithmetic
MAX_BYTES = 2**63 - 1  # what Kubernetes can hold in an int64
MAX_COUNT = 2**31 - 1  # more devices than any node has; larger counts are garbage
EXAMPLES = "examples: 24Gi, 40G, 16384Mi"

MIB = 2**20
GIB = 1024 * MIB


class QuantityError(ValueError):
    """Not a Kubernetes quantity, or one out of range."""


def shown(value: object, limit: int = 40) -> str:
    """`value` as a message shows it, in at most about `limit` characters plus a note of the full size:
    a message never echoes the megabytes a hostile Pod sent, and never converts a huge number."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]  # as JSON and YAML write them
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if -(10**limit) < value < 10**limit else f"a {value.bit_length()}-bit integer"
    if isinstance(value, list | dict):
        return f"a {'list' if isinstance(value, list) else 'mapping'} of {len(value)} items"
    return type(value).__name__


def parse_quantity(text: object) -> Fraction:
    """The exact value of a quantity; raises QuantityError for anything Kubernetes would refuse."""
    if not isinstance(text, str) or len(text) > 2 * MAX_QUANTITY_CHARS:  # bound the strip() below too
        raise QuantityError(f"{shown(text)} is not a Kubernetes quantity ({EXAMPLES})")
    s = text.strip()
    n = len(s)
    if n > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"{shown(text)} is not a Kubernetes quantity ({EXAMPLES}; at most {MAX_QUANTITY_CHARS} characters)"
        )
    i = 1 if s[:1] in ("+", "-") else 0
    start = i
    while i < n and s[i] in _DIGITS:
        i += 1
    whole = s[start:i]
    fraction = ""
    if i < n and s[i] == ".":
        i += 1
        fstart = i
        while i < n and s[i] in _DIGITS:
            i += 1
        fraction = s[fstart:i]
    if not (whole or fraction):
        raise QuantityError(f"{shown(text)} is not a Kubernetes quantity ({EXAMPLES})")
    tens, twos = _suffix(s[i:], text)
    mantissa = int(whole + fraction)  # at most MAX_QUANTITY_CHARS ASCII digits
    tens -= len(fraction)
    value = Fraction(mantissa * 2**twos * 10 ** max(tens, 0), 10 ** max(-tens, 0))
    return -value if s[0] == "-" else value


def _suffix(suffix: str, text: str) -> tuple[int, int]:
    """(power of ten, power of two) the suffix multiplies by."""
    if suffix in _BINARY:
        return 0, _BINARY[suffix]
    if suffix in _DECIMAL:
        return _DECIMAL[suffix], 0
    if suffix[:1] in ("e", "E"):
        digits = suffix[2:] if suffix[1:2] in ("+", "-") else suffix[1:]
        if digits and len(digits) <= MAX_EXPONENT_DIGITS and all(c in _DIGITS for c in digits):
            exponent = int(digits)
            return (-exponent if suffix[1:2] == "-" else exponent), 0
        if digits and all(c in _DIGITS for c in digits):
            raise QuantityError(f"{shown(text)}: the exponent is out of range (at most {'9' * MAX_EXPONENT_DIGITS})")
    raise QuantityError(f"{shown(text)} is not a Kubernetes quantity ({EXAMPLES})")


def parse_bytes(text: object) -> int:
    """A byte quantity as whole bytes, rounded up; QuantityError when negative or beyond an int64."""
    value = parse_quantity(text)
    if value < 0 or value > MAX_BYTES:
        raise QuantityError(f"{shown(text)} is out of range: accepted from 0 to {MAX_BYTES} bytes")
    return math.ceil(value)


def parse_count(text: object) -> int:
    """A countable resource value (`8`, `"8"`, `1k`) as a whole number; fractions round down to what
    the device plugin really offers. Invalid or absurd values count as 0: a node that reports garbage
    has no GPUs we can promise."""
    if isinstance(text, bool):
        return 0
    if isinstance(text, int):
        return text if 0 <= text <= MAX_COUNT else 0
    try:
        value = parse_quantity(text)
    except QuantityError:
        return 0
    return math.floor(value) if 0 <= value <= MAX_COUNT else 0


def parse_milli(text: object) -> int | None:
    """A CPU quantity (`2`, `500m`, `1.5`) in millicores, rounded up as Kubernetes rounds them; None for
    anything that is not a quantity or is negative."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text * 1000 if 0 <= text <= MAX_BYTES // 1000 else None
    try:
        value = parse_quantity(text)
    except QuantityError:
        return None
    return math.ceil(value * 1000) if 0 <= value * 1000 <= MAX_BYTES else None


def format_mib(mib: int) -> str:
    """Memory for people: `40Gi`, `23034Mi`."""
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"
