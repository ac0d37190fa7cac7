"""GPU memory as cards are sold, and the one rule `gpupool.io/min-memory` is met by.

A card is sold by a size (`NVIDIA-A100-SXM4-80GB`, a `24GB` L4, a MIG instance `3g.40gb`) and GPU Feature
Discovery reports a little less, what the driver leaves usable (`nvidia.com/gpu.memory`, MiB): an L4
23034 MiB, an A10 23028, an RTX 4090 24564, a T4 15360, an H100 80GB 81559. People ask for the size they
bought (`min-memory: 24Gi`), so the size as sold is what a request is compared with.

- **Sold size.** A MIG instance's is its profile's `.NNgb`; a whole card's is the `NNGB` token of its
  product name, else the product table's `memory`; unknown otherwise. A sold "GB" counts as a GiB
  (`24GB` is 24Gi, 24576 MiB): vendors size cards in binary units and sell them as "GB", and no card
  reports more than its binary size, so `24Gi` and `24G` both reach a 24 GB card and `25Gi` never does.
- **Trusted within `TOLERANCE_PERCENT`.** The sold size counts only while the reported memory is at
  least 90% of it (every card and MIG profile above reports 93% or more); a device reporting less (a
  mislabelled node, a product name that lies) offers what it reports.
- **Offered memory** (`offered_mib`): the sold size so trusted, or the reported memory when it is more
  or when nothing is sold; `min-memory` is met when it is at least the value (`meets_memory`).

GPU-memory quotas count reported memory, not this: they count what Pods hold.
"""

from __future__ import annotations

import re

from webhook.domain.devices import profile_gb, split_product
from webhook.domain.quantity import format_mib

TOLERANCE_PERCENT = 90  # the sold size counts while the reported memory is at least this share of it
_SOLD = re.compile(r"([0-9]{1,4})GB", re.ASCII | re.IGNORECASE)  # a product name's size token: `80GB`
GIB_MIB = 1024


def sold_mib(product: str, table_mib: int = 0) -> int:
    """The size a device is sold as, in MiB (a sold GB is a GiB): a MIG product's or profile's `.NNgb`,
    else the `NNGB` token of its model's name, else `table_mib` (the product table's memory); 0 when
    unknown. `product` is GFD's product (`NVIDIA-A100-SXM4-40GB-MIG-3g.20gb`) or a bare profile."""
    if profile_gb(product):
        return profile_gb(product) * GIB_MIB
    parts = split_product(product)
    if parts.profile:
        return profile_gb(parts.profile) * GIB_MIB
    for token in parts.model.split("-"):
        match = _SOLD.fullmatch(token)
        if match and int(match.group(1)):
            return int(match.group(1)) * GIB_MIB
    return table_mib


def offered_mib(sold: int, reported: int) -> int:
    """The memory `min-memory` is compared with: the size as sold while the reported memory is within
    TOLERANCE_PERCENT of it, else what is reported (0 when neither is known)."""
    if sold and reported * 100 >= sold * TOLERANCE_PERCENT:
        return max(sold, reported)
    return reported


def meets_memory(min_mib: int, sold: int, reported: int) -> bool:
    """Does a device sold as `sold` MiB and reporting `reported` MiB meet `min-memory` of `min_mib`?"""
    return offered_mib(sold, reported) >= min_mib


def memory_shortfall(min_mib: int, sold: int, reported: int) -> str:
    """Why a device does not meet `min-memory` of `min_mib`, both its figures shown (`24Gi as sold
    (23034Mi reported) < min-memory 25Gi`); "" when it does, or when nothing is asked."""
    if not min_mib or meets_memory(min_mib, sold, reported):
        return ""
    return f"{describe_memory(sold, reported)} < min-memory {format_mib(min_mib)}"


def describe_memory(sold: int, reported: int) -> str:
    """Both figures for people: `24Gi as sold (23034Mi reported)`; the reported one alone when that is
    all there is, or all that counts; `unknown memory` when neither is known."""
    if not reported and not sold:
        return "unknown memory"
    if not sold or sold == reported:
        return format_mib(reported)
    if reported * 100 < sold * TOLERANCE_PERCENT:
        return f"{format_mib(reported)} reported (under {TOLERANCE_PERCENT}% of {format_mib(sold)} as sold)"
    return f"{format_mib(sold)} as sold ({format_mib(reported)} reported)"
