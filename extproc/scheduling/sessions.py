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
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .types import SchedulingRequest, Worker


@dataclass(slots=True)
class _Placement:
    worker: str
    tokens: int
    seen: float


class ActiveSessionsScorer:
    """``(max - x) / (max - min)`` over the candidates, ``x`` the prompt tokens of the latest
    turn of each live session placed on the worker (what its KV will hold when the sessions
    come back from their tools); equal loads all score 1. A session is live until it has not
    been routed for ``idle_seconds``; at most ``max_sessions`` are remembered."""

    name = "active_sessions"

    def __init__(
        self,
        *,
        idle_seconds: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = 100_000,
    ) -> None:
        if idle_seconds <= 0 or max_sessions < 1:
            raise ValueError("idle_seconds and max_sessions must be positive")
        self._idle = idle_seconds
        self._clock = clock
        self._max = max_sessions
        self._sessions: OrderedDict[str, _Placement] = OrderedDict()
        self._load: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def load(self, worker: str) -> int:
        """Tokens of the live sessions placed on ``worker``."""
        self._expire()
        return self._load.get(worker, 0)

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        self._expire()
        for key in (request.session_key, request.parent_session):
            placed = None if key is None else self._sessions.get(key)
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
        placed = None if session_key is None else self._sessions.get(session_key)
        return None if placed is None else placed.worker

    def picked(self, request: SchedulingRequest, address: str) -> None:
        key = request.session_key
        if key is None:
            return
        self._drop(key)
        self._sessions[key] = _Placement(address, request.prompt_tokens, self._clock())
        self._load[address] = self._load.get(address, 0) + request.prompt_tokens
        while len(self._sessions) > self._max:
            self._drop(next(iter(self._sessions)))

    def _expire(self) -> None:
        horizon = self._clock() - self._idle
        while self._sessions:
            key, placement = next(iter(self._sessions.items()))
            if placement.seen > horizon:
                return
            self._drop(key)

    def _drop(self, key: str) -> None:
        placement = self._sessions.pop(key, None)
        if placement is None:
            return
        left = self._load[placement.worker] - placement.tokens
        if left:
            self._load[placement.worker] = left
        else:
            del self._load[placement.worker]
