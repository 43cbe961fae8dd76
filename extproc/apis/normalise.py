"""Volatile preambles: text a harness puts at the start of its system prompt that changes from
session to session (or request to request) while everything after it stays the same.

Claude Code's ``system[0]`` is ``x-anthropic-billing-header: cc_version=2.1.332.<3 hex>;
cc_entrypoint=…;`` where the three hex digits follow the session's first prompt (some builds
add a per-request ``cch=`` nonce, sub-agents ``cc_is_subagent=true;``). Sitting first, it makes
two sessions of one project share 58 characters of prompt instead of the ~38,500 of system
prompt and tools they have in common, so neither the router's prefix index nor the engine's
prefix cache can reuse them. Two remedies, both over the API's top-level system prompt
(Messages ``system``, Responses ``instructions``; Chat has none, its system messages are turns):

- ``normalised_system``: the system prompt with the preambles cut, for the rendering that the
  prefix index hashes (``prompt.render_prompt(..., preambles=...)``);
- ``strip_preambles``: the raw body with them cut, for the engine-facing body: byte for byte
  the client's elsewhere (like ``rewrite.rewrite_model``), a block that held only a preamble
  removed with its comma. Rendering the stripped body gives exactly the normalised rendering.

A pattern is a regular expression matched at the start of a system text (``re.match``): the
match is cut, and a text block left blank goes. Only text blocks are touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import orjson

from ..errors import MalformedRequest
from ..types import Api
from .common import nonempty_str
from .rewrite import _balance, _unescaped, _value_end

CLAUDE_CODE_BILLING = r"x-anthropic-billing-header:[^\n]*\n?"
"""Claude Code's billing line, whatever its fields (``cc_version``, ``cc_entrypoint``, ``cch``,
``cc_is_subagent``), with its line break."""
DEFAULT_PREAMBLES = (CLAUDE_CODE_BILLING,)
SYSTEM_KEYS = {Api.MESSAGES: b"system", Api.RESPONSES: b"instructions"}
_WHITESPACE = b" \t\n\r"


class Preambles:
    """Compiled volatile-preamble patterns (``routing.prompt_normalisation``)."""

    def __init__(self, patterns: Iterable[str] = DEFAULT_PREAMBLES) -> None:
        self.patterns = tuple(re.compile(p) for p in patterns)

    def cut(self, text: str) -> str:
        """``text`` without the preambles it starts with (each pattern, in order, once)."""
        for pattern in self.patterns:
            if match := pattern.match(text):
                text = text[match.end():]
        return text

    def __bool__(self) -> bool:
        return bool(self.patterns)


def normalised_system(system: Any, preambles: Preambles) -> Any:
    """A system prompt (a string or blocks) as ``strip_preambles`` leaves it."""
    if isinstance(system, str):
        return preambles.cut(system)
    if not isinstance(system, list):
        return system
    out: list[Any] = []
    for block in system:
        kept = _block(block, preambles)
        if kept is not _DROPPED:
            out.append(kept)
    return out


def strip_preambles(api: Api, raw: bytes, preambles: Preambles) -> bytes | None:
    """``raw`` with the preambles cut from its top-level system prompt, or None when there is
    nothing to cut (or the body is not one the scan can read: it is then sent as it is).
    ``raw`` is a body ``parse_request`` accepted."""
    key = SYSTEM_KEYS.get(api)
    if key is None or not preambles:
        return None
    try:
        span = _top_level_value(raw, key)
    except MalformedRequest:
        return None
    if span is None:
        return None
    start, end = span
    value = orjson.loads(raw[start:end])
    if isinstance(value, str):
        cut = preambles.cut(value)
        return None if cut == value else raw[:start] + orjson.dumps(cut) + raw[end:]
    if not isinstance(value, list):
        return None
    edits = _array_edits(raw, start, end, preambles)
    if not edits:
        return None
    out = raw
    for at, until, replacement in sorted(edits, reverse=True):
        out = out[:at] + replacement + out[until:]
    return out


_DROPPED = object()
"""What a block that held only a preamble becomes (a ``null`` element is kept as it is)."""


def _block(block: Any, preambles: Preambles) -> Any:
    """A system block as cut: ``_DROPPED`` if it held only a preamble."""
    if not isinstance(block, dict) or block.get("type") != "text":
        return block
    text = nonempty_str(block.get("text"))
    if text is None:
        return block
    cut = preambles.cut(text)
    if cut == text:
        return block
    return {**block, "text": cut} if cut.strip() else _DROPPED


def _top_level_value(raw: bytes, key: bytes) -> tuple[int, int] | None:
    """(start, end) of the value of the last top-level ``key`` (the one a parser reads),
    spelled plainly (no client escapes a key's letters; an escaped one is not found)."""
    needle = b'"' + key + b'"'
    found = None
    at = raw.find(needle)
    while at >= 0:
        colon = at + len(needle)
        while raw[colon : colon + 1] in (b" ", b"\t", b"\n", b"\r"):
            colon += 1
        if raw[colon : colon + 1] == b":" and _unescaped(raw, at) and _balance(raw[:at]) == 1:
            value = colon + 1
            while raw[value : value + 1] in (b" ", b"\t", b"\n", b"\r"):
                value += 1
            found = (value, _value_end(raw, value))
        at = raw.find(needle, at + len(needle))
    return found


def _array_edits(raw: bytes, start: int, end: int,
                 preambles: Preambles) -> list[tuple[int, int, bytes]]:
    """(start, end, replacement) of the array's blocks to rewrite or drop, byte-exact
    elsewhere: a dropped block takes the separator after it, or before it when it is last."""
    elements: list[tuple[int, int]] = []
    pos = start + 1
    while True:
        while pos < end and raw[pos] in _WHITESPACE:
            pos += 1
        if raw[pos : pos + 1] in (b"]", b""):
            break
        element_end = _value_end(raw, pos)
        elements.append((pos, element_end))
        pos = element_end
        while pos < end and raw[pos] in _WHITESPACE:
            pos += 1
        if raw[pos : pos + 1] == b",":
            pos += 1
    edits: list[tuple[int, int, bytes]] = []
    dropped: list[int] = []
    for i, (at, until) in enumerate(elements):
        block = orjson.loads(raw[at:until])
        kept = _block(block, preambles)
        if kept is _DROPPED:
            dropped.append(i)
        elif kept is not block:
            edits.append((at, until, orjson.dumps(kept)))
    kept_before_tail = len(elements) - 1
    while dropped and kept_before_tail in dropped:
        kept_before_tail -= 1
    for i in dropped:
        at, until = elements[i]
        if i > kept_before_tail:  # in the trailing run: cut from the last kept block's end
            if i == kept_before_tail + 1:
                head = elements[kept_before_tail][1] if kept_before_tail >= 0 else at
                edits.append((head, elements[-1][1], b""))
        else:
            edits.append((at, elements[i + 1][0], b""))
    return edits
