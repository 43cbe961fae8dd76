"""saar's precise index judged against the engine: which requests count, and which agree."""

from __future__ import annotations

import json
import threading
import time

from extproc.dev.bench.peers.client import Observed
from extproc.dev.bench.peers.precise import count, predicted_blocks, records_for
from extproc.dev.bench.peers.stats import PreciseCount

A, B = "127.0.0.1:8001", "127.0.0.1:8002"


def record(replay_id: str, matched: dict[str, float], picked: str = A) -> dict:
    return {"replay_id": replay_id,
            "worker": {"picked": picked, "matched_blocks": matched, "scores": {}}}


def test_a_prediction_is_the_served_workers_match():
    rec = record("r", {A: 3, B: 1})
    assert predicted_blocks(rec, B) == 1.0
    assert predicted_blocks(rec, None) == 3.0  # no x-saar-worker: the pick
    assert predicted_blocks(rec, "127.0.0.1:9") is None
    assert predicted_blocks({"worker": None}, A) is None


def test_within_one_block_either_way():
    records = {
        "exact": record("exact", {A: 4}),
        "one-under": record("one-under", {A: 4}),  # vLLM recomputes a fully cached last block
        "one-over": record("one-over", {A: 3}),
        "off": record("off", {A: 0}),
        "fraction": record("fraction", {A: 2.5}),
    }
    observed = [
        Observed("exact", A, 512),
        Observed("one-under", A, 384),
        Observed("one-over", A, 512),
        Observed("off", A, 512),
        Observed("fraction", A, 384),
    ]
    assert count(observed, records, 128) == PreciseCount(requests=5, within_one_block=4)


def test_requests_that_cannot_be_compared_are_not_counted():
    records = {"r1": record("r1", {A: 2}), "r2": record("r2", {A: 2}),
               "r3": {"replay_id": "r3", "worker": None}}
    observed = [
        Observed("r1", A, None),  # the engine did not report cached tokens
        Observed("r2", B, 256),  # no prediction for the worker that served it
        Observed("r3", A, 0),  # no placement in the record
        Observed("absent", A, 0),  # no record
    ]
    assert count(observed, records, 128) == PreciseCount(0, 0)


def test_counts_add_up_and_give_the_json_entry():
    total = sum([PreciseCount(3, 2), PreciseCount(4, 4)], PreciseCount())
    assert total.figure() == {"requests": 7, "within_one_block": 6}


def test_records_are_read_from_the_replay_jsonl_as_they_land(tmp_path):
    path = tmp_path / "replay.jsonl"
    first = {"event": "decision", **record("r1", {A: 1})}
    path.write_text(json.dumps(first) + "\n" + json.dumps(
        {"event": "outcome", "replay_id": "r1", "outcome": {"status": 200}}) + "\n")

    def late() -> None:
        time.sleep(0.3)
        with path.open("a") as out:
            out.write(json.dumps({"event": "decision", **record("r2", {B: 2})}) + "\n")

    writer = threading.Thread(target=late)
    writer.start()
    found = records_for(path, ["r1", "r2"], timeout_s=5)
    writer.join()
    assert set(found) == {"r1", "r2"}
    assert found["r1"]["outcome"] == {"status": 200}
    assert found["r2"]["worker"]["matched_blocks"] == {B: 2}
    assert records_for(path, ["never"], timeout_s=0.2) == {}
    assert records_for(tmp_path / "none.jsonl", ["r1"], timeout_s=0.1) == {}
