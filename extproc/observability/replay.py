"""Replay records: why each request went where it went, looked up by ``x-replay-id``.

A record is written when the decision is made and completed with the response outcome when it
arrives. Records are content-free: counts, ids, scores and prices, never prompt text. The store is
bounded in memory, and so is everything beside it: the per-session index holds only ids of
records still kept (at most ``SESSION_RECORDS_KEPT`` per session), keyed by tenant and session
id, so one tenant's session id never reaches another's records. Ids are random (128 bits): an id
seen tells nothing of its neighbours. An optional JSONL sink keeps every event on disk, written by
a background thread so the event loop never blocks on a file; listeners (the per-session metrics,
the shared store's writer, trace spans) are told of each record and outcome as it lands.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import orjson

from ..types import Clock

Record = dict[str, Any]
SESSION_RECORDS_KEPT = 256
HOT = 512
"""The newest records kept as dicts (their outcomes are still arriving); older ones are kept
packed (JSON bytes): a record is a nest of a dozen dicts and lists, and ten thousand of them
would be the largest part of what every full garbage collection walks, with the event loop
stopped."""
ID_PREFIX = "rp-"
ID_BYTES = 16

SessionKey = tuple[str, str]
"""(tenant, session id): how records are indexed and looked up."""


def session_key(record: Record) -> SessionKey | None:
    session = record.get("session") or {}
    if not session.get("id"):
        return None
    return (str(session.get("tenant") or ""), str(session["id"]))


class RecordListener(Protocol):
    """Told of every record as it lands; called on the request path, so it must be quick."""

    def recorded(self, record: Record) -> None:
        """A decision record was written."""

    def completed(self, record: Record) -> None:
        """The record's outcome grew (the status; later what the answer carried)."""


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
    def __init__(
        self, capacity: int, sink: JsonlSink | None = None, *, clock: Clock = time.time
    ) -> None:
        self._capacity = capacity
        self._records: OrderedDict[str, tuple[SessionKey | None, Record | bytes]] = OrderedDict()
        """Oldest first: the record's session (to unindex it when it leaves) and the record,
        packed unless among the ``HOT`` newest (``_hot``)."""
        self._hot: deque[str] = deque()
        self._sessions: OrderedDict[SessionKey, deque[str]] = OrderedDict()
        """Most recently active session last; each holds ids of kept records, oldest first."""
        self._sink = sink
        self._clock = clock
        self._listeners: list[RecordListener] = []

    @staticmethod
    def new_id() -> str:
        return ID_PREFIX + secrets.token_urlsafe(ID_BYTES)

    def subscribe(self, listener: RecordListener) -> None:
        self._listeners.append(listener)

    def put(self, record: Record) -> None:
        replay_id = record["replay_id"]
        key = session_key(record)
        self._records[replay_id] = (key, record)
        self._hot.append(replay_id)
        if len(self._hot) > HOT:
            self._pack(self._hot.popleft())
        if len(self._records) > self._capacity:
            self._evicted(*self._records.popitem(last=False))
        if key is not None:
            ids = self._sessions.get(key)
            if ids is None:
                ids = self._sessions[key] = deque(maxlen=SESSION_RECORDS_KEPT)
            else:
                self._sessions.move_to_end(key)
            ids.append(replay_id)
        if self._sink is not None:
            self._sink.write({"event": "decision", **record})
        for listener in self._listeners:
            listener.recorded(record)

    def complete(self, replay_id: str, outcome: Record) -> None:
        """Add to the record's outcome: the routing stream and the observe stream each know a
        part (the status and worker; what a streamed answer carried), in either order. The
        status arrives with the response headers: ``headers_ms`` stamps when, after the
        decision (the time to first byte of a streamed answer)."""
        kept = self._records.get(replay_id)
        record = None
        if kept is not None:
            record = _unpacked(kept[1])
            done = record.setdefault("outcome", {})
            if "status" in outcome and "headers_ms" not in done:
                outcome = {**outcome,
                           "headers_ms": round((self._clock() - record["time"]) * 1000, 3)}
            done.update(outcome)
            if isinstance(kept[1], bytes):  # a late outcome: pack it again
                self._records[replay_id] = (kept[0], _packed(record))
        if self._sink is not None:
            self._sink.write({"event": "outcome", "replay_id": replay_id, "outcome": outcome})
        if record is not None:
            for listener in self._listeners:
                listener.completed(record)

    def get(self, replay_id: str) -> Record | None:
        """The record (a copy when it was packed: changing it changes nothing kept)."""
        kept = self._records.get(replay_id)
        return None if kept is None else _unpacked(kept[1])

    def for_session(self, session_id: str, tenant: str | None = None) -> list[Record]:
        """The kept records of ``tenant``'s session ``session_id`` in time order; every
        tenant's session of that id when ``tenant`` is None (the admin's view)."""
        if tenant is not None:
            keys: list[SessionKey] = [(tenant, session_id)]
        else:
            keys = [k for k in self._sessions if k[1] == session_id]
        found = [r for key in keys for i in self._sessions.get(key, ())
                 if (r := self.get(i)) is not None]
        return sorted(found, key=lambda r: r["time"]) if len(keys) > 1 else found

    def sessions(self, tenant: str | None = None, limit: int = 50) -> list[SessionKey]:
        """The most recently active sessions first (``tenant``'s only, unless None)."""
        out: list[SessionKey] = []
        for key in reversed(self._sessions):
            if tenant is None or key[0] == tenant:
                out.append(key)
                if len(out) >= limit:
                    break
        return out

    def sub_sessions(self, tenant: str, session_id: str) -> list[SessionKey]:
        """Sessions of ``tenant`` whose records name ``session_id`` as their parent."""
        found = []
        for key, ids in self._sessions.items():
            if key[0] == tenant and ids:
                record = self.get(ids[-1])
                if record is not None and (record.get("session") or {}).get("parent") == \
                        session_id:
                    found.append(key)
        return found

    def __len__(self) -> int:
        return len(self._records)

    def index_size(self) -> int:
        """Ids in the per-session index (never more than the records kept)."""
        return sum(len(ids) for ids in self._sessions.values())

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()

    def _pack(self, replay_id: str) -> None:
        kept = self._records.get(replay_id)
        if kept is not None and not isinstance(kept[1], bytes):
            self._records[replay_id] = (kept[0], _packed(kept[1]))

    def _evicted(self, replay_id: str, kept: tuple[SessionKey | None, Record | bytes]) -> None:
        """Records leave oldest first, so an evicted record still indexed heads its session."""
        key = kept[0]
        if key is None:
            return
        ids = self._sessions.get(key)
        if ids and ids[0] == replay_id:
            ids.popleft()
            if not ids:
                del self._sessions[key]


