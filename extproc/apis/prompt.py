"""A request rendered as the prompt text a chat template would produce, and that text cut into
chained block hashes for the approximate prefix index.

The rendering keeps only what a chat template keeps (role, text, tool calls with their arguments,
tool results), so a message renders the same whether the client re-sends it verbatim or rebuilt
from an SDK object. That is what lets a turn's prompt share its prefix with the previous turn's
prompt plus the reply, exactly the reuse a real prefix cache sees in an agent loop. The router and
the simulator share this one rendering, so the router's guess of what a server caches is made
from the same text the simulated server caches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import xxhash

from ..types import Api, RequestSummary

Turn = tuple[str, str]
"""(role, text) of one rendered turn."""

_TEXT_TYPES = ("text", "input_text", "output_text", "thinking", "summary_text", "reasoning_text")

_xxh3 = xxhash.xxh3_64_intdigest


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


def canonical_json(value: Any) -> str:
    """Tool arguments as one stable string, whether they arrived as a string or an object."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def chain_hashes(blocks: Iterable[bytes], seed: int = 0) -> list[int]:
    """``h[i] = xxh3_64(block i, seed=h[i-1])`` with ``h[-1] = seed``: a block's hash names its
    whole prefix, so equal blocks after different prefixes never collide."""
    hashes: list[int] = []
    append, xxh3 = hashes.append, _xxh3
    for block in blocks:
        seed = xxh3(block, seed)
        append(seed)
    return hashes


def prompt_blocks(model: str, text: str, chars_per_block: int = 64) -> tuple[int, ...]:
    """Chained hashes of the full ``chars_per_block``-character blocks of ``text`` (a trailing
    partial block has none). The model name seeds the chain, so two models' servers never
    appear to share a prefix (the Gateway API Inference Extension's approximate index).

    ASCII text (the common case) is encoded once and cut as bytes, which hashes the same
    blocks as cutting characters at a third of the cost.
    """
    if chars_per_block < 1:
        raise ValueError("chars_per_block must be positive")
    n = chars_per_block
    stop = len(text) - n + 1
    if text.isascii():
        data = text.encode()
        blocks = [data[i : i + n] for i in range(0, stop, n)]
    else:
        blocks = [text[i : i + n].encode() for i in range(0, stop, n)]
    return tuple(chain_hashes(blocks, seed=_xxh3(model.encode())))


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
