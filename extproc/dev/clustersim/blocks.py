"""Chained block hashes for simulated prompts (the workers' KV tiers are keyed by them).

The simulator never materialises text: a session's context is an append-only token stream and
block ``i`` of it is named by who wrote it (``owner``) and ``i``. Hashes chain like vLLM's
(``h[i] = H(h[i-1], block i)``) so a hit on block ``i`` implies the whole prefix matches, and a
sub-agent that inherits its parent's first ``k`` blocks shares exactly those hashes.
"""

from __future__ import annotations

from collections.abc import Sequence


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
