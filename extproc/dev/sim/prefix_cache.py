"""A block-level prefix cache with vLLM's shape, so routing for cache affinity can be measured.

Tokens are deterministic pieces of text (see ``tokenize``), or real token ids when the simulator
has a tokenizer (needed to publish KV events), grouped into blocks of ``block_size``. A block is
identified by a chained hash, ``h[i] = xxh3_64(block i, seed=h[i-1])``, so equal block contents at
different positions or after different prefixes never collide; a hit on block ``i`` therefore
implies the whole prefix up to ``i`` matches. Only full blocks are cached, as in vLLM. Eviction is
LRU over blocks; a request touches its blocks tail-first so that the head of a shared prefix stays
the most recently used and the tails are evicted first (vLLM frees a request's blocks in reverse
order for the same reason). Blocks of running requests are not pinned: the simulator tracks KV
usage of running requests separately (see ``server``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from ...apis import chain_hashes

TOKEN_CHARS = 4
"""A token is at most this many characters, matching the router's chars/4 context estimate."""

_BLOCK_SEPARATOR = "\x1f"


def tokenize(text: str) -> list[str]:
    """Split on whitespace, then cut each word into pieces of at most ``TOKEN_CHARS`` characters.

    Deterministic and cheap; a word of up to four characters is exactly one token, which the
    generated text relies on to make its output token count exact.
    """
    return [
        word[start : start + TOKEN_CHARS]
        for word in text.split()
        for start in range(0, len(word), TOKEN_CHARS)
    ]


def block_hashes(tokens: Sequence[str] | Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (text pieces, or token ids when a real
    tokenizer is configured); a trailing partial block has none."""
    stop = len(tokens) - block_size + 1
    return chain_hashes(
        _BLOCK_SEPARATOR.join(map(str, tokens[start : start + block_size])).encode()
        for start in range(0, stop, block_size)
    )


class CacheListener(Protocol):
    """Told of every change, so it can be published as KV events (see ``kv_publisher``)."""

    def changed(
        self, tokens: Any, hashes: Sequence[int], stored: Collection[int], evicted: Sequence[int]
    ) -> None: ...

    def cleared(self) -> None: ...


class PrefixCache:
    """Fixed-capacity LRU set of block hashes with a longest-cached-prefix lookup."""

    def __init__(
        self,
        *,
        block_size: int = 16,
        num_gpu_blocks: int = 2048,
        listener: CacheListener | None = None,
    ) -> None:
        if block_size < 1 or num_gpu_blocks < 1:
            raise ValueError("block_size and num_gpu_blocks must be positive")
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.listener = listener
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    @property
    def usage_fraction(self) -> float:
        """Share of the capacity holding cached blocks, 0..1."""
        return len(self._blocks) / self.num_gpu_blocks

    def lookup_and_insert(self, tokens: Sequence[str] | Sequence[int]) -> int:
        """Cached prefix length in tokens, then cache (or refresh) every full block of ``tokens``.

        Like vLLM, at least one prompt token is always computed, so a fully cached prompt reports
        the cached blocks of all but its last token.
        """
        hashes = block_hashes(tokens, self.block_size)
        lookable = max(len(tokens) - 1, 0) // self.block_size
        hits = 0
        for block_hash in hashes[:lookable]:
            if block_hash not in self._blocks:
                break
            hits += 1
        stored, evicted = self._touch(hashes)
        if self.listener is not None and (stored or evicted):
            self.listener.changed(tokens, hashes, stored, evicted)
        return hits * self.block_size

    def clear(self) -> None:
        self._blocks.clear()
        if self.listener is not None:
            self.listener.cleared()

    def _touch(self, hashes: Sequence[int]) -> tuple[set[int], list[int]]:
        """Blocks newly cached, then blocks evicted to make room (possibly some new ones)."""
        stored: set[int] = set()
        for block_hash in reversed(hashes):
            if block_hash in self._blocks:
                self._blocks.move_to_end(block_hash)
            else:
                self._blocks[block_hash] = None
                stored.add(block_hash)
        evicted: list[int] = []
        while len(self._blocks) > self.num_gpu_blocks:
            evicted.append(self._blocks.popitem(last=False)[0])
        return stored, evicted
