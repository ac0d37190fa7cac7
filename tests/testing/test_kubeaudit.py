"""The simulator's audit log (webhook/testing/kubeaudit.py): every write, in order, with the time the store
made it, for benchmarks that judge a client from the cluster's side."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from tests.conftest import sim_pod as pod
from webhook.testing.kubeaudit import AuditLog
from webhook.testing.kubestore import Store, kind_of


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


class TestAuditLog:
    def test_every_write_is_logged_in_order_with_its_object_and_store_time(self, tmp_path: Path) -> None:
        """Writes before the log started are not in it; each later one is, in resourceVersion order, with the
        object as stored (a deletion: its last state) and a store time between the writer's clock readings."""
        store = Store()
        store.load([pod("before")])
        audit = AuditLog(store, tmp_path / "audit.jsonl").start()
        began = time.monotonic()
        store.put(pod("p", phase="Pending"), exists=False)
        store.put(pod("p", phase="Running"), exists=True)
        store.remove(kind_of("pods"), "team-a", "p")
        ended = time.monotonic()
        audit.stop()
        logged = lines(tmp_path / "audit.jsonl")
        assert [(e["type"], e["key"]) for e in logged] == [
            ("ADDED", "team-a/p"),
            ("MODIFIED", "team-a/p"),
            ("DELETED", "team-a/p"),
        ]
        assert [e["rv"] for e in logged] == list(range(logged[0]["rv"], logged[0]["rv"] + 3))
        assert all(began <= e["at"] <= ended for e in logged)
        assert [e["at"] for e in logged] == sorted(e["at"] for e in logged)
        assert logged[1]["object"]["status"]["phase"] == "Running"
        assert logged[2]["object"]["metadata"]["name"] == "p" and logged[0]["kind"] == "Pod"
        assert audit.stats() == {"lines": 3, "gaps": 0}

    def test_only_the_kinds_asked_for_are_logged(self, tmp_path: Path) -> None:
        store = Store()
        audit = AuditLog(store, tmp_path / "audit.jsonl", kinds=["nodes"]).start()
        store.put(pod("p"), exists=False)
        store.put({"kind": "Node", "metadata": {"name": "n"}}, exists=False)
        audit.stop()
        assert [(e["kind"], e["key"]) for e in lines(tmp_path / "audit.jsonl")] == [("Node", "n")]

    def test_a_log_that_fell_behind_the_history_says_where_writes_are_missing(self, tmp_path: Path) -> None:
        """Writes the history no longer holds cannot be logged: a gap line says up to which resourceVersion,
        and the writes after it are logged again."""
        store = Store(history_limit=4)
        audit = AuditLog(store, tmp_path / "audit.jsonl")  # not started: it falls behind at once
        store.load(pod(f"p{i}") for i in range(20))
        audit.start()
        time.sleep(0.5)  # the thread finds the gap
        store.put(pod("after"), exists=False)
        audit.stop()
        logged = lines(tmp_path / "audit.jsonl")
        assert logged[0] == {"gap": True, "rv": logged[0]["rv"]} and audit.stats()["gaps"] == 1
        assert [e["key"] for e in logged[1:]] == ["team-a/after"]
