"""Session timelines from replay records, as Chrome trace-event JSON (Perfetto, chrome://tracing).

One process per root session, one thread (track) per session in it: the agent first, then its
sub-agents, each named after its parent, so a sub-agent's track sits under its parent's. On a
track, one slice per turn, holding the router's own time (``route``: parsing, the state load,
SAAR, scheduling), the time to a streamed answer's first token (``ttft``: its first event;
a record without it, its response headers) and the rest (``decode``); between turns, the tool
time (``tool``: the answer called tools) or the client's own (``idle``). Instant marks flag
switches, locks, resets, holds (the request waited at the processor before it was routed) and
errors, each carrying the replay id and the reason. Times are microseconds since the first
record (``otherData.origin_unix_s``); the web view draws this same document.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .replay import Record, SessionKey, session_key

Event = dict[str, Any]
ROUTE_PARTS = ("parse", "identity", "load", "saar", "scheduling")
HOLDS = {"paused": "admission paused the session", "locked": "its lock's model was out",
         "large_body": "its large body waited for the budget",
         "settle": "the issuer of what it continues was not known yet",
         "queue": "its pool was saturated: it waited in flow control's queue"}


@dataclass(slots=True)
class _Track:
    key: SessionKey | None
    records: list[Record] = field(default_factory=list)
    pid: int = 0
    tid: int = 0
    parent: str | None = None


def route_micros(record: Record) -> float:
    """The router's own time on this request (0 when the record has no timings)."""
    timings = record.get("timings_us") or {}
    return float(sum(timings.get(part, 0.0) for part in ROUTE_PARTS))


def timeline(records: Iterable[Record]) -> dict[str, Any]:
    """The trace-event document of ``records`` (any sessions, any order)."""
    ordered = sorted(records, key=lambda r: r["time"])
    if not ordered:
        return {"traceEvents": [], "displayTimeUnit": "ms", "otherData": {"sessions": 0}}
    origin = ordered[0]["time"]
    tracks = _tracks(ordered)
    events: list[Event] = []
    for track in tracks:
        events += _names(track)
        previous: Record | None = None
        for number, record in enumerate(track.records, 1):
            events += _turn(track, record, number, origin)
            if previous is not None:
                events += _gap(track, previous, record, origin)
            previous = record
    events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0), e["pid"], e["tid"]))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"origin_unix_s": origin,
                      "sessions": sum(t.key is not None for t in tracks)},
    }


def _tracks(ordered: list[Record]) -> list[_Track]:
    """Tracks in order of first appearance; pids per root session, tids within it."""
    by_key: dict[SessionKey | None, _Track] = {}
    for record in ordered:
        key = session_key(record)
        track = by_key.get(key)
        if track is None:
            track = by_key[key] = _Track(key, parent=(record.get("session") or {}).get("parent"))
        track.records.append(record)
    roots: dict[SessionKey | None, int] = {}
    threads: dict[int, int] = {}
    for track in by_key.values():
        root = _root(track, by_key)
        pid = roots.setdefault(root, len(roots) + 1)
        threads[pid] = threads.get(pid, 0) + 1
        track.pid, track.tid = pid, threads[pid]
    # A sub-agent seen before its parent still gets a later tid than the parent's.
    for pid in roots.values():
        members = [t for t in by_key.values() if t.pid == pid]
        members.sort(key=lambda t: (t.parent is not None, t.tid))
        for tid, track in enumerate(members, 1):
            track.tid = tid
    return list(by_key.values())


def _root(track: _Track, by_key: dict[SessionKey | None, _Track]) -> SessionKey | None:
    key, seen = track.key, set()
    while key is not None and key not in seen:
        seen.add(key)
        found = by_key.get(key)
        parent = found.parent if found is not None else None
        if parent is None:
            return key
        key = (key[0], parent)
    return key


