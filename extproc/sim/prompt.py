"""Renders a request into the prompt text a chat template would produce, and generates output.

The rendering keeps only what a chat template keeps (role, text, tool calls with their arguments,
tool results), so a message renders the same whether the client re-sends it verbatim or rebuilt
from an SDK object. That is what lets a turn's prompt share its prefix with the previous turn's
prompt plus the reply, exactly the reuse a real prefix cache sees in an agent loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import xxhash

from ..types import Api, RequestSummary

Turn = tuple[str, str]
"""(role, text) of one rendered turn."""

_WORDS = """
    the a of to and in is it that for on with as this be at by from or an are not can will
    if then so we use run code file test call data path line next step done fix bug read
    edit plan tool task diff load save view list find scan note part item case pass fail ok
    now all more
"""
_VOCABULARY = tuple(_WORDS.split())
"""Words of at most four characters: each is exactly one token under ``tokenize``."""

_TEXT_TYPES = ("text", "input_text", "output_text", "thinking", "summary_text", "reasoning_text")


def render_prompt(summary: RequestSummary) -> str:
    """The prompt of ``summary`` as text: preamble (system, tools), then every turn in order."""
    body = summary.body
    preamble: list[Turn] = []
    system = body.get("instructions") if summary.api is Api.RESPONSES else body.get("system")
    if system:
        preamble.append(("system", _text(system)))
    if body.get("tools"):
        preamble.append(
            ("tools", orjson.dumps(body["tools"], option=orjson.OPT_SORT_KEYS).decode())
        )
    entries = body.get("input") if summary.api is Api.RESPONSES else body.get("messages")
    if isinstance(entries, str):
        entries = [{"type": "message", "role": "user", "content": entries}]
    return _join(preamble) + render_entries(summary.api, entries or [])


def render_entries(api: Api, entries: Iterable[dict[str, Any]]) -> str:
    """Messages (chat, messages) or input items (responses) rendered as prompt turns."""
    turns = _responses_turns if api is Api.RESPONSES else _message_turns
    return _join(turn for entry in entries for turn in turns(entry))


def generate_words(seed_text: str, count: int) -> tuple[str, ...]:
    """``count`` one-token pieces chosen deterministically by ``seed_text``; joined, they read
    as text (every piece after the first carries its leading space)."""
    seed = xxhash.xxh3_64_intdigest(seed_text.encode())
    words = (
        _VOCABULARY[xxhash.xxh3_64_intdigest(i.to_bytes(4, "little"), seed=seed) % len(_VOCABULARY)]
        for i in range(count)
    )
    return tuple(word if i == 0 else f" {word}" for i, word in enumerate(words))


def canonical_json(value: Any) -> str:
    """Tool arguments as one stable string, whether they arrived as a string or an object."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _join(turns: Iterable[Turn]) -> str:
    return "".join(f"<|{role}|>\n{text}\n" for role, text in turns)


def _text(content: Any) -> str:
    """Text of a string, or of a list of typed blocks (text, thinking, tool results nested)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") in _TEXT_TYPES:
            parts.append(str(block.get("text") or block.get("thinking") or ""))
    return "\n".join(parts)


def _message_turns(message: dict[str, Any]) -> Iterator[Turn]:
    """Chat Completions and Anthropic Messages share the role/content shape."""
    role = str(message.get("role", "user"))
    content = message.get("content")
    text = _text(content)
    if text:
        yield role, text
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        yield role, f"call {function.get('name')} {canonical_json(function.get('arguments'))}"
    if role == "tool":
        yield role, f"result {message.get('tool_call_id')}"
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_use":
            yield role, f"call {block.get('name')} {canonical_json(block.get('input'))}"
        elif block.get("type") == "tool_result":
            yield role, f"result {block.get('tool_use_id')}\n{_text(block.get('content'))}"


def _responses_turns(item: dict[str, Any]) -> Iterator[Turn]:
    kind = item.get("type", "message")
    if kind == "message":
        yield str(item.get("role", "user")), _text(item.get("content"))
    elif kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments", item.get("input"))
        yield "assistant", f"call {item.get('name')} {canonical_json(arguments)}"
    elif kind in ("function_call_output", "custom_tool_call_output"):
        yield "tool", f"result {item.get('call_id')}\n{_text(item.get('output'))}"
    elif kind == "reasoning":
        yield "reasoning", str(item.get("encrypted_content") or _text(item.get("summary")))
