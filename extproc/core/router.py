"""The routing core: request in, route out; response facts in, memory updated. No I/O.

The gRPC servicer calls ``route`` once per LLM request (after the body is buffered) and
``response_started`` / ``response_finished`` as the answer passes back. Everything here is
synchronous and reads time from the injected clock, so the evaluation matrix and the tests drive
the very same object without Envoy or gRPC.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from ..apis.request import parse_request
from ..config import Config
from ..errors import RoutingError, SessionPaused
from ..observability.metrics import Metrics
from ..observability.replay import JsonlSink, ReplayStore
from ..observability.trace import MooncakeTraceWriter
from ..scheduling.placement import Placement, Pools, Prompt
from ..state.memory import RouterMemory, SessionState, Turn
from ..types import API_PATHS, Action, Api, Clock, RequestSummary, ResponseSummary, SessionIdentity
from .health import ModelHealth
from .identity import IdentityReader
from .saar import RoutingDecision, SaarEngine
from .selection import Selector

DESTINATION_HEADER = "x-gateway-destination-endpoint"
DIAGNOSTIC_PREFIX = "x-saar-"
PENDING_TTL_SECONDS = 900.0


def api_for(method: str, path: str) -> Api | None:
    """The LLM API of a request, or None for traffic that passes through untouched."""
    if method != "POST":
        return None
    return API_PATHS.get(path.split("?", 1)[0].rstrip("/"))


@dataclass(frozen=True, slots=True)
class Routed:
    replay_id: str
    model: str
    cluster: str
    body: bytes | None
    """The rewritten body, or None when the client already named the physical model."""
    diagnostics: dict[str, str]
    """Response headers for the client (Envoy adds them from dynamic metadata)."""
    workers: tuple[str, ...] = ()
    """The picked worker first, then fallbacks; empty when Envoy's balancer decides."""
    stream: bool = False
    """The client asked for a streamed (SSE) answer."""


@dataclass(slots=True)
class _Pending:
    turn: Turn
    api: Api
    started: float
    placement: Placement
    final: bool = False
    committed: bool = False
    status: int = 0
    served: str | None = None
    blocks: tuple[int, ...] = ()
    """Prompt blocks, kept only when a Mooncake trace is written."""
    delay: float | None = None
    """Seconds since the session's previous response ended (the agent's tool time)."""


class _PendingTurns:
    """Turns routed but not yet answered, by replay id: insertion-ordered, so expiring the
    abandoned ones (a stream Envoy never finished) costs O(1) amortised per request."""

    def __init__(self, maxsize: int, ttl: float) -> None:
        self._maxsize = maxsize
        self._ttl = ttl
        self._turns: OrderedDict[str, _Pending] = OrderedDict()

    def add(self, replay_id: str, pending: _Pending) -> None:
        self._turns[replay_id] = pending
        while self._turns:
            oldest = next(iter(self._turns.values()))
            if len(self._turns) <= self._maxsize and pending.started - oldest.started < self._ttl:
                break
            self._turns.popitem(last=False)

    def get(self, replay_id: str) -> _Pending | None:
        return self._turns.get(replay_id)

    def pop(self, replay_id: str) -> _Pending | None:
        return self._turns.pop(replay_id, None)


