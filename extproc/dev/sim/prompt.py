"""The simulator's output text. Prompt rendering itself lives in ``extproc.prompt`` (the router
renders the same way); its functions are re-exported here for the simulator's existing callers.
"""

from __future__ import annotations

import xxhash

from ...apis import render_entries, render_prompt

__all__ = ["generate_words", "render_entries", "render_prompt"]

_WORDS = """
    the a of to and in is it that for on with as this be at by from or an are not can will
    if then so we use run code file test call data path line next step done fix bug read
    edit plan tool task diff load save view list find scan note part item case pass fail ok
    now all more
"""
_VOCABULARY = tuple(_WORDS.split())
"""Words of at most four characters: each is exactly one token under ``tokenize``."""


def generate_words(seed_text: str, count: int) -> tuple[str, ...]:
    """``count`` one-token pieces chosen deterministically by ``seed_text``; joined, they read
    as text (every piece after the first carries its leading space)."""
    seed = xxhash.xxh3_64_intdigest(seed_text.encode())
    words = (
        _VOCABULARY[xxhash.xxh3_64_intdigest(i.to_bytes(4, "little"), seed=seed) % len(_VOCABULARY)]
        for i in range(count)
    )
    return tuple(word if i == 0 else f" {word}" for i, word in enumerate(words))
