"""Chained block hashes for simulated prompts, and the workers' prefix cache fed by them.

The simulator never materialises text: a session's context is an append-only token stream and
block ``i`` of it is named by who wrote it (``owner``) and ``i``. Hashes chain like vLLM's
(``h[i] = H(h[i-1], block i)``) so a hit on block ``i`` implies the whole prefix matches, and a
sub-agent that inherits its parent's first ``k`` blocks shares exactly those hashes.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..sim.prefix_cache import PrefixCache


def chain(previous: int, *content: int) -> int:
    """The next chained hash. ``hash`` of a tuple of ints is stable across processes."""
    return hash((previous, *content))


def chain_ids(ids: Sequence[int]) -> list[int]:
    """Chain opaque block ids (a Mooncake row's ``hash_ids``) into prefix hashes."""
    hashes: list[int] = []
    previous = 0
    for block_id in ids:
        previous = chain(previous, block_id)
        hashes.append(previous)
    return hashes


class Stream:
    """The block hashes of one session's context, computed lazily as the context grows."""

    def __init__(self, owner: int, block_size: int, parent: Stream | None = None,
                 inherit_blocks: int = 0) -> None:
        self.owner = owner
        self.block_size = block_size
        self._parent = parent
        self._inherit = inherit_blocks if parent is not None else 0
        self._hashes: list[int] = []

    def hashes(self, tokens: int) -> list[int]:
        """Hashes of the full blocks of the first ``tokens`` tokens."""
        wanted = tokens // self.block_size
        if len(self._hashes) < wanted:
            self._extend(wanted)
        return self._hashes[:wanted]

    def _extend(self, wanted: int) -> None:
        have = len(self._hashes)
        if have < self._inherit and self._parent is not None:
            upto = min(wanted, self._inherit)
            self._hashes.extend(self._parent.hashes(upto * self.block_size)[have:upto])
            have = upto
        previous = self._hashes[-1] if self._hashes else 0
        for index in range(have, wanted):
            previous = chain(previous, self.owner, index)
            self._hashes.append(previous)


class BlockCache(PrefixCache):
    """The simulator's ``PrefixCache`` driven by block hashes instead of text, with a capacity
    that shrinks while running requests hold KV the cache cannot reuse (their output)."""

    def __init__(self, *, block_size: int, num_gpu_blocks: int) -> None:
        super().__init__(block_size=block_size, num_gpu_blocks=num_gpu_blocks)
        self.total_blocks = num_gpu_blocks

    def lookup_blocks(self, hashes: Sequence[int], tokens: int) -> int:
        """Cached prefix in tokens, then cache every block; at least one token is computed."""
        lookable = max(tokens - 1, 0) // self.block_size
        hits = 0
        for block_hash in hashes[:lookable]:
            if block_hash not in self._blocks:
                break
            hits += 1
        self._touch(hashes)
        return hits * self.block_size

    def insert_blocks(self, hashes: Sequence[int]) -> None:
        self._touch(hashes)

    def reserve(self, blocks: int) -> None:
        """Leave ``blocks`` of the pool to running requests: LRU-evict the cache to fit."""
        self.num_gpu_blocks = max(self.total_blocks - blocks, 1)
        self._touch(())
