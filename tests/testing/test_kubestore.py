"""The simulator's multi-version store (webhook/testing/kubestore.py), used directly, without HTTP."""

from __future__ import annotations

from tests.conftest import sim_pod as pod
from webhook.testing.kubestore import Store, kind_of


class TestStore:
    def test_a_snapshot_rebuilt_from_history_equals_the_one_taken_then(self) -> None:
        """Pages of an old list are served from the state at its resourceVersion, even when that
        snapshot is no longer cached and must be rebuilt by undoing later writes."""
        store = Store(snapshot_cache=0)  # nothing cached: every older snapshot is rebuilt
        store.load(pod(f"p{i:02d}") for i in range(30))
        pods = kind_of("pods")
        then = store.snapshot(pods)
        store.put(pod("p00", phase="Failed"), exists=True)
        store.remove(pods, "team-a", "p01")
        store.put(pod("p99"), exists=False)
        store.put({"kind": "Node", "metadata": {"name": "n"}}, exists=False)
        rebuilt = store.snapshot(pods, then.rv)
        assert (rebuilt.keys, rebuilt.bodies) == (then.keys, then.bodies)
        assert store.snapshot(pods).keys != then.keys

    def test_history_limit_expires_old_resource_versions(self) -> None:
        """Only the last `history_limit` writes stay replayable (plus slack), like a bounded watch cache."""
        store = Store(history_limit=8)
        first = store.rv
        store.load(pod(f"p{i}") for i in range(20))
        assert store.oldest_rv > first
        events, reached = store.events_after(store.oldest_rv, 100)
        assert reached == store.rv
        assert [e.rv for e in events] == list(range(store.oldest_rv + 1, store.rv + 1))