def _names(track: _Track) -> list[Event]:
    pid, tid = track.pid, track.tid
    if track.key is None:
        name = "requests without a session"
    elif track.parent is None:
        name = f"agent {track.key[1]}"
    else:
        name = f"sub-agent {track.key[1]} (of {track.parent})"
    events: list[Event] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
         "args": {"sort_index": tid}},
    ]
    if tid == 1:
        label = "no session" if track.key is None else f"session {track.key[1]}"
        tenant = "" if track.key is None else f" [{track.key[0]}]"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": label + tenant}})
    return events


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _turn(track: _Track, record: Record, number: int, origin: float) -> list[Event]:
    outcome = record.get("outcome") or {}
    start = _us(record["time"] - origin)
    route = route_micros(record)
    latency = float(outcome.get("latency_ms") or 0.0) * 1000
    usage = outcome.get("usage") or {}
    where = {"pid": track.pid, "tid": track.tid}
    args = {
        "replay_id": record["replay_id"], "model": record.get("model"),
        "worker": outcome.get("served_worker") or (record.get("worker") or {}).get("picked"),
        "decision": record.get("decision"), "action": record.get("action"),
        "phase": record.get("phase"), "reason": record.get("reason"),
        "context_tokens": (record.get("request") or {}).get("context_tokens"),
        "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": usage.get("cached_tokens"),
        "completion_tokens": usage.get("completion_tokens"), "status": outcome.get("status"),
    }
    events: list[Event] = [{
        "ph": "X", "cat": "turn", "name": f"turn {number} · {record.get('model')}",
        "ts": round(start - route, 1), "dur": round(route + latency, 1), **where, "args": args,
    }]
    if route:
        events.append({"ph": "X", "cat": "route", "name": "route", "ts": round(start - route, 1),
                       "dur": round(route, 1), **where,
                       "args": {"replay_id": record["replay_id"], **record["timings_us"]}})
    first_ms = outcome.get("first_chunk_ms", outcome.get("headers_ms"))
    streamed = (record.get("request") or {}).get("stream")
    if latency and first_ms is not None and streamed and 0 < first_ms * 1000 < latency:
        first = float(first_ms) * 1000
        events.append({"ph": "X", "cat": "ttft", "name": "ttft", "ts": start,
                       "dur": round(first, 1), **where, "args": {"replay_id": record["replay_id"]}})
        events.append({"ph": "X", "cat": "decode", "name": "decode",
                       "ts": round(start + first, 1), "dur": round(latency - first, 1), **where,
                       "args": {"replay_id": record["replay_id"]}})
    for name, reason in _marks(record, outcome):
        events.append({"ph": "i", "s": "t", "cat": "mark", "name": name, "ts": start, **where,
                       "args": {"replay_id": record["replay_id"], "reason": reason}})
    return events


def _marks(record: Record, outcome: dict[str, Any]) -> list[tuple[str, str]]:
    marks = []
    reason = str(record.get("reason"))
    if record.get("action") == "switch":
        marks.append((f"switch {record.get('previous_model')} → {record.get('model')}", reason))
    if record.get("lock"):
        marks.append((f"lock: {record['lock']}", reason))
    if record.get("reset"):
        marks.append((f"reset: {record['reset']}", reason))
    for hold in record.get("holds") or ():
        marks.append((f"held: {hold['kind']}", f"waited {hold['ms']} ms at the processor "
                                               f"({HOLDS.get(hold['kind'], hold['kind'])})"))
    status = outcome.get("status")
    if (status is not None and status >= 400) or outcome.get("aborted"):
        refused = f" ({outcome['refused']})" if outcome.get("refused") else ""
        marks.append(("error", f"status {status}{refused}" if status
                      else "aborted by the client"))
    return marks


def _gap(track: _Track, previous: Record, record: Record, origin: float) -> list[Event]:
    outcome = previous.get("outcome") or {}
    if "latency_ms" not in outcome:
        return []
    end = _us(previous["time"] - origin) + float(outcome["latency_ms"]) * 1000
    start = _us(record["time"] - origin) - route_micros(record)
    if start <= end:
        return []
    tools = outcome.get("tool_names") or []
    name = "tool" if outcome.get("tool_calls") or tools else "idle"
    return [{"ph": "X", "cat": name, "name": name, "ts": round(end, 1),
             "dur": round(start - end, 1), "pid": track.pid, "tid": track.tid,
             "args": {"after": previous["replay_id"], "tools": tools}}]
