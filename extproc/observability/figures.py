"""Metrics derived from the replay records as they land: each scheduling plugin's latency, and
per-session figures (duration, turns, tool time between turns, switches, locked turns).

A session has no reliable end on the wire (few harnesses send ``x-dynamo-session-final``), so
its figures are observed when it ends one of three ways: its final request was answered, it has
been idle for ``idle_seconds`` (checked as records land and on every ``/metrics`` scrape), or it
is the oldest of ``max_sessions`` tracked (as many as the router remembers). Everything is
O(1) per record, the table bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ..types import Clock
from .metrics import Metrics
from .replay import Record, SessionKey, session_key


@dataclass(slots=True)
class _Session:
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


class Figures:
    """A ``RecordListener`` that turns records into the histograms of ``Metrics``."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        clock: Clock,
        idle_seconds: float,
        max_sessions: int,
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._idle = idle_seconds
        self._max = max_sessions
        self._sessions: OrderedDict[SessionKey, _Session] = OrderedDict()
        """Least recently active first."""

    def __len__(self) -> int:
        return len(self._sessions)

    def recorded(self, record: Record) -> None:
        for plugin, micros in ((record.get("timings_us") or {}).get("plugins") or {}).items():
            self._metrics.plugin_seconds.labels(plugin).observe(micros / 1e6)
        key = session_key(record)
        if key is None:
            return
        now = record["time"]
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session(now, now)
        else:
            self._sessions.move_to_end(key)
            if session.called_tools and session.ended is not None:
                self._metrics.session_tool_seconds.observe(max(0.0, now - session.ended))
        session.last = now
        session.ended = None
        session.turns += 1
        session.switches += record.get("action") == "switch"
        session.locked += record.get("lock") is not None
        session.final = bool((record.get("session") or {}).get("final"))
        self.sweep(now)

    def completed(self, record: Record) -> None:
        outcome = record.get("outcome") or {}
        key = session_key(record)
        if "latency_ms" not in outcome or key is None:
            return
        session = self._sessions.get(key)
        if session is None or session.turns == 0:
            return
        end = record["time"] + outcome["latency_ms"] / 1000
        session.ended = max(end, session.ended or end)
        session.last = max(session.last, end)
        session.called_tools = bool(outcome.get("tool_calls"))
        if session.final:
            self._close(key)

    def sweep(self, now: float | None = None) -> None:
        """Observe and forget the sessions idle longer than ``idle_seconds`` (and the oldest
        beyond ``max_sessions``)."""
        now = self._clock() if now is None else now
        while self._sessions:
            key, oldest = next(iter(self._sessions.items()))
            if len(self._sessions) <= self._max and now - oldest.last <= self._idle:
                return
            self._close(key)

    def _close(self, key: SessionKey) -> None:
        session = self._sessions.pop(key)
        metrics = self._metrics
        end = session.ended if session.ended is not None else session.last
        metrics.session_duration.observe(max(0.0, end - session.started))
        metrics.session_turns.observe(session.turns)
        metrics.session_switches.observe(session.switches)
        metrics.session_locked_turns.observe(session.locked)
