"""Router memory: routing state per session, and who owns which ids.

This is not conversation memory. A session keeps only what the next routing decision needs; the
ownership maps say which physical model issued a tool-call id, a response id or a piece of
provider-bound state, learnt from the responses that pass through. Because ownership is keyed by
the id itself, hard locks hold without a session id and after a session's state was evicted.

Everything is bounded (TTL and size) and costs O(1) per request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from cachetools import LRUCache, TTLCache

from ..types import Clock, Phase, ResponseSummary, Usage

SWITCH_TIMES_KEPT = 16


@dataclass(slots=True)
class SessionState:
    model: str
    decision: str
    phase: Phase
    last_seen: float
    turns: int = 0
    switches: int = 0
    switch_times: deque[float] = field(default_factory=lambda: deque(maxlen=SWITCH_TIMES_KEPT))
    context_tokens: int = 0
    estimated_reuse_tokens: int = 0
    reported_prompt_tokens: int = 0
    reported_cached_tokens: int = 0
    last_replay_id: str | None = None

    @property
    def reported_cache_ratio(self) -> float | None:
        """The backend's own cache evidence for the last turn, kept apart from our estimate."""
        if self.reported_prompt_tokens <= 0:
            return None
        return self.reported_cached_tokens / self.reported_prompt_tokens


@dataclass(frozen=True, slots=True)
class Turn:
    """What one routed request will write into memory once the upstream has answered."""

    session_key: str | None
    model: str
    decision: str
    phase: Phase
    switched: bool
    context_tokens: int
    replay_id: str
    started: float


class RouterMemory:
    def __init__(
        self, *, clock: Clock, max_sessions: int, session_ttl: float, max_owned_ids: int
    ) -> None:
        self._clock = clock
        self._sessions: TTLCache[str, SessionState] = TTLCache(
            maxsize=max_sessions, ttl=session_ttl, timer=clock
        )
        self._owners: LRUCache[str, str] = LRUCache(maxsize=max_owned_ids)

    def __len__(self) -> int:
        return len(self._sessions)

    def session(self, key: str | None) -> SessionState | None:
        return None if key is None else self._sessions.get(key)

    def owner(self, ids: Iterable[str]) -> str | None:
        """The model that issued the newest of ``ids`` that we know of."""
        found = None
        for key in ids:
            found = self._owners.get(key, found)
        return found

    def commit(self, turn: Turn) -> str | None:
        """Write a turn the upstream accepted (a failed request never reaches this: no switch);
        returns the model the session was on before."""
        if turn.session_key is None:
            return None
        state = self._sessions.get(turn.session_key)
        before = None if state is None else state.model
        if state is None:
            state = SessionState(turn.model, turn.decision, turn.phase, turn.started)
        if turn.switched and state.model != turn.model:
            state.switches += 1
            state.switch_times.append(turn.started)
            state.estimated_reuse_tokens = 0
        else:
            state.estimated_reuse_tokens = state.context_tokens
        state.model = turn.model
        state.decision = turn.decision
        state.phase = turn.phase
        state.turns += 1
        state.last_seen = self._clock()
        state.context_tokens = turn.context_tokens
        state.last_replay_id = turn.replay_id
        self._sessions[turn.session_key] = state
        return before

    def record_response(self, turn: Turn, response: ResponseSummary) -> None:
        """Remember the ids this response made ``turn.model`` own, and its cache evidence."""
        for call_id in response.tool_call_ids:
            self._owners[call_id] = turn.model
        for key in response.provider_state:
            self._owners[key] = turn.model
        if response.response_id:
            self._owners[response.response_id] = turn.model
        state = self.session(turn.session_key)
        if state is not None and state.model == turn.model:
            state.last_seen = self._clock()
            if response.tool_call_ids:
                state.phase = Phase.TOOL_LOOP
            elif state.phase is Phase.TOOL_LOOP:
                state.phase = Phase.NORMAL
            if response.usage is not None:
                _record_usage(state, response.usage)

    def forget(self, key: str | None) -> None:
        if key is not None:
            self._sessions.pop(key, None)


def _record_usage(state: SessionState, usage: Usage) -> None:
    state.reported_prompt_tokens = usage.prompt_tokens
    state.reported_cached_tokens = usage.cached_tokens
    state.context_tokens = max(state.context_tokens, usage.prompt_tokens + usage.completion_tokens)
