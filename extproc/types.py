"""Shared value types of the routing core.

Everything here is plain data: no I/O, no gRPC, no asyncio. The request parser produces a
``RequestSummary``, the response observer produces a ``ResponseSummary``, and the policy turns
them into a ``RouteDecision``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Clock = Callable[[], float]
"""Seconds as a float; ``time.monotonic`` live, a virtual clock in evaluation and simulation."""


class Api(enum.StrEnum):
    """The LLM wire protocols the router understands."""

    CHAT = "openai_chat"
    RESPONSES = "openai_responses"
    MESSAGES = "anthropic_messages"
    COMPLETIONS = "openai_completions"
    """OpenAI's legacy text completions (``prompt`` in, ``text_completion`` out)."""

    @property
    def error_style(self) -> str:
        return "anthropic" if self is Api.MESSAGES else "openai"


API_PATHS: dict[str, Api] = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/responses": Api.RESPONSES,
    "/v1/messages": Api.MESSAGES,
    "/v1/completions": Api.COMPLETIONS,
}


class Phase(enum.StrEnum):
    """Where a session stands, as the router sees it."""

    NEW = "new"
    NORMAL = "normal"
    TOOL_LOOP = "tool_loop"
    PROVIDER_STATE = "provider_state"
    IDLE_RESET = "idle_reset"
    DRIFT_RESET = "drift_reset"


class Action(enum.StrEnum):
    """What the router did with the session's model this turn."""

    NEW = "new"
    KEEP = "keep"
    SWITCH = "switch"
    LOCKED_KEEP = "locked_keep"


@dataclass(frozen=True, slots=True)
class SessionIdentity:
    """Who the session belongs to and how it was named.

    ``key`` is scoped by tenant, so two callers that send the same session id never share state.
    """

    tenant: str
    session_id: str | None
    source: str | None = None
    parent_session_id: str | None = None
    final: bool = False
    compaction: bool = False
    fallback: str | None = None
    """The session when the chain the request follows leads nowhere known (the
    conversation's fingerprint)."""
    opens: bool = False
    """A first request that names no session: it opens a new one (``route`` names it)."""

    @property
    def key(self) -> str | None:
        return None if self.session_id is None else f"{self.tenant}/{self.session_id}"


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """Everything routing needs from one request body, extracted in a single parse.

    ``tool_result_ids`` are the ids of the *pending* tool results: every tool result after the
    last assistant turn (a model has not answered them yet, whatever else the client added
    beside them); ``tool_results`` counts those results, ids or not, so a result whose id is
    missing or unknown still binds the request to the session's model. ``previous_response_id``
    is a provider-state reference wherever the body carries it (Responses, or Chat bodies from
    clients of other routers); ``provider_state`` holds fingerprints of non-portable items
    (encrypted reasoning, signed thinking) that only the issuing backend can read.

    ``session_hint`` is a session id the body names (Anthropic ``metadata.user_id``, the
    Responses ``prompt_cache_key``), below the harness headers in precedence; ``conversation``
    fingerprints the conversation's opening (system prompt and first user turn), the same on
    every turn of one conversation, for callers that name no session at all.
    """

    api: Api
    model: str
    stream: bool
    message_count: int
    context_tokens: int
    """The prompt's size in tokens: the model's own count when ``context_counted``, else an
    estimate from the body's bytes."""
    tools_offered: tuple[str, ...] = ()
    tool_call_ids: tuple[str, ...] = ()
    tool_result_ids: tuple[str, ...] = ()
    tool_results: int = 0
    previous_response_id: str | None = None
    provider_state: tuple[str, ...] = ()
    latest_text: str = ""
    session_hint: str | None = None
    session_hint_source: str | None = None
    conversation: str | None = None
    opening: bool = False
    """No answer of a model is in the history yet: the conversation's first request."""
    answer_mark: str | None = None
    """The mark of the newest answer text in the history (``apis.answer_mark``)."""
    task_marks: tuple[str, ...] = ()
    """A first request's: the marks of its first user message's text (``apis.task_marks``),
    the task a tool call of another session may have given it."""
    context_counted: bool = False
    """``context_tokens`` came from the model's tokenizer and chat template: a context over
    every candidate's window is refused, never sent for the engine to refuse."""
    may_issue: bool = True
    """The answer may carry ids the router must own: tools are offered (a call may come back),
    the API issues response ids (Responses), or signed thinking was asked for (Messages)."""
    body: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    raw: bytes = field(default=b"", repr=False, compare=False)
    """The body exactly as the client sent it: the model rewrite splices into it."""

    @property
    def has_provider_state(self) -> bool:
        return self.previous_response_id is not None or bool(self.provider_state)

    @property
    def pending_tool_results(self) -> bool:
        return self.tool_results > 0 or bool(self.tool_result_ids)

    @property
    def continued(self) -> tuple[str, ...]:
        """Every id the request continues, oldest first: provider state in the history, the
        previous response, the pending tool results (issued by the model's last answer)."""
        previous = (self.previous_response_id,) if self.previous_response_id else ()
        return (*self.provider_state, *previous, *self.tool_result_ids)

    @property
    def trail(self) -> str | None:
        """The newest id in the history that a model's answer issued (the previous response,
        else the last tool call, else the last provider state, else the mark of the last
        answer's text): whoever got it is the session this request continues, when it names
        none."""
        if self.previous_response_id:
            return self.previous_response_id
        for ids in (self.tool_call_ids, self.provider_state, self.tool_result_ids):
            if ids:
                return ids[-1]
        return self.answer_mark

    @property
    def newest(self) -> tuple[str, ...]:
        """The ids of the newest answer the request continues: its pending tool results, else
        its previous response, else its newest provider state."""
        if self.tool_result_ids:
            return self.tool_result_ids
        if self.previous_response_id:
            return (self.previous_response_id,)
        return self.provider_state[-1:]


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    estimated: bool = False
    """The router's estimate, not the engine's report (an answer that carried no usage: a
    stream whose client did not ask for it); ``cached_tokens`` is then unknown."""


@dataclass(slots=True)
class ResponseSummary:
    """What came back from the model: the ids it now owns and the usage it reported."""

    status: int = 0
    model: str | None = None
    response_id: str | None = None
    tool_call_ids: list[str] = field(default_factory=list)
    tool_names: list[str] = field(default_factory=list)
    provider_state: list[str] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None
    text: str = ""
    """The head of the answer's text (Chat), which its mark is made of (``apis.answer_mark``)."""
    arguments: dict[int, str | None] = field(default_factory=dict)
    """The arguments of the answer's tool calls by position (None: too long to keep), which
    their task marks are made of (``apis.task_mark``)."""
    output_chars: int = 0
    """Characters the answer generated (text, reasoning, tool calls' arguments): its output
    tokens are estimated from them when it reports no usage."""
