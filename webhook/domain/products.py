"""GPU product names: token-exact matching, and driver versions.

GPU Feature Discovery writes the product with spaces turned into dashes (`NVIDIA-A100-SXM4-40GB`), and
names a device by its product: `-SHARED` for a time-sliced or MPS replica, `-MIG-<profile>` for a MIG
instance (webhook.domain.devices takes those apart; they are part of the device, not dropped).
Matching works on whole tokens so that `A100` never matches `A10` and `H20` never matches `H200`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_SPLIT = re.compile(r"[-_\s/]+")

Tokens = tuple[str, ...]


def tokens(name: str, prefixes: Iterable[str] = ()) -> Tokens:
    """Lower-case tokens of a product name, vendor prefixes (`NVIDIA`, `Tesla`) dropped from the front."""
    parts = [p for p in _SPLIT.split(name.lower()) if p]
    drop = {p.lower() for p in prefixes}
    while len(parts) > 1 and parts[0] in drop:
        parts.pop(0)
    return tuple(parts)


def without_prefixes(name: str, prefixes: Iterable[str] = ()) -> str:
    """A product name as `gpupool.io/gpu-product` gives it: its tokens as written, vendor prefixes dropped
    from the front (`NVIDIA-H100-80GB-HBM3` -> `H100-80GB-HBM3`); its tokens are the name's."""
    parts = [p for p in _SPLIT.split(name) if p]
    drop = {p.lower() for p in prefixes}
    while len(parts) > 1 and parts[0].lower() in drop:
        parts.pop(0)
    return "-".join(parts)


def matches(query: Tokens, product: Tokens) -> bool:
    """True when every query token appears in the product, in order: `A100-80GB` matches
    `A100-SXM4-80GB`; `A10` does not match `A100`."""
    if not query:
        return False
    it = iter(product)
    return all(any(tok == p for p in it) for tok in query)


MAX_VERSION_CHARS = 64
_MAX_VERSION_PART = 9  # digits per part: more than any driver or CUDA version has, and int() stays cheap


def parse_version(text: str) -> tuple[int, ...] | None:
    """A dotted version (`535`, `535.104.05`) as numbers, or None when it is not one. ASCII digits only:
    `str.isdigit` also accepts `²` and `٣`, which int() then refuses or reads as another number."""
    if len(text) > MAX_VERSION_CHARS:
        return None
    parts = text.strip().split(".")
    if len(parts) > 4 or not all(0 < len(p) <= _MAX_VERSION_PART and p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def version_at_least(have: tuple[int, ...], need: tuple[int, ...]) -> bool:
    """Compare versions of different lengths as if padded with zeros (`535` == `535.0.0`)."""
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


def format_version(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)
