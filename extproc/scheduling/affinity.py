"""Session affinity: prefer the worker that served the session's previous turn, whose cache
holds its context even when the prefix index has not learnt it (a restart, a precise index
that lags its KV events). A ``PickObserver``: the scheduler reports every pick."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .types import SchedulingRequest, Worker


class SessionAffinityScorer:
    """1.0 for the worker that served this session last, 0.0 for the rest; remembers at most
    ``max_sessions`` sessions, forgetting the least recently routed."""

    name = "session_affinity"

    def __init__(self, max_sessions: int = 100_000) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be positive")
        self._max = max_sessions
        self._last: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        last = None if request.session_key is None else self._last.get(request.session_key)
        return {w.address: 1.0 if w.address == last else 0.0 for w in workers}

    def picked(self, request: SchedulingRequest, address: str) -> None:
        key = request.session_key
        if key is None:
            return
        self._last[key] = address
        self._last.move_to_end(key)
        while len(self._last) > self._max:
            self._last.popitem(last=False)
