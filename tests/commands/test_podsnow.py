"""`gpupool explain`'s `Pods:` line (webhook.commands.podsnow), in each of its forms."""

from __future__ import annotations

import pytest

from webhook.commands.podsnow import PodsNow
from webhook.domain.model import PoolKey

T4 = PoolKey("nvidia", "medium", "Tesla-T4")
L4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
WAITS = "would wait: no node of Tesla-T4 has 2 free now"


@pytest.mark.parametrize(
    ("pods", "line"),
    [
        (PodsNow(2, 2, 2, ((T4, 2),), queued=False), f"Pods: both fit now (2 on {T4})"),
        (PodsNow(3, 3, 3, ((T4, 2), (L4, 1)), queued=True),
         f"Pods: all 3 would be released now (2 to {T4}, 1 to {L4})"),
        (PodsNow(2, 2, 1, ((T4, 1),), queued=True, rest=WAITS),
         f"Pods: 1 of the 2 would be released now (1 to {T4}); the other one {WAITS}"),
        (PodsNow(4, 4, 0, (), queued=False, rest="would be denied (no-capacity): no capacity"),
         "Pods: none of the 4 fits now; they would be denied (no-capacity): no capacity"),
        (PodsNow(512, 10000, 512, ((T4, 512),), queued=False),
         f"Pods: all 512 fit now (512 on {T4}) (the first 512 of 10000 decided)"),
    ],
    ids=["both", "all-queued", "one-other", "none", "capped"],
)  # fmt: skip
def test_the_line_says_how_many_fit_where_and_what_the_rest_get(pods: PodsNow, line: str) -> None:
    assert pods.text() == line
