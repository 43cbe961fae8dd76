"""Anthropic Messages: ``system`` and ``messages[]`` of content blocks in, a ``message`` (or its
stream of events) out.

Tool state: assistant ``tool_use`` blocks (``id``), answered by ``tool_result`` blocks
(``tool_use_id``) in user messages. The results after the last assistant message are pending,
beside text blocks or followed by another user message alike. A final assistant message is a
prefill (the API continues it), so it does not answer them. Provider-bound: ``thinking`` blocks'
``signature`` and ``redacted_thinking`` blocks' ``data``, which only their issuer can verify.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import MalformedRequest
from ..types import ResponseSummary, Usage
from .common import (
    Facts,
    Turn,
    as_dict,
    as_list,
    canonical_json,
    conversation,
    count,
    fingerprint,
    hint,
    label,
    last_user_content,
    latest,
    nonempty_str,
    record_arguments,
    record_call,
    task_marks,
    text,
)

HINT_SOURCE = "metadata.user_id"


def entries(body: dict[str, Any]) -> list[Any]:
    return as_list(body.get("messages"))


def tools(body: dict[str, Any]) -> list[Any]:
    return as_list(body.get("tools"))


def system(body: dict[str, Any]) -> Any:
    return body.get("system")


def parse(body: dict[str, Any]) -> Facts:
    messages = entries(body)
    if not messages:
        raise MalformedRequest('"messages" must be a non-empty array')
    call_ids: list[str] = []
    state: list[str] = []
    answered = previous = -1  # the last assistant message, and the one before it
    first_user = -1
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise MalformedRequest(f'"messages[{i}]" must be an object')
        role = msg.get("role")
        if role == "assistant":
            answered, previous = i, answered
            for block in as_list(msg.get("content")):
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_use":
                    if call_id := nonempty_str(block.get("id")):
                        call_ids.append(call_id)
                elif key := _state_key(block):
                    state.append(key)
        elif role == "user" and first_user < 0:
            first_user = i
    if answered == len(messages) - 1:
        answered = previous
    results: list[str] = []
    pending = 0
    contents: list[Any] = []  # of the turn after the model's: tool outputs, then user text
    for msg in reversed(messages[answered + 1 :]):
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        for block in reversed(as_list(content)):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                pending += 1
                if result_id := nonempty_str(block.get("tool_use_id")):
                    results.append(result_id)
                contents.append(block.get("content"))
        contents.append(content)
    metadata = body.get("metadata")
    session = hint(metadata.get("user_id")) if isinstance(metadata, dict) else None
    return Facts(
        entries=len(messages),
        tool_call_ids=tuple(call_ids),
        tool_result_ids=tuple(reversed(results)),
        tool_results=pending,
        provider_state=tuple(state),
        latest_text=latest(contents or [last_user_content(messages)]),
        conversation=conversation(body.get("system"), messages, first_user),
        session_hint=session,
        session_hint_source=HINT_SOURCE if session else None,
        opening=answered < 0,
        task_marks=task_marks(messages[first_user].get("content"))
        if answered < 0 and first_user >= 0 else (),
    )


def _state_key(block: dict[str, Any]) -> str | None:
    """The provider-state key of a signed or redacted thinking block."""
    kind = block.get("type")
    if kind == "thinking" and (signature := nonempty_str(block.get("signature"))):
        return fingerprint("thinking", signature)
    if kind == "redacted_thinking" and (data := nonempty_str(block.get("data"))):
        return fingerprint("thinking", data)
    return None


def turns(message: dict[str, Any]) -> Iterator[Turn]:
    role = message.get("role", "user")
    role = role if isinstance(role, str) else "user"
    content = message.get("content")
    if rendered := text(content):
        yield role, rendered
    for block in as_list(content):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_use":
            yield role, f"call {label(block.get('name'))} {canonical_json(block.get('input'))}"
        elif block.get("type") == "tool_result":
            result = f"result {label(block.get('tool_use_id'))}\n{text(block.get('content'))}"
            yield role, result


# -- the answer ------------------------------------------------------------------------------


def document(summary: ResponseSummary, doc: dict[str, Any]) -> None:
    for position, block in enumerate(as_list(doc.get("content"))):
        _answer_block(summary, as_dict(block), position)
    summary.finish_reason = nonempty_str(doc.get("stop_reason")) or summary.finish_reason
    _usage(summary, doc.get("usage"))


def event(summary: ResponseSummary, data: dict[str, Any]) -> bool:
    kind = data.get("type")
    if kind == "message_start":
        message = as_dict(data.get("message"))
        summary.model = nonempty_str(message.get("model")) or summary.model
        _usage(summary, message.get("usage"))
    elif kind == "content_block_start":
        _answer_block(summary, as_dict(data.get("content_block")), data.get("index"))
    elif kind == "content_block_delta":
        delta = as_dict(data.get("delta"))
        if delta.get("type") == "signature_delta" and (
            signature := nonempty_str(delta.get("signature"))
        ):
            summary.provider_state.append(fingerprint("thinking", signature))
        elif delta.get("type") == "input_json_delta":
            record_arguments(summary, data.get("index"), delta.get("partial_json"))
    elif kind == "message_delta":
        reason = nonempty_str(as_dict(data.get("delta")).get("stop_reason"))
        summary.finish_reason = reason or summary.finish_reason
        output = as_dict(data.get("usage")).get("output_tokens")
        if summary.usage is not None and output is not None:
            summary.usage.completion_tokens = count(output)
    return kind == "message_stop"


def _answer_block(summary: ResponseSummary, block: dict[str, Any], position: Any) -> None:
    """A content block of the answer at ``position``; a streamed ``tool_use`` starts with an
    empty input that its ``input_json_delta`` events fill."""
    if block.get("type") == "tool_use":
        record_call(summary, block.get("id"), block.get("name"))
        given = block.get("input")
        record_arguments(summary, position, canonical_json(given) if given else "")
    elif key := _state_key(block):
        summary.provider_state.append(key)


def _usage(summary: ResponseSummary, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    cached = count(usage.get("cache_read_input_tokens"))
    created = count(usage.get("cache_creation_input_tokens"))
    summary.usage = Usage(
        prompt_tokens=count(usage.get("input_tokens")) + cached + created,
        completion_tokens=count(usage.get("output_tokens")),
        cached_tokens=cached,
    )
