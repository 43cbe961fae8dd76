"""One parse of a request body into a ``RequestSummary``: the fields every API shares here, the
rest from the API's own module.

The body is parsed once (orjson) and walked once: the history for the ids the model owns, the
tail after the model's last turn for the pending tool results and the text a classifier reads.
Content strings are never copied beyond that tail, so a 4 MB agent body costs little more than
its ``orjson.loads``. Only two errors come out, both ``RoutingError``: ``BodyTooLarge`` (413)
and ``MalformedRequest`` / ``MissingModel`` (400).

``stream`` must be a JSON boolean (or null): OpenAI rejects ``"stream": "false"`` while vLLM
reads it as a boolean, so guessing would make the router and the upstream disagree about the
shape of the answer. ``conversation`` is None when the body carries ``previous_response_id``:
its opening then lives with the provider, and the reference itself binds the session.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import BodyTooLarge, MalformedRequest, MissingModel
from ..types import Api, RequestSummary
from .common import nonempty_str
from .formats import FORMATS
from .tools import names, offered

CHARS_PER_TOKEN = 4
"""Rough context estimate before any tokenizer sees the prompt (English text and code). It is
taken over the raw body: walking every JSON string cost a third of the decision time, and the
JSON punctuation it adds is a few percent of an agent body."""


def parse_request(api: Api, raw: bytes, *, max_body_bytes: int) -> RequestSummary:
    if len(raw) > max_body_bytes:
        raise BodyTooLarge(f"request body is {len(raw)} bytes; the limit is {max_body_bytes}")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise MalformedRequest("request body must be a JSON object")
    model = nonempty_str(body.get("model"))
    if model is None:
        raise MissingModel('request body has no "model" string')
    facts = FORMATS[api].parse(body)
    tools = names(offered(FORMATS[api].tools(body)))
    # A completion carries no provider state, wherever a client puts the field.
    previous = (None if api is Api.COMPLETIONS
                else nonempty_str(body.get("previous_response_id")))
    return RequestSummary(
        api=api,
        model=model,
        stream=_stream(body.get("stream")),
        message_count=facts.entries,
        context_tokens=len(raw) // CHARS_PER_TOKEN,
        tools_offered=tools,
        tool_call_ids=facts.tool_call_ids,
        tool_result_ids=facts.tool_result_ids,
        tool_results=facts.tool_results,
        previous_response_id=previous,
        provider_state=facts.provider_state,
        latest_text=facts.latest_text,
        session_hint=facts.session_hint,
        session_hint_source=facts.session_hint_source,
        conversation=None if previous else facts.conversation,
        opening=facts.opening and previous is None,
        answer_mark=facts.answer_mark,
        task_marks=facts.task_marks if previous is None else (),
        may_issue=_may_issue(api, body, tools),
        body=body,
        raw=raw,
    )


def _may_issue(api: Api, body: dict[str, Any], tools: tuple[str, ...]) -> bool:
    """Whether the answer may carry ids the router must own (see ``RequestSummary``)."""
    if api is Api.COMPLETIONS:
        return False
    if api is Api.RESPONSES or tools or body.get("functions"):
        return True
    return api is Api.MESSAGES and body.get("thinking") is not None


def _stream(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return value is True
    raise MalformedRequest('"stream" must be a boolean')
