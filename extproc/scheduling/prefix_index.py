"""The approximate prefix index: what each worker probably caches, learnt from where the router
sent which prompt blocks (the Gateway API Inference Extension's approximate mode).

Each worker gets an LRU set of block hashes sized like its KV cache. ``routed`` touches a prompt's
blocks tail-first, so a block is always at least as recent as every block after it in any prompt
that contains it; LRU therefore evicts tails before heads and each worker's set stays closed
under prefixes (block ``i`` held ⇒ blocks ``0..i-1`` held). That invariant lets
``matched_blocks`` binary-search the longest held prefix in O(log n) instead of scanning it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ..apis import CHARS_PER_TOKEN
from ..config import PrefixIndexConfig
from .types import Worker


class ApproximatePrefixIndex:
    """Per-worker bounded LRU of chained block hashes (``PrefixIndex`` protocol)."""

    def __init__(self, *, chars_per_block: int = 64, default_capacity_blocks: int = 65536) -> None:
        if chars_per_block < 1 or default_capacity_blocks < 1:
            raise ValueError("chars_per_block and default_capacity_blocks must be positive")
        self.chars_per_block = chars_per_block
        self.default_capacity_blocks = default_capacity_blocks
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}

    @classmethod
    def from_config(cls, config: PrefixIndexConfig) -> ApproximatePrefixIndex:
        return cls(
            chars_per_block=config.chars_per_block,
            default_capacity_blocks=config.default_capacity_blocks,
        )

    def capacity(self, worker: str) -> int:
        return self._capacity.get(worker, self.default_capacity_blocks)

    def held(self, worker: str) -> int:
        """Blocks currently recorded for ``worker``."""
        return len(self._blocks.get(worker, ()))

    def resize(self, worker: Worker) -> None:
        """Size ``worker``'s set like its reported KV cache (tokens * 4 chars / block chars), or
        the default while it has reported none; shrinking evicts the least recent blocks."""
        tokens = worker.capacity_tokens
        blocks = (
            self.default_capacity_blocks
            if tokens is None
            else max(1, tokens * CHARS_PER_TOKEN // self.chars_per_block)
        )
        if self._capacity.get(worker.address) != blocks:
            self._capacity[worker.address] = blocks
            self._evict(worker.address)

    def forget(self, worker: str) -> None:
        """``worker`` left its pool: drop what it held."""
        self._blocks.pop(worker, None)
        self._capacity.pop(worker, None)

    def matched_blocks(self, worker: str, blocks: Sequence[int]) -> int:
        """Length of the longest prefix of ``blocks`` (a chain, as ``prompt_blocks`` makes)
        that ``worker`` holds."""
        held = self._blocks.get(worker)
        if not held:
            return 0
        low, high = 0, len(blocks)
        while low < high:
            middle = (low + high + 1) // 2
            if blocks[middle - 1] in held:
                low = middle
            else:
                high = middle - 1
        return low

    def routed(self, worker: str, blocks: Sequence[int]) -> None:
        """``blocks`` were sent to ``worker``: record them, most recent at the head."""
        held = self._blocks.setdefault(worker, OrderedDict())
        for block in reversed(blocks):
            if block in held:
                held.move_to_end(block)
            else:
                held[block] = None
        self._evict(worker)

    def _evict(self, worker: str) -> None:
        held = self._blocks.get(worker)
        if held is None:
            return
        capacity = self.capacity(worker)
        while len(held) > capacity:
            held.popitem(last=False)
