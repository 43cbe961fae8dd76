"""The replay store (issue 9 item 8): the per-session index is bounded with the records and keyed
by tenant and session; the JSONL sink round-trips; listeners see every record and outcome."""

from __future__ import annotations

from extproc.observability.replay import (
    HOT,
    SESSION_RECORDS_KEPT,
    JsonlSink,
    ReplayStore,
    read_jsonl,
    read_records,
)
from tests.conftest import FakeClock


def record(replay_id: str, session: str | None, tenant: str = "t", time: float = 0.0) -> dict:
    return {"replay_id": replay_id, "time": time, "session": {"id": session, "tenant": tenant}}


def test_the_index_never_holds_more_ids_than_the_records_kept():
    """The issue's shape, scaled down: sessions x records far beyond the record cap."""
    store = ReplayStore(capacity=1000)
    for n in range(400 * SESSION_RECORDS_KEPT // 8):
        store.put(record(f"rp-{n}", f"s{n % 400}"))
    assert store.index_size() <= 1000
    assert len(store.sessions(limit=10_000)) <= 1000
    for session in ("s0", "s399"):
        found = store.for_session(session)
        assert found and all(store.get(r["replay_id"]) == r for r in found)


def test_older_records_are_kept_packed_and_still_take_late_outcomes():
    store = ReplayStore(capacity=10 * HOT)
    first = record("rp-first", "s")
    first["worker"] = {"picked": "10.0.0.1:8000", "scores": {"10.0.0.1:8000": 0.5}}
    store.put(first)
    for n in range(2 * HOT):
        store.put(record(f"rp-{n}", f"s{n % 7}"))
    assert store.get("rp-first") == first and store.get("rp-first") is not first, "packed"
    assert store.get(f"rp-{2 * HOT - 1}") is store.get(f"rp-{2 * HOT - 1}"), "hot: the dict"
    store.complete("rp-first", {"status": 200, "latency_ms": 12.5})  # a long answer's outcome
    kept = store.get("rp-first")
    assert kept["outcome"]["status"] == 200 and kept["outcome"]["latency_ms"] == 12.5
    kept["model"] = "changed"
    assert "model" not in store.get("rp-first"), "a copy: changing it changes nothing kept"
    assert [r["replay_id"] for r in store.for_session("s")] == ["rp-first"]


def test_a_session_keeps_its_newest_ids_and_evicted_sessions_leave_the_index():
    store = ReplayStore(capacity=10_000)
    for n in range(SESSION_RECORDS_KEPT + 10):
        store.put(record(f"rp-{n}", "long"))
    ids = [r["replay_id"] for r in store.for_session("long")]
    assert len(ids) == SESSION_RECORDS_KEPT and ids[-1] == f"rp-{SESSION_RECORDS_KEPT + 9}"
    small = ReplayStore(capacity=2)
    small.put(record("a", "s1"))
    small.put(record("b", "s2"))
    small.put(record("c", "s3"))
    assert small.for_session("s1") == [] and small.sessions() == [("t", "s3"), ("t", "s2")]


def test_lookups_are_keyed_by_tenant_and_session():
    store = ReplayStore(capacity=100)
    store.put(record("rp-a", "same", "alice", 1.0))
    store.put(record("rp-b", "same", "bob", 2.0))
    store.put(record("rp-c", None, "bob", 3.0))
    assert [r["replay_id"] for r in store.for_session("same", "alice")] == ["rp-a"]
    assert [r["replay_id"] for r in store.for_session("same", "bob")] == ["rp-b"]
    assert [r["replay_id"] for r in store.for_session("same")] == ["rp-a", "rp-b"]
    assert store.sessions("alice") == [("alice", "same")]
    assert store.get("rp-c") is not None and store.index_size() == 2


def test_sub_sessions_are_found_by_their_parent():
    store = ReplayStore(capacity=100)
    store.put(record("rp-p", "parent"))
    child = record("rp-c", "child")
    child["session"]["parent"] = "parent"
    store.put(child)
    assert store.sub_sessions("t", "parent") == [("t", "child")]
    assert store.sub_sessions("other", "parent") == []


class Listener:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def recorded(self, record: dict) -> None:
        self.seen.append(("recorded", record["replay_id"]))

    def completed(self, record: dict) -> None:
        self.seen.append(("completed", record["replay_id"]))


def test_outcomes_stamp_the_headers_time_and_reach_listeners_and_the_sink(tmp_path):
    clock = FakeClock(100.0)
    sink = JsonlSink(tmp_path / "replay.jsonl")
    store = ReplayStore(capacity=10, sink=sink, clock=clock)
    listener = Listener()
    store.subscribe(listener)
    store.put(record("rp-1", "s", time=100.0))
    clock.advance(0.25)
    store.complete("rp-1", {"status": 200, "served_worker": None})
    clock.advance(1.0)
    store.complete("rp-1", {"status": 200, "latency_ms": 1250.0})
    assert store.get("rp-1")["outcome"] == {"status": 200, "served_worker": None,
                                            "headers_ms": 250.0, "latency_ms": 1250.0}
    store.complete("rp-unknown", {"status": 500})
    assert listener.seen == [("recorded", "rp-1"), ("completed", "rp-1"), ("completed", "rp-1")]
    store.close()
    assert read_records(tmp_path / "replay.jsonl") == [store.get("rp-1")]
    assert read_jsonl(tmp_path / "replay.jsonl", "rp-1") == store.get("rp-1")