class Router:
    def __init__(
        self,
        config: Config,
        *,
        clock: Clock = time.time,
        metrics: Metrics | None = None,
        selector: Selector | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.identity = IdentityReader(
            config.identity.tenant_header,
            config.identity.extra_session_headers,
            config.identity.max_value_bytes,
        )
        self.memory = RouterMemory(
            clock=clock,
            max_sessions=config.memory.max_sessions,
            session_ttl=config.memory.session_ttl_seconds,
            max_owned_ids=config.memory.max_owned_ids,
        )
        self.health = ModelHealth(
            clock=clock,
            failure_threshold=config.health.failure_threshold,
            cooldown=config.health.cooldown_seconds,
        )
        self.engine = SaarEngine(config, self.memory, self.health, clock=clock, selector=selector)
        self.pools = Pools(config, clock=clock)
        sink = JsonlSink(config.replay.jsonl_path) if config.replay.jsonl_path else None
        self.replay = ReplayStore(config.replay.capacity, sink)
        self._trace_sink = (
            JsonlSink(config.replay.mooncake_trace_path)
            if config.replay.mooncake_trace_path else None
        )
        self.trace = MooncakeTraceWriter(self._trace_sink.write) if self._trace_sink else None
        self._pending = _PendingTurns(config.memory.max_sessions, PENDING_TTL_SECONDS)
        self._protected = frozenset({DESTINATION_HEADER, config.routing.cluster_header.lower()})

    def spoofed(self, headers: Mapping[str, str]) -> list[str]:
        """Client headers that Envoy or we would trust for routing: always removed."""
        names = [h for h in headers if h in self._protected or h.startswith(DIAGNOSTIC_PREFIX)]
        for name in names:
            self.metrics.stripped_headers.labels(name).inc()
        return names

    def route(
        self,
        api: Api,
        headers: Mapping[str, str],
        raw: bytes,
        *,
        subset: frozenset[str] | None = None,
        admit_paused: bool = False,
    ) -> Routed:
        """Decide where one LLM request goes: model, then worker. Raises ``RoutingError``
        (already counted); ``SessionPaused`` unless ``admit_paused`` (a hold that timed out)."""
        started = time.perf_counter()
        try:
            request = parse_request(api, raw, max_body_bytes=self.config.limits.max_body_bytes)
            identity = self.identity.read(headers)
            if not admit_paused and self.pools.admission.is_paused(identity.key):
                assert identity.key is not None
                tick = self.config.scheduling.admission.tick_seconds
                raise SessionPaused(identity.key, retry_after=max(1, round(tick)))
            prompt = Prompt(request)
            state = self.memory.session(identity.key)
            decision = self.engine.decide(
                request, identity, headers, state, lambda m: self.pools.cached_tokens(prompt, m)
            )
            placement = self.pools.place(prompt, decision.model, identity.key, subset)
        except RoutingError as exc:
            self.metrics.errors.labels(exc.code).inc()
            raise
        replay_id = self.replay.new_id()
        pending = self._remember(replay_id, request, identity, decision, placement, state)
        if state is not None:
            pending.delay = max(0.0, pending.started - state.last_seen)
        if self.trace is not None:
            pending.blocks = self.pools.blocks(prompt, decision.model)
        self.pools.started(placement, identity.key, request.context_tokens)
        if placement.worker is not None:
            self.metrics.worker_picks.labels(decision.model, placement.worker).inc()
        body = None
        if decision.model != request.model:
            request.body["model"] = decision.model
            body = orjson.dumps(request.body)
        self._count(api, decision)
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        return Routed(
            replay_id,
            decision.model,
            self.config.models[decision.model].cluster,
            body,
            diagnostics(replay_id, decision, request),
            placement.workers,
            request.stream,
        )

    def response_started(self, replay_id: str, status: int, served: str | None = None) -> None:
        """The upstream answered (``served``: the worker Envoy sent it to, when known): a 2xx
        commits the turn to memory, a 5xx does not."""
        pending = self._pending.get(replay_id)
        if pending is None:
            return
        model = pending.turn.model
        pending.status = status
        if served:
            pending.served = served
            self.pools.served(pending.placement, served)
        self.health.record(model, status)
        self.metrics.responses.labels(model, f"{status // 100}xx").inc()
        if 200 <= status < 300 and not pending.committed:
            pending.committed = True
            before = self.memory.commit(pending.turn)
            if before is not None and before != model:
                self.metrics.switches.labels(before, model).inc()
            self.metrics.live_sessions.set(len(self.memory))

    def response_finished(self, replay_id: str, response: ResponseSummary) -> None:
        pending = self._pending.pop(replay_id)
        if pending is None:
            return
        if pending.committed:
            self.memory.record_response(pending.turn, response)
        usage = response.usage
        self.pools.finished(
            pending.placement,
            pending.turn.session_key,
            usage.prompt_tokens if usage else pending.turn.context_tokens,
            usage.completion_tokens if usage else 0,
        )
        if pending.final:
            self.memory.forget(pending.turn.session_key)
            self.pools.admission.release(pending.turn.session_key)
            self.metrics.live_sessions.set(len(self.memory))
        if self.trace is not None:
            self._trace(pending, response)
        self.replay.complete(
            replay_id,
            {
                "status": pending.status,
                "served_worker": pending.served,
                "model": response.model,
                "latency_ms": round((self.clock() - pending.started) * 1000, 3),
                "finish_reason": response.finish_reason,
                "tool_names": response.tool_names,
                "tool_calls": len(response.tool_call_ids),
                "response_id": response.response_id,
                "usage": None
                if usage is None
                else {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "cached_tokens": usage.cached_tokens,
                },
            },
        )

    def close(self) -> None:
        """Flush the replay and trace sinks."""
        self.replay.close()
        if self._trace_sink is not None:
            self._trace_sink.close()

    def _trace(self, pending: _Pending, response: ResponseSummary) -> None:
        assert self.trace is not None
        key = pending.turn.session_key
        usage = response.usage
        self.trace.write(
            session_id=None if key is None else xxhash.xxh3_64_hexdigest(key.encode()),
            timestamp_ms=pending.started * 1000,
            input_length=max(1, usage.prompt_tokens if usage else pending.turn.context_tokens),
            output_length=usage.completion_tokens if usage else 0,
            block_hashes=pending.blocks,
            delay_ms=None if pending.delay is None else pending.delay * 1000,
        )

    def api_of(self, replay_id: str) -> Api | None:
        pending = self._pending.get(replay_id)
        return pending.api if pending else None

    # -- internals -------------------------------------------------------------------------

    def _remember(
        self,
        replay_id: str,
        request: RequestSummary,
        identity: SessionIdentity,
        decision: RoutingDecision,
        placement: Placement,
        state: SessionState | None,
    ) -> _Pending:
        now = self.clock()
        turn = Turn(
            identity.key,
            decision.model,
            decision.decision,
            decision.phase,
            decision.action is Action.SWITCH,
            request.context_tokens,
            replay_id,
            now,
        )
        pending = _Pending(turn, request.api, now, placement, identity.final)
        self._pending.add(replay_id, pending)
        self.replay.put(
            decision_record(replay_id, now, request, identity, decision, placement, state)
        )
        return pending

    def _count(self, api: Api, decision: RoutingDecision) -> None:
        self.metrics.requests.labels(api.value, decision.decision).inc()
        self.metrics.decisions.labels(decision.action.value, decision.reason).inc()
        if decision.lock:
            self.metrics.locks.labels(decision.lock).inc()
        if decision.reset:
            self.metrics.resets.labels(decision.reset).inc()


def diagnostics(
    replay_id: str, decision: RoutingDecision, request: RequestSummary
) -> dict[str, str]:
    return {
        "x-replay-id": replay_id,
        "x-saar-selected-model": decision.model,
        "x-saar-decision": decision.decision,
        "x-saar-session-phase": decision.phase.value,
        "x-saar-action": decision.action.value,
        "x-saar-confidence": f"{decision.confidence:.3f}",
        "x-saar-context-tokens": str(request.context_tokens),
    }


def decision_record(
    replay_id: str,
    now: float,
    request: RequestSummary,
    identity: SessionIdentity,
    decision: RoutingDecision,
    placement: Placement,
    state: SessionState | None,
) -> dict[str, Any]:
    """The content-free replay record of one decision; ``memory`` is the session's router
    memory as the decision saw it (``previous_replay_id`` chains a session's records)."""
    base = decision.base
    result = placement.result
    return {
        "replay_id": replay_id,
        "time": now,
        "session": {
            "id": identity.session_id,
            "tenant": identity.tenant,
            "source": identity.source,
            "parent": identity.parent_session_id,
            "final": identity.final,
            "compaction": identity.compaction,
        },
        "memory": None
        if state is None
        else {
            "model": state.model,
            "decision": state.decision,
            "phase": state.phase.value,
            "turns": state.turns,
            "switches": state.switches,
            "recent_switches_ago_s": [round(now - t, 3) for t in state.switch_times],
            "idle_s": round(now - state.last_seen, 3),
            "context_tokens": state.context_tokens,
            "estimated_reuse_tokens": state.estimated_reuse_tokens,
            "reported_prompt_tokens": state.reported_prompt_tokens,
            "reported_cached_tokens": state.reported_cached_tokens,
            "previous_replay_id": state.last_replay_id,
        },
        "request": {
            "api": request.api.value,
            "model": request.model,
            "stream": request.stream,
            "messages": request.message_count,
            "context_tokens": request.context_tokens,
            "tools_offered": len(request.tools_offered),
            "tool_results": len(request.tool_result_ids),
            "previous_response_id": request.previous_response_id is not None,
            "provider_state_items": len(request.provider_state),
        },
        "base": None
        if base is None
        else {
            "decision": base.decision,
            "model": base.model,
            "difficulty": round(base.difficulty, 4),
            "matched": base.matched,
            "confidence": round(base.confidence, 4),
            "scores": {k: round(v, 4) for k, v in base.scores.items()},
        },
        "lock": decision.lock,
        "reset": decision.reset,
        "candidates": [
            {
                "model": t.model,
                "base": round(t.base, 4),
                "stay_bias": t.stay_bias,
                "handoff": t.handoff,
                "history": round(t.history, 4),
                "cache_penalty": round(t.cache_penalty, 4),
                "transition_usd": round(t.transition_usd, 6),
                "adjusted": round(t.adjusted, 4),
                "available": t.available,
            }
            for t in decision.candidates
        ],
        "previous_model": decision.previous_model,
        "decision": decision.decision,
        "model": decision.model,
        "action": decision.action.value,
        "phase": decision.phase.value,
        "reason": decision.reason,
        "confidence": round(decision.confidence, 4),
        "worker": None
        if result is None
        else {
            "picked": placement.worker,
            "fallbacks": list(placement.workers[1:]),
            "matched_blocks": dict(result.matched_blocks),
            "scores": {k: round(v, 4) for k, v in result.total.items()},
        },
    }