def _packed(record: Record) -> bytes:
    """The record as JSON, in a buffer of its own size: orjson's output keeps the capacity it
    grew to (8 KiB for a 1 KiB record), which ten thousand kept records would multiply."""
    return bytes(memoryview(orjson.dumps(record)))


def _unpacked(record: Record | bytes) -> Record:
    return orjson.loads(record) if isinstance(record, bytes) else record


def _events(path: str | Path) -> Iterator[Record]:
    with Path(path).open("rb") as lines:
        for line in lines:
            if line.strip():
                yield orjson.loads(line)


def read_records(path: str | Path) -> list[Record]:
    """Every record of a JSONL sink file, each decision with its outcome, in written order."""
    found: dict[str, Record] = {}
    for event in _events(path):
        replay_id = str(event.get("replay_id"))
        if event.get("event") == "decision":
            found[replay_id] = {k: v for k, v in event.items() if k != "event"}
        elif replay_id in found:
            found[replay_id].setdefault("outcome", {}).update(event["outcome"])
    return list(found.values())


def read_jsonl(path: str | Path, replay_id: str) -> Record | None:
    """Rebuild one record from a JSONL sink file (decision event plus its outcome)."""
    found: Record | None = None
    for event in _events(path):
        if event.get("replay_id") != replay_id:
            continue
        if event.get("event") == "decision":
            found = {k: v for k, v in event.items() if k != "event"}
        elif found is not None:
            found.setdefault("outcome", {}).update(event["outcome"])
    return found
