"""A long list of node-affinity values kept as one string: read, compared and hashed as the tuple it
stands for, and one copy per distinct list."""

from __future__ import annotations

import pickle

from hypothesis import example, given
from hypothesis import strategies as st

from webhook.domain.affinity import IN, NOT_IN, Requirement, read_affinity
from webhook.domain.packed import PACK_AT, PackedValues, packed

LONG = tuple(f"rack-{i:03d}" for i in range(PACK_AT + 4))

# Values that try to fool a search in the joined text: separators and quotes of any encoding, empty ones.
TRICKY = st.text(alphabet=st.sampled_from(["a", ",", '"', "\\", "\n", " ", "é"]), max_size=4)


class TestReadAsTheTuple:
    @given(values=st.lists(TRICKY, min_size=PACK_AT + 1, max_size=PACK_AT + 8), probe=TRICKY)
    @example(values=["a,", ",b", *LONG], probe=",")
    @example(values=["", *LONG], probe="")
    @example(values=[*LONG, "x"], probe="rack-000\nrack-001")
    def test_membership_length_order_and_equality_are_the_tuples(self, values: list[str], probe: str) -> None:
        """Whatever the values, the kept form answers `in` exactly as the tuple does, lists them in order,
        and is equal to and hashes as the tuple: a requirement holding it is the requirement."""
        as_tuple = tuple(values)
        kept = packed(as_tuple)
        assert (probe in kept) == (probe in as_tuple)
        assert tuple(kept) == as_tuple and len(kept) == len(as_tuple) and kept[0] == as_tuple[0]
        assert kept == as_tuple and as_tuple == kept and hash(kept) == hash(as_tuple)
        assert Requirement("k", IN, kept) == Requirement("k", IN, as_tuple)
        assert hash(Requirement("k", IN, kept)) == hash(Requirement("k", IN, as_tuple))

    def test_a_node_matches_a_packed_requirement_as_it_matches_the_tuple(self) -> None:
        """`In` and `NotIn` over a packed list: the node with a listed value matches, one whose value is a
        piece of a listed one (or two listed ones joined) does not."""
        kept = Requirement("rack", IN, packed(LONG))
        assert isinstance(kept.values, PackedValues)
        assert kept.matches({"rack": "rack-003"})
        assert not kept.matches({"rack": "rack-00"})
        assert not kept.matches({"rack": "rack-000\nrack-001"})
        assert not kept.matches({})
        assert Requirement("rack", NOT_IN, packed(LONG)).matches({"rack": "rack-00"})
        assert kept.as_json()["values"] == list(LONG)

    def test_short_lists_and_lists_with_a_newline_stay_tuples(self) -> None:
        """Which form a list takes depends on its values alone: few values, or a newline in one, a tuple."""
        assert type(packed(LONG[:PACK_AT])) is tuple
        assert type(packed((*LONG, "a\nb"))) is tuple
        assert type(packed(LONG)) is PackedValues

    def test_a_packed_list_survives_a_pickle(self) -> None:
        assert pickle.loads(pickle.dumps(packed(LONG))) == LONG


class TestOneCopy:
    def test_equal_lists_share_one_object(self) -> None:
        """Two Pods decoded apart (their own strings) that list the same values hold one object."""
        first = packed(tuple("".join(["rack-", str(i)]) for i in range(40)))
        second = packed(tuple("".join(["rack-", str(i)]) for i in range(40)))
        assert first is second
        assert packed(tuple(f"rack-{i}" for i in range(41))) is not first

    def test_the_affinity_read_shares_the_values_of_equal_requirements(self) -> None:
        """A Pod's required node affinity read twice (as the index and the queue each read it) holds one
        copy of each long list of values."""

        def spec() -> dict[str, object]:
            values = [f"node-{i:04d}" for i in range(256)]
            expression = {"key": "kubernetes.io/hostname", "operator": "In", "values": values}
            term = {"matchExpressions": [expression]}
            return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term]}}}}  # fmt: skip

        first, second = read_affinity(spec()), read_affinity(spec())
        assert first == second
        assert first.terms[0].expressions[0].values is second.terms[0].expressions[0].values
