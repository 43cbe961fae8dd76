"""One parse of a request body into a ``RequestSummary``.

The three APIs carry tool and provider state in different shapes; this module is the only place
that knows them. The tool loop is judged from the *newest* turn only: trailing tool results answer
calls the model just made, while answered calls deeper in the history no longer bind the session.
``latest_text`` is that newest turn's text too — the user's message, or the tool output when the
turn carries tool results — because that is what a per-request classifier would look at.
"""

from __future__ import annotations

from typing import Any

import orjson
import xxhash

from ..errors import BodyTooLarge, MalformedRequest, MissingModel
from ..types import Api, RequestSummary

CHARS_PER_TOKEN = 4
"""Rough context estimate before any tokenizer sees the prompt (English text and code). It is
taken over the raw body: walking every JSON string cost a third of the decision time, and the
JSON punctuation it adds is a few percent of an agent body."""

LATEST_TEXT_CAP = 4096


def fingerprint(kind: str, value: str) -> str:
    """A short stable key for an opaque provider-bound blob (encrypted reasoning, a signature)."""
    return f"{kind}:{xxhash.xxh3_64_hexdigest(value.encode())}"


def parse_request(api: Api, raw: bytes, *, max_body_bytes: int) -> RequestSummary:
    if len(raw) > max_body_bytes:
        raise BodyTooLarge(f"request body is {len(raw)} bytes; the limit is {max_body_bytes}")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise MalformedRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise MissingModel('request body has no "model" string')
    parse = _PARSERS[api]
    try:
        return parse(body, model, len(raw) // CHARS_PER_TOKEN)
    except (TypeError, AttributeError, KeyError) as exc:
        raise MalformedRequest(
            f"request body does not match the {api.value} schema: {exc}"
        ) from None


def _block_text(content: Any) -> str:
    """Plain text of a message content that is a string or a list of typed blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            b.get("text", "")
            for b in content
            if isinstance(b, dict) and b.get("type") in ("text", "input_text")
        ]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _tool_names(tools: Any) -> tuple[str, ...]:
    if not isinstance(tools, list):
        return ()
    names = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        name = tool.get("name") or (tool.get("function") or {}).get("name") or tool.get("type")
        if isinstance(name, str):
            names.append(name)
    return tuple(names)


def _parse_chat(body: dict[str, Any], model: str, tokens: int) -> RequestSummary:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MalformedRequest('"messages" must be a non-empty array')
    call_ids: list[str] = []
    latest_user = ""
    for msg in messages:
        role = msg.get("role")
        if role == "assistant":
            call_ids.extend(c["id"] for c in msg.get("tool_calls") or () if c.get("id"))
        elif role == "user":
            latest_user = _block_text(msg.get("content"))
    results: list[str] = []
    outputs: list[str] = []
    for msg in reversed(messages):
        if msg.get("role") != "tool":
            break
        if msg.get("tool_call_id"):
            results.append(msg["tool_call_id"])
        outputs.append(_block_text(msg.get("content")))
    latest = "\n".join(reversed(outputs)) if outputs else latest_user
    return RequestSummary(
        api=Api.CHAT,
        model=model,
        stream=bool(body.get("stream")),
        message_count=len(messages),
        context_tokens=tokens,
        tools_offered=_tool_names(body.get("tools")),
        tool_call_ids=tuple(call_ids),
        tool_result_ids=tuple(reversed(results)),
        latest_text=latest[-LATEST_TEXT_CAP:],
        body=body,
    )


_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
_CALL_ITEMS = ("function_call", "custom_tool_call")


def _parse_responses(body: dict[str, Any], model: str, tokens: int) -> RequestSummary:
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise MalformedRequest('"input" must be a string or an array of items')
    call_ids: list[str] = []
    state: list[str] = []
    latest_user = ""
    for item in items:
        kind = item.get("type", "message")
        if kind in _CALL_ITEMS and item.get("call_id"):
            call_ids.append(item["call_id"])
        elif kind == "reasoning" and item.get("encrypted_content"):
            state.append(fingerprint("reasoning", item["encrypted_content"]))
        elif kind == "message" and item.get("role") == "user":
            latest_user = _block_text(item.get("content"))
    results: list[str] = []
    outputs: list[str] = []
    for item in reversed(items):
        if item.get("type") not in _OUTPUT_ITEMS:
            break
        if item.get("call_id"):
            results.append(item["call_id"])
        outputs.append(_block_text(item.get("output")))
    latest = "\n".join(reversed(outputs)) if outputs else latest_user
    previous = body.get("previous_response_id")
    return RequestSummary(
        api=Api.RESPONSES,
        model=model,
        stream=bool(body.get("stream")),
        message_count=len(items),
        context_tokens=tokens,
        tools_offered=_tool_names(body.get("tools")),
        tool_call_ids=tuple(call_ids),
        tool_result_ids=tuple(reversed(results)),
        previous_response_id=previous if isinstance(previous, str) and previous else None,
        provider_state=tuple(state),
        latest_text=latest[-LATEST_TEXT_CAP:],
        body=body,
    )


def _parse_messages(body: dict[str, Any], model: str, tokens: int) -> RequestSummary:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MalformedRequest('"messages" must be a non-empty array')
    call_ids: list[str] = []
    state: list[str] = []
    latest_user = ""
    results: list[str] = []
    for msg in messages:
        content = msg.get("content")
        blocks = content if isinstance(content, list) else ()
        if msg.get("role") == "assistant":
            for block in blocks:
                kind = block.get("type")
                if kind == "tool_use" and block.get("id"):
                    call_ids.append(block["id"])
                elif kind == "thinking" and block.get("signature"):
                    state.append(fingerprint("thinking", block["signature"]))
                elif kind == "redacted_thinking" and block.get("data"):
                    state.append(fingerprint("thinking", block["data"]))
        elif msg.get("role") == "user":
            tool_results = [b for b in blocks if b.get("type") == "tool_result"]
            results = [b["tool_use_id"] for b in tool_results if b.get("tool_use_id")]
            outputs = [_block_text(b.get("content")) for b in tool_results]
            latest_user = "\n".join(p for p in [_block_text(content), *outputs] if p)
    return RequestSummary(
        api=Api.MESSAGES,
        model=model,
        stream=bool(body.get("stream")),
        message_count=len(messages),
        context_tokens=tokens,
        tools_offered=_tool_names(body.get("tools")),
        tool_call_ids=tuple(call_ids),
        tool_result_ids=tuple(results) if messages[-1].get("role") == "user" else (),
        provider_state=tuple(state),
        latest_text=latest_user[-LATEST_TEXT_CAP:],
        body=body,
    )


_PARSERS = {Api.CHAT: _parse_chat, Api.RESPONSES: _parse_responses, Api.MESSAGES: _parse_messages}
