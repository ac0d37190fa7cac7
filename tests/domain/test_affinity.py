"""Node requirements as kube-scheduler reads them, checked against the independent oracle in tests/scheduling.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests import scheduling
from webhook.domain.affinity import (
    DOES_NOT_EXIST,
    EXISTS,
    GT,
    IN,
    LT,
    NOT_IN,
    NodeRequirements,
    PoolConstraint,
    Requirement,
    Term,
    parse_int64,
    read_affinity,
)

KEYS = st.sampled_from(["a", "b", "c"])
VALUES = st.sampled_from(["x", "y", "1", "10", "-3", "+2", "1_0", "0x2"])


@st.composite
def requirements(draw: st.DrawFn) -> Requirement:
    op = draw(st.sampled_from([IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT]))
    if op in (EXISTS, DOES_NOT_EXIST):
        values: tuple[str, ...] = ()
    elif op in (GT, LT):
        values = (draw(st.sampled_from(["0", "5", "-1"])),)
    else:
        values = tuple(draw(st.lists(VALUES, min_size=1, max_size=3)))
    return Requirement(draw(KEYS), op, values)


TERMS = st.lists(
    st.builds(
        Term,
        expressions=st.lists(requirements(), max_size=3).map(tuple),
        fields=st.lists(st.sampled_from(["n1", "n2"]), max_size=1).map(
            lambda names: tuple(Requirement("metadata.name", IN, (n,)) for n in names)
        ),
    ),
    min_size=1,
    max_size=3,
).map(tuple)
LABELS = st.dictionaries(KEYS, VALUES, max_size=3)


def as_pod(req: NodeRequirements) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": dict(req.selector)}
    if req.terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [t.as_json() for t in req.terms]
                }
            }
        }
    return {"spec": spec}


@settings(max_examples=300, deadline=None)
@given(
    selector=st.dictionaries(KEYS, VALUES, max_size=2),
    terms=st.one_of(st.none(), TERMS),
    name=st.sampled_from(["n1", "n2", "n3"]),
    labels=LABELS,
)
def test_requirements_match_as_the_scheduler_reads_them(
    selector: dict[str, str], terms: tuple[Term, ...] | None, name: str, labels: dict[str, str]
) -> None:
    """For any nodeSelector, terms (every operator, matchFields on metadata.name) and node: the same
    answer as Kubernetes' rules, written independently in tests/scheduling.py."""
    req = NodeRequirements(tuple(sorted(selector.items())), terms)
    node = {"metadata": {"name": name, "labels": labels}}
    assert req.matches(name, labels) == scheduling.selects(as_pod(req), node)


@settings(max_examples=300, deadline=None)
@given(
    selector=st.dictionaries(KEYS, VALUES, max_size=2),
    terms=st.one_of(st.none(), TERMS),
    pool_selector=st.dictionaries(st.sampled_from(["p", "q"]), VALUES, max_size=2),
    expressions=st.lists(requirements(), max_size=3).map(tuple),
    labels=st.dictionaries(st.sampled_from(["a", "b", "c", "p", "q"]), VALUES, max_size=5),
)
# Found by make fuzz: a term with no requirement matches no node; appending the pool's to it made it match.
@example(selector={}, terms=(Term(),), pool_selector={}, expressions=(Requirement("a", NOT_IN, ("x",)),), labels={})
def test_within_a_pool_is_the_pods_own_requirements_and_the_pools(
    selector: dict[str, str],
    terms: tuple[Term, ...] | None,
    pool_selector: dict[str, str],
    expressions: tuple[Requirement, ...],
    labels: dict[str, str],
) -> None:
    """ANDing the pool's constraint into every term reaches exactly the nodes both allow."""
    own = NodeRequirements(tuple(sorted(selector.items())), terms)
    pool = PoolConstraint(tuple(sorted(pool_selector.items())), expressions)
    clash = any(k in selector and selector[k] != v for k, v in pool_selector.items())
    combined = own.within(pool)
    if clash:
        return  # the pool is no candidate for such a Pod (its nodeSelector key would change)
    assert combined.matches("n1", labels) == (own.matches("n1", labels) and pool.matches(labels))


def test_an_empty_term_matches_no_node() -> None:
    """A term with no requirement matches nothing, as the scheduler reads it; the other terms still count."""
    assert not NodeRequirements((), (Term(),)).matches("n", {"a": "x"})
    assert NodeRequirements((), (Term(), Term((Requirement("a", EXISTS),)))).matches("n", {"a": "x"})


@pytest.mark.parametrize(
    ("text", "value"),
    [("5", 5), ("+5", 5), ("-5", -5), ("9223372036854775807", 2**63 - 1), ("1_0", None), ("0x2", None), (" 5", None),
     ("٥", None), ("9223372036854775808", None), ("", None), ("-", None)],
)  # fmt: skip
def test_gt_and_lt_read_integers_as_go_does(text: str, value: int | None) -> None:
    """Base-10 int64 with an optional sign and ASCII digits only; anything else matches no Gt/Lt."""
    assert parse_int64(text) == value


def test_the_kubectl_words_of_each_operator() -> None:
    constraint = PoolConstraint(
        (("nvidia.com/gpu.product", "Tesla-T4"),),
        (
            Requirement("gpu.accelerator/class", NOT_IN, ("high", "low")),
            Requirement("nvidia.com/gpu.replicas", DOES_NOT_EXIST),
            Requirement("nvidia.com/gpu.count", IN, ("4", "8")),
        ),
    )
    assert constraint.text() == (
        "nvidia.com/gpu.product=Tesla-T4, gpu.accelerator/class notin (high,low), !nvidia.com/gpu.replicas, "
        "nvidia.com/gpu.count in (4,8)"
    )


def test_the_affinity_is_read_with_its_structure() -> None:
    """How deep the Pod's affinity goes decides what a patch adds whole; each term says whether it has a
    matchExpressions list."""
    assert read_affinity({}).level == 0 and read_affinity({}).required is None
    assert read_affinity({"affinity": {}}).level == 1
    assert read_affinity({"affinity": {"nodeAffinity": {}}}).level == 2
    view = read_affinity(
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                            {"matchExpressions": []},
                        ]
                    }
                }
            }
        }
    )
    assert view.listed == (False, True)
    assert view.required == (Term((), (Requirement("metadata.name", IN, ("n1",)),)), Term())
