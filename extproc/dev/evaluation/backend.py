"""The simulated model servers: answer a turn on the served model and price it.

Every policy is priced by the same cache-aware model (unlike the article, whose baseline got no
cache): each physical model keeps, per session, the prompt it last served; the next prompt on
that model reads that prefix from cache unless it idled past ``CACHE_TTL_SECONDS``. So a switch
pays a full re-prefill, and a switch back finds the old prefix if it is still warm.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...apis import fingerprint
from ...config import Model
from ...observability.sessions import turn_cost
from ...types import ResponseSummary, Usage
from .oracle import Oracle

CACHE_TTL_SECONDS = 600.0
"""How long an idle session prefix survives in a model's prefix cache under load."""



@dataclass(frozen=True, slots=True)
class Reply:
    """What the simulated client asked the model to answer this turn (drawn before routing)."""

    session: str
    turn: int
    prompt_tokens: int
    completion_tokens: int
    tool_calls: tuple[str, ...]
    """Names of the tools the model calls; empty for a text answer."""
    responses_api: bool
    reasoning: bool


@dataclass(frozen=True, slots=True)
class Answer:
    summary: ResponseSummary
    reasoning_blob: str | None
    cost_usd: float


class Backend:
    def __init__(self, models: dict[str, Model], oracle: Oracle) -> None:
        self._models = models
        self._oracle = oracle
        self._prefix: dict[tuple[str, str], tuple[int, float]] = {}

    def serve(self, model: str, reply: Reply, now: float) -> Answer:
        key = (reply.session, model)
        warm = self._prefix.get(key)
        cached = 0
        if warm is not None and now - warm[1] <= CACHE_TTL_SECONDS:
            cached = min(warm[0], reply.prompt_tokens)
        self._prefix[key] = (reply.prompt_tokens, now)
        usage = Usage(reply.prompt_tokens, reply.completion_tokens, cached)
        mint = self._oracle.mint
        calls = [
            mint("call", model, reply.session, reply.turn, i) for i in range(len(reply.tool_calls))
        ]
        summary = ResponseSummary(
            status=200,
            model=model,
            tool_call_ids=calls,
            tool_names=list(reply.tool_calls),
            usage=usage,
            finish_reason="tool_calls" if calls else "stop",
        )
        blob = None
        if reply.responses_api:
            summary.response_id = mint("resp", model, reply.session, reply.turn)
            if reply.reasoning:
                blob = mint("enc", model, reply.session, reply.turn)
                summary.provider_state.append(fingerprint("reasoning", blob))
        return Answer(summary, blob, turn_cost(self._models[model], usage))
