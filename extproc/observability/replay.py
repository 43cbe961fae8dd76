"""Replay records: why each request went where it went, looked up by ``x-replay-id``.

A record is written when the decision is made and completed with the response outcome when it
arrives. Records are content-free: counts, ids, scores and prices, never prompt text. The store is
bounded in memory; an optional JSONL sink keeps every event on disk, written by a background
thread so the event loop never blocks on a file.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import orjson
from cachetools import LRUCache

Record = dict[str, Any]
SESSION_RECORDS_KEPT = 256


class JsonlSink:
    """Appends events to a JSONL file from a daemon thread; ``close`` flushes what is queued."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="replay-jsonl", daemon=True)
        self._thread.start()

    def write(self, event: Record) -> None:
        self._queue.put(orjson.dumps(event) + b"\n")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with self.path.open("ab") as out:
            while True:
                line = self._queue.get()
                if line is None:
                    return
                out.write(line)
                while not self._queue.empty():
                    more = self._queue.get()
                    if more is None:
                        out.flush()
                        return
                    out.write(more)
                out.flush()


class ReplayStore:
    def __init__(self, capacity: int, sink: JsonlSink | None = None) -> None:
        self._capacity = capacity
        self._records: OrderedDict[str, Record] = OrderedDict()
        self._by_session: LRUCache[str, deque[str]] = LRUCache(maxsize=capacity)
        self._sink = sink
        self._prefix = "rp-" + os.urandom(4).hex() + "-"
        self._counter = itertools.count(1)

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._counter):x}"

    def put(self, record: Record) -> None:
        replay_id = record["replay_id"]
        self._records[replay_id] = record
        if len(self._records) > self._capacity:
            self._records.popitem(last=False)
        session = record.get("session", {}).get("id")
        if session:
            ids = self._by_session.get(session)
            if ids is None:
                ids = self._by_session[session] = deque(maxlen=SESSION_RECORDS_KEPT)
            ids.append(replay_id)
        if self._sink is not None:
            self._sink.write({"event": "decision", **record})

    def complete(self, replay_id: str, outcome: Record) -> None:
        """Add to the record's outcome: the routing stream and the observe stream each know a
        part (the status and worker; what a streamed answer carried), in either order."""
        record = self._records.get(replay_id)
        if record is not None:
            record.setdefault("outcome", {}).update(outcome)
        if self._sink is not None:
            self._sink.write({"event": "outcome", "replay_id": replay_id, "outcome": outcome})

    def get(self, replay_id: str) -> Record | None:
        return self._records.get(replay_id)

    def for_session(self, session_id: str) -> list[Record]:
        ids = self._by_session.get(session_id, ())
        return [r for i in ids if (r := self._records.get(i)) is not None]

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()


def read_jsonl(path: str | Path, replay_id: str) -> Record | None:
    """Rebuild one record from a JSONL sink file (decision event plus its outcome)."""
    found: Record | None = None
    with Path(path).open("rb") as lines:
        for line in lines:
            event = orjson.loads(line)
            if event.get("replay_id") != replay_id:
                continue
            if event.get("event") == "decision":
                found = {k: v for k, v in event.items() if k != "event"}
            elif found is not None:
                found.setdefault("outcome", {}).update(event["outcome"])
    return found
