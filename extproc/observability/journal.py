"""The core's ``Journal``: decisions and outcomes turned into replay records and trace rows.

A record is content-free: counts, ids, scores and prices, never prompt text. It holds what
``saar replay what-if`` needs to decide the turn again (the matched decision and whether it
matched on content, a fingerprint of the provider state referenced, the tokens SAAR's pricing
measured cached on each model's best worker), the core's timings, the request's holds at the
processor, and the client's W3C ``traceparent`` when well formed (the service's span continues
it). ``memory`` is the session's record as the decision saw it (``previous_replay_id`` chains a
session's records).

With a Mooncake trace writer, every request routed becomes a row when its stream ends (the
blocks and the tool time are kept until then, for requests in flight only).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import xxhash

from ..core.journal import Decided, Outcome
from ..scheduling.types import Prediction
from ..types import ResponseSummary
from .replay import Record, ReplayStore
from .trace import MooncakeTraceWriter

if TYPE_CHECKING:
    from .metrics import Metrics

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_TRACED_IN_FLIGHT = 100_000
"""Requests whose trace row waits for their end; a stream that never ends is forgotten past it."""


def id_ref(value: str) -> str:
    """A fingerprint of an id for the record (the what-if matches references to issuers)."""
    return xxhash.xxh3_64_hexdigest(value.encode())


class ReplayJournal:
    """Writes each decision into ``replay`` and each outcome part onto its record."""

    def __init__(self, replay: ReplayStore, trace: MooncakeTraceWriter | None = None,
                 metrics: Metrics | None = None) -> None:
        self.replay = replay
        self._trace = trace
        self._metrics = metrics
        self._traced: OrderedDict[str, tuple[str | None, float, int, Sequence[int],
                                             float | None]] = OrderedDict()
        """replay id → (session key, started, context tokens, blocks, tool delay) in flight."""
        self._usage: dict[str, tuple[int, int]] = {}

    def decided(self, entry: Decided) -> None:
        self.replay.put(decision_record(entry))
        split = entry.placement.split
        if self._metrics is not None and split is not None:
            model = entry.decision.model
            self._metrics.pd_decisions.labels(model, split.reason).inc()
            if split.prefill is not None:
                self._metrics.prefill_picks.labels(model, split.prefill).inc()
        if self._trace is not None:
            state = entry.state
            delay = None if state is None else max(0.0, entry.time - state.last_seen)
            self._traced[entry.replay_id] = (entry.identity.key, entry.time,
                                             entry.request.context_tokens,
                                             entry.placement.blocks, delay)
            while len(self._traced) > MAX_TRACED_IN_FLIGHT:
                stale, _ = self._traced.popitem(last=False)
                self._usage.pop(stale, None)

    def completed(self, replay_id: str, outcome: Outcome) -> None:
        self.replay.complete(replay_id, outcome_fields(outcome))
        if self._trace is None:
            return
        usage = outcome.response.usage if outcome.response is not None else None
        if usage is not None and replay_id in self._traced:
            self._usage[replay_id] = (usage.prompt_tokens, usage.completion_tokens)
        if outcome.latency_ms is not None:
            self._row(replay_id)

    def _row(self, replay_id: str) -> None:
        assert self._trace is not None
        found = self._traced.pop(replay_id, None)
        if found is None:
            return
        key, started, tokens, blocks, delay = found
        prompt, completion = self._usage.pop(replay_id, (tokens, 0))
        self._trace.write(
            session_id=None if key is None else xxhash.xxh3_64_hexdigest(key.encode()),
            timestamp_ms=started * 1000, input_length=max(1, prompt),
            output_length=completion, block_hashes=blocks,
            delay_ms=None if delay is None else delay * 1000)


def outcome_fields(outcome: Outcome) -> Record:
    """The record's outcome keys this part sets (the status and worker where the caller saw
    them, what the answer carried where it read that)."""
    out: Record = {}
    if outcome.status is not None:
        out["status"] = outcome.status
        out["served_worker"] = outcome.served
    if outcome.response is not None:
        out.update(response_fields(outcome.response))
    if outcome.aborted:
        out["aborted"] = True
    if outcome.latency_ms is not None:
        out["latency_ms"] = outcome.latency_ms
    if outcome.first_chunk_ms is not None:
        out["first_chunk_ms"] = outcome.first_chunk_ms
    if outcome.refused is not None:
        out["refused"] = outcome.refused
        out["retry_after"] = outcome.retry_after
    return out


def response_fields(response: ResponseSummary) -> Record:
    usage = response.usage
    return {
        "model": response.model,
        "finish_reason": response.finish_reason,
        "tool_names": response.tool_names,
        "tool_calls": len(response.tool_call_ids),
        "response_id": response.response_id,
        "usage": None if usage is None else {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": None if usage.estimated else usage.cached_tokens,
            "source": "estimated" if usage.estimated else "engine",
        },
    }


def decision_record(entry: Decided) -> dict[str, Any]:
    """The content-free replay record of one decision."""
    request, identity, decision = entry.request, entry.identity, entry.decision
    placement, state, timings, now = entry.placement, entry.state, entry.timings, entry.time
    base = decision.base
    result = placement.result
    traceparent = entry.traceparent
    return {
        "replay_id": entry.replay_id,
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
            "worker": state.worker,
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
            "tool_results": max(request.tool_results, len(request.tool_result_ids)),
            "previous_response_id": request.previous_response_id is not None,
            "previous_response_ref": None
            if request.previous_response_id is None else id_ref(request.previous_response_id),
            "provider_state_items": len(request.provider_state),
        },
        "base": None
        if base is None
        else {
            "decision": base.decision,
            "model": base.model,
            "difficulty": round(base.difficulty, 4),
            "matched": base.matched,
            "topical": base.topical,
            "confidence": round(base.confidence, 4),
            "scores": {k: round(v, 4) for k, v in base.scores.items()},
        },
        "cached_tokens": dict(entry.cached),
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
                "remaining_turns": t.remaining_turns,
                "saving_usd": round(t.saving_usd, 6),
                "risk_usd": round(t.risk_usd, 6),
                "held": t.held,
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
            "pinned": decision.pinned_worker,
            "fallbacks": list(placement.workers[1:]),
            "matched_blocks": dict(result.matched_blocks),
            "scores": {k: round(v, 4) for k, v in result.total.items()},
            "by_scorer": {name: {k: round(v, 4) for k, v in scores.items()}
                          for name, scores in result.scores.items()},
            "predicted": {address: prediction_fields(p)
                          for address, p in result.predicted.items()} or None,
        },
        "pd": None
        if placement.split is None
        else {
            "split": placement.split.prefill is not None,
            "reason": placement.split.reason,
            "uncached_tokens": placement.split.uncached_tokens,
            "decode": placement.worker,
            "prefill": placement.split.prefill,
            "prefill_scores": {k: round(v, 4) for k, v in placement.split.scores.items()},
        },
        "timings_us": None
        if timings is None
        else {
            "parse": _us(timings.parse),
            "identity": _us(timings.identity),
            "load": _us(timings.load),
            "saar": _us(timings.saar),
            "scheduling": _us(timings.scheduling),
            "plugins": {name: _us(seconds) for name, seconds in timings.plugins.items()},
            "held": _us(timings.held),
        },
        "holds": [{"kind": h.kind, "ms": round((h.until - h.since) * 1e3, 1)}
                  for h in entry.holds] or None,
        "traceparent": traceparent
        if traceparent is not None and _TRACEPARENT.fullmatch(traceparent) else None,
    }


def prediction_fields(prediction: Prediction) -> dict[str, float]:
    """One candidate's predicted time to first token, term by term in seconds (the
    ``predicted`` cost form), with the tokens they were priced from."""
    p = prediction
    return {
        "ttft_s": round(p.ttft_s, 6), "wait_s": round(p.wait_s, 6),
        "prefill_s": round(p.prefill_s, 6), "steps_s": round(p.steps_s, 6),
        "overhead_s": round(p.overhead_s, 6), "interference_s": round(p.interference_s, 6),
        "adapter_s": round(p.adapter_s, 6), "evicts_s": round(p.evicts_s, 6),
        "cost_s": round(p.cost_s, 6), "uncached_tokens": round(p.uncached_tokens),
        "ahead_tokens": round(p.ahead_tokens), "decoding": p.decoding,
    }


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)
