"""A request rendered as the prompt text a chat template would produce, and that text cut into
chained block hashes for the approximate prefix index.

The rendering keeps only what a chat template keeps (role, text, tool calls with their arguments,
tool results), so a message renders the same whether the client re-sends it verbatim or rebuilt
from an SDK object. That is what lets a turn's prompt share its prefix with the previous turn's
prompt plus the reply, exactly the reuse a real prefix cache sees in an agent loop. The router and
the simulator share this one rendering, so the router's guess of what a server caches is made
from the same text the simulated server caches. A completion's prompt is no conversation: it
renders as it is, unwrapped, and the next prompt that resends it with the answer appended
extends that text. Each API's module renders its own entries;
this module puts the turns together and cuts the text into blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import xxhash

from ..types import Api, RequestSummary
from .common import Turn, canonical_json, text
from .formats import FORMATS
from .normalise import Preambles, normalised_system

_xxh3 = xxhash.xxh3_64_intdigest


def render_prompt(summary: RequestSummary, preambles: Preambles | None = None,
                  limit: int | None = None) -> str:
    """The prompt of ``summary`` as text: preamble (system, tools), then every turn in order.

    With ``preambles``, the system prompt renders without its volatile preambles
    (``normalise``): what the engine sees of a body ``normalise.strip_preambles`` cut, and what
    the prefix index should match when it does not (the lead's request path decides). With
    ``limit``, the turns after the first ``limit`` characters are left out (the text still
    begins with all of those)."""
    body = summary.body
    api = FORMATS[summary.api]
    preamble: list[Turn] = []
    system = api.system(body)
    if preambles:
        system = normalised_system(system, preambles)
    if system:
        preamble.append(("system", text(system)))
    if tools := body.get("tools"):
        preamble.append(("tools", canonical_json(tools)))
    head = _join(preamble)
    rest = None if limit is None else limit - len(head)
    if rest is not None and rest <= 0:
        return head
    return head + render_entries(summary.api, api.entries(body), rest)


def render_entries(api: Api, entries: Iterable[Any], limit: int | None = None) -> str:
    """Messages (chat, messages), input items (responses) or prompts (completions) rendered
    as prompt turns (those past the first ``limit`` characters left out)."""
    turns = FORMATS[api].turns
    return _join((turn for entry in entries if isinstance(entry, dict)
                  for turn in turns(entry)), limit)


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
    """Chained hashes of the full ``chars_per_block``-byte blocks of ``text``'s UTF-8 (a
    trailing partial block has none; for English text and code a byte is a character). The
    model name seeds the chain, so two models' servers never appear to share a prefix (the
    Gateway API Inference Extension's approximate index). The straightforward reference of
    ``scheduling.memo``, which hashes only what is new.
    """
    if chars_per_block < 1:
        raise ValueError("chars_per_block must be positive")
    n = chars_per_block
    data = text.encode()
    blocks = [data[i : i + n] for i in range(0, len(data) - n + 1, n)]
    return tuple(chain_hashes(blocks, seed=_xxh3(model.encode())))


def _join(turns: Iterable[Turn], limit: int | None = None) -> str:
    if limit is None:
        return "".join(_piece(role, said) for role, said in turns)
    pieces, size = [], 0
    for role, said in turns:
        if size >= limit:
            break
        piece = _piece(role, said)
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces)


def _piece(role: str, said: str) -> str:
    """One turn as the template renders it; a turn with no role (a completion's prompt, which
    no template wraps) is its text alone."""
    return f"<|{role}|>\n{said}\n" if role else said
