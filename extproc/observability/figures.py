"""Metrics derived from the replay records as they land: each scheduling plugin's latency, and
per-session figures (duration, turns, tool time between turns, switches, locked turns).

A session has no reliable end on the wire (few harnesses send ``x-dynamo-session-final``), so
its figures are observed when it ends one of three ways: its final request was answered, it has
been idle for ``idle_seconds`` (checked as records land and on every ``/metrics`` scrape), or it
left the session table (its bound, its TTL). A session's figures are its slot on that table;
everything is O(1) per record.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..state.table import Entry, SessionTable
from ..types import Clock
from .metrics import Metrics
from .replay import Record, session_key


@dataclass(slots=True)
class Figured:
    """A session's figures as they are gathered: its slot on the session table."""

    started: float
    last: float
    """When the session last did anything: a request routed, or an answer ended."""
    ended: float | None = None
    """When its latest answer ended (None while a turn is in flight)."""
    called_tools: bool = False
    turns: int = 0
    switches: int = 0
    locked: int = 0
    final: bool = False
    queued: float = -math.inf
    """When it last joined the idle line (at most once per tenth of the idle time)."""


class Figures:
    """A ``RecordListener`` that turns records into the histograms of ``Metrics``."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        clock: Clock,
        idle_seconds: float,
        max_sessions: int = 100_000,
        table: SessionTable | None = None,
    ) -> None:
        """``table``: the process's session table, where each session's figures hang (its
        assembler calls ``left`` when a session leaves it: its figures are observed then); a
        table of its own, of ``max_sessions`` sessions, when none is given."""
        self._metrics = metrics
        self._clock = clock
        self._idle = idle_seconds
        if table is None:
            table = SessionTable(max_sessions=max_sessions, clock=clock)
            table.leaving(self.left)
        self._table = table
        self._count = 0
        self._idle_line: deque[tuple[float, str]] = deque()
        """(when queued, session) in time order: popped once idle, a session active since
        joins again; it joins at most once per tenth of the idle time."""

    def __len__(self) -> int:
        return self._count

    def recorded(self, record: Record) -> None:
        for plugin, micros in ((record.get("timings_us") or {}).get("plugins") or {}).items():
            self._metrics.plugin_seconds.labels(plugin).observe(micros / 1e6)
        key = _key(record)
        if key is None:
            return
        now = record["time"]
        entry = self._table.touch(key)
        session = entry.figured
        if session is None:
            session = entry.figured = Figured(now, now)
            self._count += 1
        elif session.called_tools and session.ended is not None:
            self._metrics.session_tool_seconds.observe(max(0.0, now - session.ended))
        session.last = now
        session.ended = None
        session.turns += 1
        session.switches += record.get("action") == "switch"
        session.locked += record.get("lock") is not None
        session.final = bool((record.get("session") or {}).get("final"))
        self._queue(key, session)
        self.sweep(now)

    def completed(self, record: Record) -> None:
        outcome = record.get("outcome") or {}
        key = _key(record)
        if "latency_ms" not in outcome or key is None:
            return
        entry = self._table.get(key)
        session = None if entry is None else entry.figured
        if entry is None or session is None or session.turns == 0:
            return
        end = record["time"] + outcome["latency_ms"] / 1000
        session.ended = max(end, session.ended or end)
        session.last = max(session.last, end)
        session.called_tools = bool(outcome.get("tool_calls"))
        if session.final:
            self._close(entry)

    def sweep(self, now: float | None = None) -> None:
        """Observe and forget the sessions idle longer than ``idle_seconds``."""
        now = self._clock() if now is None else now
        line = self._idle_line
        while line and now - line[0][0] > self._idle:
            queued, key = line.popleft()
            entry = self._table.get(key)
            session = None if entry is None else entry.figured
            if entry is None or session is None or session.queued != queued:
                continue  # gone, or in the line again later
            if now - session.last > self._idle:
                self._close(entry)
            else:
                session.queued = -math.inf
                self._queue(key, session)

    def _queue(self, key: str, session: Figured) -> None:
        if session.last - session.queued >= self._idle / 10:
            session.queued = session.last
            self._idle_line.append((session.last, key))

    def left(self, key: str, entry: Entry) -> None:
        """The session left the table: its figures are observed (a table's leaving hook)."""
        self._close(entry)

    def _close(self, entry: Entry) -> None:
        session, entry.figured = entry.figured, None
        if session is None:
            return
        self._count -= 1
        metrics = self._metrics
        end = session.ended if session.ended is not None else session.last
        metrics.session_duration.observe(max(0.0, end - session.started))
        metrics.session_turns.observe(session.turns)
        metrics.session_switches.observe(session.switches)
        metrics.session_locked_turns.observe(session.locked)


def _key(record: Record) -> str | None:
    """The session table's key of the record's session (``tenant/id``)."""
    found = session_key(record)
    return None if found is None else f"{found[0]}/{found[1]}"
