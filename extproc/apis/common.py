"""What the API modules share: the facts a body yields, and the readers of untrusted JSON.

A body is client input and a response is upstream input: any field may hold any JSON type, and
nesting goes as deep as orjson reads (1,024 levels, while it writes only 254). So every reader
here checks types instead of trusting the schema, ids count only as non-empty strings (a list
or an object would be unhashable downstream), and ``canonical_json`` never raises.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from ..types import ResponseSummary, Usage

Turn = tuple[str, str]
"""(role, text) of one rendered prompt turn."""

LATEST_TEXT_CAP = 4096
"""Characters of ``latest_text`` kept: the tail a classifier reads, and a bound on the work."""

_TEXT_TYPES = ("text", "input_text", "output_text", "thinking", "summary_text", "reasoning_text")
"""A tuple, not a set: ``in`` compares, so an unhashable ``type`` (a list) cannot raise."""
_SYSTEM_ROLES = ("system", "developer")
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>\s*", re.DOTALL)
"""A harness's reminder (Claude Code's, Qwen Code's date and tool lists): volatile text that a
resumed run may leave out of the same opening."""


@dataclass(frozen=True, slots=True)
class Facts:
    """What one API's body says beyond the fields every API shares (see ``RequestSummary``)."""

    entries: int
    tool_call_ids: tuple[str, ...] = ()
    tool_result_ids: tuple[str, ...] = ()
    tool_results: int = 0
    provider_state: tuple[str, ...] = ()
    latest_text: str = ""
    conversation: str | None = None
    answer_mark: str | None = None
    session_hint: str | None = None
    session_hint_source: str | None = None
    opening: bool = False
    task_marks: tuple[str, ...] = ()


def fingerprint(kind: str, value: str) -> str:
    """A short stable key for an opaque provider-bound blob (encrypted reasoning, a signature)."""
    return f"{kind}:{xxhash.xxh3_64_hexdigest(value.encode())}"


ANSWER_MARK_CHARS = 4096


def answer_mark(text: str) -> str | None:
    """The key an answer's text is known by, like an id the answer issued: the hash of its
    head, trimmed. A history that resends the text continues the session that got it (Qwen
    Code's memory-extraction side agent resends a plain run's history, which holds no id)."""
    head = text.strip()[:ANSWER_MARK_CHARS]
    return fingerprint("answer", head) if head else None


TASK_MIN_CHARS = 16
"""Shorter text marks no task: a word or a flag names nothing of one call."""
TASK_PARTS = 8
"""Parts of a first user message whose marks are looked up (the newest ones)."""
ARGUMENTS_KEPT = 32 * 1024
"""Characters of a tool call's arguments kept for its task mark; past them, no mark."""


def task_mark(arguments: str) -> str | None:
    """The key a tool call's task text is known by, like an id the call issued: the longest
    string among its top-level arguments (all of a free-form tool's input), trimmed, its head
    hashed. A sub-agent's first request carries the task its parent's spawn call gave it and
    nothing else of the parent (Qwen Code's ``agent`` tool): the mark links the two."""
    try:
        value: Any = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        value = arguments
    if isinstance(value, dict):
        value = max((v for v in value.values() if isinstance(v, str)), key=len, default="")
    return _task_text_mark(value) if isinstance(value, str) else None


def task_marks(content: Any) -> tuple[str, ...]:
    """The marks of the text a first user message carries, part by part (reminders left out):
    where a sub-agent's task is found (``task_mark``)."""
    parts = [content] if isinstance(content, str) else [
        block if isinstance(block, str) else block.get("text")
        for block in as_list(content)
        if isinstance(block, str) or (isinstance(block, dict)
                                      and block.get("type") in _TEXT_TYPES)]
    marks: dict[str, None] = {}
    for part in parts[-TASK_PARTS:]:
        if isinstance(part, str) and (mark := _task_text_mark(
                _REMINDER.sub("", part) if "<system-reminder>" in part else part)):
            marks[mark] = None
    return tuple(marks)


def _task_text_mark(value: str) -> str | None:
    head = value.strip()[:ANSWER_MARK_CHARS]
    return fingerprint("task", head) if len(head) >= TASK_MIN_CHARS else None


def record_arguments(summary: ResponseSummary, position: Any, piece: Any) -> None:
    """A piece of the arguments of the answer's tool call at ``position`` (its index in the
    answer), kept while under ``ARGUMENTS_KEPT`` (past it, None: that call marks no task)."""
    record_output(summary, piece)
    if type(position) is not int or not isinstance(piece, str):
        return
    kept = summary.arguments.get(position, "")
    if kept is not None:
        whole = kept + piece
        summary.arguments[position] = whole if len(whole) <= ARGUMENTS_KEPT else None


def record_text(summary: ResponseSummary, piece: Any) -> None:
    """A piece of the answer's text, kept while its mark still needs it."""
    record_output(summary, piece)
    if isinstance(piece, str) and len(summary.text) < 2 * ANSWER_MARK_CHARS:
        summary.text += piece


