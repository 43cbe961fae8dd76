"""OpenAI Chat Completions: ``messages[]`` in, a ``chat.completion`` (or its chunks) out.

Tool state: an assistant message's ``tool_calls[].id``, answered by ``role: "tool"`` messages
with ``tool_call_id`` (legacy ``role: "function"`` results carry no id). The results after the
last assistant message are pending, even when harnesses add a user message beside them (system
reminders). A final assistant message marked ``prefix: true`` (DeepSeek's prefix completion) or
sent with ``continue_final_message`` (vLLM) is a prefill the model continues, not an answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import MalformedRequest
from ..types import ResponseSummary
from .common import (
    Facts,
    Turn,
    answer_mark,
    as_dict,
    as_list,
    canonical_json,
    conversation,
    label,
    last_user_content,
    latest,
    nonempty_str,
    record_arguments,
    record_call,
    record_output,
    record_text,
    record_usage,
    task_marks,
    text,
)

_RESULT_ROLES = ("tool", "function")


def entries(body: dict[str, Any]) -> list[Any]:
    return as_list(body.get("messages"))


def tools(body: dict[str, Any]) -> list[Any]:
    return as_list(body.get("tools"))


def system(body: dict[str, Any]) -> Any:
    """Chat has no top-level system prompt: system messages render as turns."""
    return None


def parse(body: dict[str, Any]) -> Facts:
    messages = entries(body)
    if not messages:
        raise MalformedRequest('"messages" must be a non-empty array')
    call_ids: list[str] = []
    answered = previous = -1  # the last assistant message, and the one before it
    first_user = -1
    said = ""  # the newest answer's text
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise MalformedRequest(f'"messages[{i}]" must be an object')
        role = msg.get("role")
        if role == "assistant":
            answered, previous = i, answered
            said = text(msg.get("content")) or said
            for call in as_list(msg.get("tool_calls")):
                if isinstance(call, dict) and (call_id := nonempty_str(call.get("id"))):
                    call_ids.append(call_id)
        elif role == "user" and first_user < 0:
            first_user = i
    last = messages[-1]
    if answered == len(messages) - 1 and (
        last.get("prefix") is True or body.get("continue_final_message") is True
    ):
        answered = previous
    results: list[str] = []
    pending = 0
    contents: list[Any] = []  # of the turn after the model's: tool outputs and user messages
    for msg in reversed(messages[answered + 1 :]):
        role = msg.get("role")
        if role in _RESULT_ROLES:
            pending += 1
            if result_id := nonempty_str(msg.get("tool_call_id")):
                results.append(result_id)
            contents.append(msg.get("content"))
        elif role == "user":
            contents.append(msg.get("content"))
    return Facts(
        entries=len(messages),
        tool_call_ids=tuple(call_ids),
        tool_result_ids=tuple(reversed(results)),
        tool_results=pending,
        latest_text=latest(contents or [last_user_content(messages)]),
        conversation=conversation(None, messages, first_user),
        opening=answered < 0,
        answer_mark=answer_mark(said),
        task_marks=task_marks(messages[first_user].get("content"))
        if answered < 0 and first_user >= 0 else (),
    )


def turns(message: dict[str, Any]) -> Iterator[Turn]:
    role = message.get("role", "user")
    role = role if isinstance(role, str) else "user"
    content = text(message.get("content"))
    if content:
        yield role, content
    for call in as_list(message.get("tool_calls")):
        function = as_dict(as_dict(call).get("function"))
        arguments = canonical_json(function.get("arguments"))
        yield role, f"call {label(function.get('name'))} {arguments}"
    if role == "tool":
        yield role, f"result {label(message.get('tool_call_id'))}"


# -- the answer ------------------------------------------------------------------------------


def document(summary: ResponseSummary, doc: dict[str, Any]) -> None:
    for choice in as_list(doc.get("choices")):
        choice = as_dict(choice)
        message = as_dict(choice.get("message"))
        record_text(summary, message.get("content"))
        record_output(summary, _reasoning(message))
        for call in as_list(message.get("tool_calls")):
            call, function = as_dict(call), as_dict(as_dict(call).get("function"))
            record_arguments(summary, len(summary.arguments), function.get("arguments"))
            record_call(summary, call.get("id"), function.get("name"))
        summary.finish_reason = nonempty_str(choice.get("finish_reason")) or summary.finish_reason
    record_usage(summary, doc.get("usage"))


def event(summary: ResponseSummary, chunk: dict[str, Any]) -> bool:
    """A ``chat.completion.chunk``; the stream ends with ``data: [DONE]``, not an event."""
    summary.model = nonempty_str(chunk.get("model")) or summary.model
    for choice in as_list(chunk.get("choices")):
        choice = as_dict(choice)
        delta = as_dict(choice.get("delta"))
        record_text(summary, delta.get("content"))
        record_output(summary, _reasoning(delta))
        for call in as_list(delta.get("tool_calls")):
            call, function = as_dict(call), as_dict(as_dict(call).get("function"))
            starts = nonempty_str(call.get("id")) is not None
            position = call.get("index")
            if type(position) is not int:  # a server that numbers no calls: one at a time
                position = len(summary.arguments) - (0 if starts else 1)
            record_arguments(summary, position, function.get("arguments"))
            if starts:
                record_call(summary, call["id"], function.get("name"))
        summary.finish_reason = nonempty_str(choice.get("finish_reason")) or summary.finish_reason
    record_usage(summary, chunk.get("usage"))
    return False


def _reasoning(message: dict[str, Any]) -> Any:
    """A reasoning parser's text (vLLM: ``reasoning``, before it ``reasoning_content``; a
    server may send both, the same text)."""
    reasoning = message.get("reasoning")
    return reasoning if reasoning is not None else message.get("reasoning_content")
