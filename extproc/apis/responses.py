"""OpenAI Responses: ``instructions`` and ``input`` (a string or items) in, a ``response`` (or
its stream of ``response.*`` events) out.

Tool state: ``*_call`` items with a ``call_id`` (``function_call``, ``custom_tool_call``, ...,
with a ``namespace`` when the tool was offered in one), answered by ``*_call_output`` items.
Tools come in ``tools`` or in ``additional_tools`` input items (see ``tools``). The outputs
after the model's last item (an assistant message, a call, reasoning) are pending, whatever the
client put after them. Provider-bound:
``previous_response_id`` (read for every API by ``parse``) and reasoning items'
``encrypted_content``, which only their issuer can decrypt.
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

HINT_SOURCE = "prompt_cache_key"
ADDITIONAL_TOOLS = "additional_tools"
_MODEL_ITEMS = ("reasoning", "mcp_list_tools", "mcp_approval_request")
"""Items only the model emits, besides assistant messages and ``*_call`` items."""
_TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


def entries(body: dict[str, Any]) -> list[Any]:
    items = body.get("input")
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    return as_list(items)


def tools(body: dict[str, Any]) -> list[Any]:
    """Top-level ``tools``, then those of ``additional_tools`` input items (Codex's default
    "responses-lite" format sends its tools only there)."""
    found = as_list(body.get("tools"))
    items = body.get("input")
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get("type") == ADDITIONAL_TOOLS:
            found = [*found, *as_list(item.get("tools"))]
    return found


def system(body: dict[str, Any]) -> Any:
    return body.get("instructions")


def _kind(item: dict[str, Any]) -> str:
    kind = item.get("type", "message")
    return kind if isinstance(kind, str) else ""


def parse(body: dict[str, Any]) -> Facts:
    if not isinstance(body.get("input"), str | list | None):
        raise MalformedRequest('"input" must be a string or an array of items')
    items = entries(body)
    call_ids: list[str] = []
    state: list[str] = []
    answered = first_user = -1
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise MalformedRequest(f'"input[{i}]" must be an object')
        kind = _kind(item)
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                answered = i
            elif role == "user" and first_user < 0:
                first_user = i
        elif kind.endswith("_call"):
            answered = i
            if call_id := nonempty_str(item.get("call_id")):
                call_ids.append(call_id)
        elif kind in _MODEL_ITEMS:
            answered = i
            if kind == "reasoning" and (blob := nonempty_str(item.get("encrypted_content"))):
                state.append(fingerprint("reasoning", blob))
    results: list[str] = []
    pending = 0
    contents: list[Any] = []  # of the turn after the model's: tool outputs and user messages
    for item in reversed(items[answered + 1 :]):
        kind = _kind(item)
        if kind.endswith("_call_output"):
            pending += 1
            if result_id := nonempty_str(item.get("call_id")):
                results.append(result_id)
            contents.append(item.get("output"))
        elif kind == "message" and item.get("role") == "user":
            contents.append(item.get("content"))
    session = hint(body.get("prompt_cache_key"))
    return Facts(
        entries=len(items),
        tool_call_ids=tuple(call_ids),
        tool_result_ids=tuple(reversed(results)),
        tool_results=pending,
        provider_state=tuple(state),
        latest_text=latest(contents or [last_user_content(items)]),
        conversation=conversation(body.get("instructions"), items, first_user),
        session_hint=session,
        session_hint_source=HINT_SOURCE if session else None,
        opening=answered < 0,
        task_marks=task_marks(items[first_user].get("content"))
        if answered < 0 and first_user >= 0 else (),
    )


def turns(item: dict[str, Any]) -> Iterator[Turn]:
    kind = _kind(item)
    if kind == "message":
        role = item.get("role", "user")
        yield role if isinstance(role, str) else "user", text(item.get("content"))
    elif kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments", item.get("input"))
        yield "assistant", f"call {label(item.get('name'))} {canonical_json(arguments)}"
    elif kind in ("function_call_output", "custom_tool_call_output"):
        yield "tool", f"result {label(item.get('call_id'))}\n{text(item.get('output'))}"
    elif kind == ADDITIONAL_TOOLS:
        yield "tools", canonical_json(item.get("tools"))
    elif kind == "reasoning":
        yield "reasoning", nonempty_str(item.get("encrypted_content")) or text(item.get("summary"))


# -- the answer ------------------------------------------------------------------------------


def document(summary: ResponseSummary, doc: dict[str, Any]) -> None:
    """A ``response`` object: the whole answer, or the one a terminal event restates."""
    summary.model = nonempty_str(doc.get("model")) or summary.model
    summary.response_id = nonempty_str(doc.get("id")) or summary.response_id
    for position, item in enumerate(as_list(doc.get("output"))):
        _output_item(summary, as_dict(item), position)
    summary.finish_reason = nonempty_str(doc.get("status")) or summary.finish_reason
    usage = doc.get("usage")
    if isinstance(usage, dict):
        summary.usage = Usage(
            prompt_tokens=count(usage.get("input_tokens")),
            completion_tokens=count(usage.get("output_tokens")),
            cached_tokens=count(as_dict(usage.get("input_tokens_details")).get("cached_tokens")),
        )


def _output_item(summary: ResponseSummary, item: dict[str, Any], position: Any) -> None:
    kind = _kind(item)
    if kind.endswith("_call") and "call_id" in item:  # a call the client runs (function,
        record_call(summary, item.get("call_id"), item.get("name"))  # custom, ...)
        record_arguments(summary, position, item.get("arguments", item.get("input")))
    elif kind == "reasoning" and (blob := nonempty_str(item.get("encrypted_content"))):
        summary.provider_state.append(fingerprint("reasoning", blob))


def event(summary: ResponseSummary, data: dict[str, Any]) -> bool:
    """Items are read as each is done, and again from the terminal event's response, which
    restates them all (when it does: a server may send the final object without its output,
    and the items already read then stand)."""
    kind = data.get("type")
    response = as_dict(data.get("response"))
    if kind == "response.created":
        summary.response_id = nonempty_str(response.get("id")) or summary.response_id
    elif kind == "response.output_item.done":
        _output_item(summary, as_dict(data.get("item")), data.get("output_index"))
    elif kind in _TERMINAL_EVENTS:
        if as_list(response.get("output")):  # start over rather than count items twice
            summary.tool_call_ids.clear()
            summary.tool_names.clear()
            summary.provider_state.clear()
            summary.arguments.clear()
        document(summary, response)
        return True
    return False
