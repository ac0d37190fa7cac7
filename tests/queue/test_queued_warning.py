"""The warning kubectl shows a Pod that gpupool queues: whole after the webhook's 120-character limit, with
the command that shows the Pod's place, as a namespace user types it."""

from __future__ import annotations

import pytest

from tests.builders import gpu_node, index_of, pod, policy
from webhook.admission.core import evaluate
from webhook.serving.review import shorten_warning

LONGEST_NAMESPACE = "n" * 63  # a DNS label's most


@pytest.mark.parametrize("namespace", ["q", LONGEST_NAMESPACE], ids=["short", "longest-namespace"])
def test_the_queued_warning_names_kubectl_gpupool_queue_whole(namespace: str) -> None:
    """The command comes first, so even a 63-character namespace keeps it; an everyday one keeps it all."""
    pol = policy(f"namespaces:\n  {namespace}: {{placement: queue}}\n")
    index = index_of([gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034)], pol)
    obj = pod("train", namespace, annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": "2"})
    result = evaluate(obj, namespace, pol, index)
    assert result.queued
    (shown,) = [shorten_warning(w) for w in result.warnings]
    assert f"(see kubectl gpupool queue -n {namespace}):" in shown
    if namespace == "q":  # a namespace of everyday length: the whole warning
        assert shown == (
            "gpupool: queued (see kubectl gpupool queue -n q): waits for 2 free GPUs (nvidia.com/gpu) on one node "
            "of its pools"
        )
