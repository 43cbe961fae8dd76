"""Spread NEW sessions by the KV their live sessions will hold (a least-request scorer over the
router's own placements). The scraped signals describe the past: between turns an agent runs
tools, so a worker whose sessions are all ACTING scrapes as idle (no queue, little KV in use)
although their next turns will come back to it. The prefix scorer meanwhile pulls every new
session to the workers that happen to hold the shared system prompt, so without this scorer new
sessions pile onto a few workers and admission has to pause them while the rest idle.

Only sessions the router has not placed yet are spread: a continuing session scores 1.0
everywhere, its placement is the prefix and affinity scorers' call (its cache is there). So does
a sub-agent whose parent is placed: it starts from the parent's context, so spreading it away
from the parent's worker re-prefills that context elsewhere (the scheduler binds its first turn
to the parent's worker, ``worker``).

A placement is the session's slot on the session table; it counts while the session was routed
in the last ``idle_seconds`` (a line of placements in time order lets them lapse in O(1)).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..state.table import Entry, SessionTable
from .types import SchedulingRequest, Worker


@dataclass(slots=True)
class Placed:
    """Where a session was last placed, with the prompt tokens of that turn."""

    worker: str
    tokens: int
    seen: float
    queued: float = -math.inf
    """When it last joined the lapse line (at most once per tenth of the idle time)."""
    model: str | None = None
    """The worker's model (its pool)."""


class ActiveSessionsScorer:
    """``(max - x) / (max - min)`` over the candidates, ``x`` the prompt tokens of the latest
    turn of each live session placed on the worker (what its KV will hold when the sessions
    come back from their tools); equal loads all score 1. A session is live until it has not
    been routed for ``idle_seconds``."""

    name = "active_sessions"

    def __init__(
        self,
        *,
        idle_seconds: float = 120.0,
        table: SessionTable | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = 100_000,
    ) -> None:
        """``table``: the process's session table (its assembler calls ``left`` when a
        session leaves it); a table of its own, of ``max_sessions`` on ``clock``, when none
        is given."""
        if idle_seconds <= 0:
            raise ValueError("idle_seconds must be positive")
        self._idle = idle_seconds
        if table is None:
            table = SessionTable(max_sessions=max_sessions, clock=clock)
            table.leaving(self.left)
        self._table = table
        self._clock = table.clock
        self._lapse: deque[tuple[float, str]] = deque()
        """(when queued, session) in time order: popped once idle, a session placed since
        joins again; it joins at most once per tenth of the idle time."""
        self._load: dict[str, int] = {}
        self._count: dict[str, int] = {}
        self._live = 0
        self.lapsed: list[Callable[[str | None, int], None]] = []
        """Told ``(model, tokens of its last turn)`` of each session whose placement lapsed
        (idle) or that left the table: how large the model's sessions grow."""

    def __len__(self) -> int:
        """Live sessions placed."""
        self._expire()
        return self._live

    def load(self, worker: str) -> int:
        """Tokens of the live sessions placed on ``worker``."""
        self._expire()
        return self._load.get(worker, 0)

    def count(self, worker: str) -> int:
        """Live sessions placed on ``worker``."""
        self._expire()
        return self._count.get(worker, 0)

    def placed(self, session_key: str | None) -> Placed | None:
        """The live session's placement (None: not placed, or lapsed)."""
        self._expire()
        return self._placed(session_key)

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        self._expire()
        for key in (request.session_key, request.parent_session):
            placed = self._placed(key)
            if placed is not None and any(w.address == placed.worker for w in workers):
                return {w.address: 1.0 for w in workers}
        loads = {w.address: self._load.get(w.address, 0) for w in workers}
        if not loads:
            return {}
        low, high = min(loads.values()), max(loads.values())
        if high == low:
            return dict.fromkeys(loads, 1.0)
        return {address: (high - x) / (high - low) for address, x in loads.items()}

    def worker(self, session_key: str | None) -> str | None:
        """Where the live session ``session_key`` was last placed."""
        self._expire()
        placed = self._placed(session_key)
        return None if placed is None else placed.worker

    def picked(self, request: SchedulingRequest, address: str) -> None:
        key = request.session_key
        if key is None:
            return
        entry = self._table.touch(key)
        queued = entry.placed.queued if entry.placed is not None else -math.inf
        self._drop(entry)
        placed = entry.placed = Placed(address, request.prompt_tokens, self._clock(), queued,
                                       request.model)
        self._load[address] = self._load.get(address, 0) + request.prompt_tokens
        self._count[address] = self._count.get(address, 0) + 1
        self._live += 1
        self._queue(key, placed)

    def _queue(self, key: str, placed: Placed) -> None:
        if placed.seen - placed.queued >= self._idle / 10:
            placed.queued = placed.seen
            self._lapse.append((placed.seen, key))

    def _placed(self, key: str | None) -> Placed | None:
        entry = self._table.get(key)
        return None if entry is None else entry.placed

    def _expire(self) -> None:
        horizon = self._clock() - self._idle
        lapse = self._lapse
        while lapse and lapse[0][0] <= horizon:
            queued, key = lapse.popleft()
            entry = self._table.get(key)
            placed = None if entry is None else entry.placed
            if entry is None or placed is None or placed.queued != queued:
                continue  # gone, or in the line again later
            if placed.seen <= horizon:
                self._drop(entry)
                self._lapse_told(placed)
            else:
                placed.queued = -math.inf
                self._queue(key, placed)

    def left(self, key: str, entry: Entry) -> None:
        """The session left the table: keep nothing of it (a table's leaving hook)."""
        placed = entry.placed
        self._drop(entry)
        if placed is not None:
            self._lapse_told(placed)

    def _lapse_told(self, placed: Placed) -> None:
        for listener in self.lapsed:
            listener(placed.model, placed.tokens)

    def _drop(self, entry: Entry) -> None:
        placed, entry.placed = entry.placed, None
        if placed is None:
            return
        self._live -= 1
        left = self._load[placed.worker] - placed.tokens
        if left:
            self._load[placed.worker] = left
        else:
            del self._load[placed.worker]
        count = self._count[placed.worker] - 1
        if count:
            self._count[placed.worker] = count
        else:
            del self._count[placed.worker]
