"""What the admission path remembers of Pods (webhook.pools.memo: shapes, requests, patches, decision
plans) is bounded in bytes: a stream of distinct large Pods leaves nothing behind, and what every entry
is weighed at covers what it really holds, measured with tracemalloc. (RSS under 10,000 such Pods:
bench/bench_memo.py.)"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.admission.core import Admitter
from webhook.domain.policy import load_policy
from webhook.pools.memo import Memo
from webhook.sources.snapshot import SnapshotInventory, build_index, parse_objects

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
POLICY = load_policy(str(EXAMPLES / "policy.yaml"))
LONG_KEY = "tolerations." + "x" * 187 + ".example.com/" + "k" * 58  # a 264-character key Kubernetes allows


OBJECTS = parse_objects((EXAMPLES / "cluster.yaml").read_bytes(), "cluster.yaml")


def admitter() -> Admitter:
    """A worker's Admitter on the demo inventory, its memos empty."""
    return Admitter(POLICY, SnapshotInventory(build_index(OBJECTS, POLICY), "demo"))


def gpu_pod(tolerations: list[dict[str, str]], **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "train-",
            "namespace": "ml",
            "annotations": {"gpupool.io/gpu-class": "medium", **annotations},
        },
        "spec": {"containers": [{"name": "main", "image": "registry.example/train:1.0"}], "tolerations": tolerations},
    }


def large_pod(i: int) -> bytes:
    """A valid 410 KB Pod: 1,024 long tolerations, distinct from every other in one value."""
    tolerations = [
        {"key": f"{LONG_KEY}{n:05d}", "operator": "Equal", "value": "v" * 63, "effect": "NoSchedule"}
        for n in range(1024)
    ]
    tolerations[0]["value"] = f"{i:063d}"
    return orjson.dumps(gpu_pod(tolerations))


def memos(adm: Admitter) -> list[Memo]:
    """The shape memo of the policy the Admitter decides by, and the decision plans' (the index's)."""
    with adm.inventory.read() as index:
        return [adm.bound.shapes, index._capacity._memo]


@contextmanager
def traced() -> Iterator[None]:
    """tracemalloc on only around what is measured: tracing the Pods' building, the warm-up and
    hypothesis' own drawing made this module 3-4 times slower. Tracing from later is no looser: a block
    freed in the measured part that was allocated before it no longer counts against what it left behind.

    The objects that exist before are frozen out of the cycle collector meanwhile (gc.freeze), so each
    `retained` collects only what was made since: a full collection of the whole test process took about
    50 ms, more than half the module's time. Nothing traced is frozen: a cycle left by what is measured is
    still collected before it is counted."""
    gc.freeze()
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()
        gc.unfreeze()


def retained() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def test_distinct_large_pods_leave_nothing_behind() -> None:
    """40 dry runs of distinct 410 KB Pods (each remembered whole, they grew the worker by about 1 MiB
    apiece, for good): the Pods are answered as before and the memory they leave behind stays under 2 MiB."""
    adm = admitter()
    bodies = [large_pod(i) for i in range(40)]
    assert adm.admit(orjson.loads(bodies[0]), namespace="ml", dry_run=True).placement is not None
    with traced():
        before = retained()
        for body in bodies[1:]:
            verdict = adm.admit(orjson.loads(body), namespace="ml", dry_run=True)
            assert verdict.placement is not None, verdict.message
        left = retained() - before
    assert left < 2 * 1024 * 1024


def test_ordinary_pods_are_still_remembered() -> None:
    """The common case keeps its memo: a Pod seen before is not decided again."""
    adm = admitter()
    body = orjson.dumps(gpu_pod([{"key": "dedicated", "operator": "Exists"}]))
    adm.admit(orjson.loads(body), namespace="ml", dry_run=True)
    sizes = [len(m) for m in memos(adm)]
    assert all(sizes)
    adm.admit(orjson.loads(body), namespace="ml", dry_run=True)
    assert [len(m) for m in memos(adm)] == sizes


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80)


@settings(max_examples=25, deadline=None)
@given(
    tolerations=st.lists(
        st.fixed_dictionaries(
            {"key": TEXT, "operator": st.sampled_from(["Equal", "Exists"]), "value": TEXT, "effect": TEXT}
        ),
        max_size=40,
    ),
    memory=st.integers(1000, 9999),
    product=st.sampled_from(["T4", "L4", "A100", "H100", "T4-SHARED"]),
    terms=st.lists(
        st.lists(
            st.fixed_dictionaries(
                {
                    "key": TEXT.filter(bool),
                    "operator": st.just("NotIn"),
                    "values": st.lists(TEXT, min_size=1, max_size=8),
                }
            ),
            min_size=1,
            max_size=4,
        ),
        max_size=4,
    ),
)
def test_every_entry_is_weighed_at_least_at_what_it_holds(
    tolerations: list[dict[str, str]], memory: int, product: str, terms: list[list[dict[str, Any]]]
) -> None:
    """For Pods of any tolerations and required node-affinity terms (any characters: a string of wide
    ones takes up to 4 bytes each) the memos' weights (Memo.held_bytes) are at least the memory the
    admission left behind: what the budget counts is what the worker holds."""
    adm = admitter()
    adm.admit(orjson.loads(orjson.dumps(gpu_pod([]))), namespace="ml", dry_run=True)  # tables and caches made
    held = [m.held_bytes for m in memos(adm)]
    obj = gpu_pod(tolerations, **{"gpupool.io/min-memory": f"{memory}Mi", "gpupool.io/gpu-product": product})
    if terms:
        obj["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": expressions} for expressions in terms]
                }
            }
        }
    body = orjson.dumps(obj)
    with traced():
        before = retained()
        adm.admit(orjson.loads(body), namespace="ml", dry_run=True)
        left = retained() - before
    weighed = sum(m.held_bytes for m in memos(adm)) - sum(held)
    assert left <= weighed, (left, weighed)