def record_output(summary: ResponseSummary, piece: Any) -> None:
    """A piece of what the answer generated, counted (not kept): its output tokens are
    estimated from the count when it reports no usage."""
    if isinstance(piece, str):
        summary.output_chars += len(piece)


def record_usage(summary: ResponseSummary, usage: Any) -> None:
    """OpenAI's usage object (Chat and legacy Completions), cached tokens included; anything
    but an object leaves ``summary.usage`` as it was (a chunk's ``"usage": null``)."""
    if not isinstance(usage, dict):
        return
    summary.usage = Usage(
        prompt_tokens=count(usage.get("prompt_tokens")),
        completion_tokens=count(usage.get("completion_tokens")),
        cached_tokens=count(as_dict(usage.get("prompt_tokens_details")).get("cached_tokens")),
    )


def nonempty_str(value: Any) -> str | None:
    """``value`` if it is a non-empty string (the only kind of id, model or reason), else None."""
    return value if isinstance(value, str) and value else None


def hint(value: Any) -> str | None:
    """A session hint from the body: a string, stripped; empty is none."""
    return (value.strip() or None) if isinstance(value, str) else None


def count(value: Any) -> int:
    """A token count as reported: a non-negative JSON integer, anything else is 0."""
    return value if type(value) is int and value > 0 else 0


def record_call(summary: ResponseSummary, call_id: Any, tool: Any) -> None:
    """A tool call the answer carries: its id (the model now owns it) and its name."""
    if call_id := nonempty_str(call_id):
        summary.tool_call_ids.append(call_id)
    if isinstance(tool, str) and tool:
        summary.tool_names.append(tool)


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def text(content: Any) -> str:
    """Text of a string, or of a list of strings and typed text blocks (others are skipped)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") in _TEXT_TYPES:
            value = block.get("text") or block.get("thinking")
            parts.append(value if isinstance(value, str) else "")
    return "\n".join(parts)


def latest(contents_newest_first: Iterable[Any]) -> str:
    """The newest turn's text: contents given newest first, joined oldest first, capped to the
    last ``LATEST_TEXT_CAP`` characters; contents past the cap are never read."""
    kept: list[str] = []
    size = 0
    for content in contents_newest_first:
        if part := text(content):
            kept.append(part[-(LATEST_TEXT_CAP - size) :])
            size += len(kept[-1]) + 1
            if size >= LATEST_TEXT_CAP:
                break
    return "\n".join(reversed(kept))[-LATEST_TEXT_CAP:]


def last_user_content(entries: list[Any]) -> Any:
    """The content of the last user entry: the newest turn's, when nothing follows the model."""
    return next((e.get("content") for e in reversed(entries) if e.get("role") == "user"), None)


def conversation(system: Any, entries: list[Any], first_user: int) -> str | None:
    """Fingerprint of a conversation's opening: its system prompt (the top-level one and system
    entries before the first user turn) and its first user turn, or None without a user turn.

    Both are resent on every turn of one conversation however it grows, so the fingerprint
    names the conversation for callers that name no session. Reminders are left out: Qwen
    Code drops its date reminder from the first message when a run is resumed. Only these few
    fields are read and hashed."""
    if first_user < 0:
        return None
    opening = [text(system)]
    opening += (text(e.get("content")) for e in entries[:first_user]
                if e.get("role") in _SYSTEM_ROLES)
    opening.append(text(entries[first_user].get("content")))
    opening = [_REMINDER.sub("", part) if "<system-reminder>" in part else part
               for part in opening]
    digest = xxhash.xxh3_64()
    for part in opening:
        data = part.encode()
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def label(value: Any) -> str:
    """A tool name or id as the prompt renders it; anything but a string renders as missing."""
    return value if isinstance(value, str) else "None"


def canonical_json(value: Any) -> str:
    """Tool arguments (or tool definitions) as one stable string, whether they arrived as a
    JSON string or as an object: sorted keys, compact. Text that is not JSON stays as it is."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError:
        return _deep_json(value)


def _deep_json(value: Any) -> str:
    """What ``orjson.dumps(value, option=OPT_SORT_KEYS)`` writes, without its depth limit (254
    levels, below the 1,024 it reads) or its 64-bit integers: an explicit stack, no recursion."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            out.append(item.text)
        elif isinstance(item, dict):
            tokens: list[Any] = [_Raw("{")]
            for i, key in enumerate(sorted(item)):
                tokens += [_Raw(("," if i else "") + _scalar(key) + ":"), item[key]]
            stack += reversed([*tokens, _Raw("}")])
        elif isinstance(item, list | tuple):
            tokens = [_Raw("[")]
            for i, element in enumerate(item):
                tokens += [_Raw(","), element] if i else [element]
            stack += reversed([*tokens, _Raw("]")])
        else:
            out.append(_scalar(item))
    return "".join(out)


@dataclass(frozen=True, slots=True)
class _Raw:
    """Punctuation on the stack, told apart from a string value."""

    text: str


def _scalar(value: Any) -> str:
    return str(value) if type(value) is int else orjson.dumps(value).decode()
