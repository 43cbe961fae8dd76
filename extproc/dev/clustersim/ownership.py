"""Which blocks each session's context is made of on one worker, and how many share each.

Hints name a session, never blocks: the engine resolves them against what it saw of that
session's requests (as the KvHint proposal has the engine do). A block several live sessions
reference (a system prompt, a parent's context a sub-agent inherited) is shared: ``demote`` and
``release`` leave it alone and move or free only what is the session's own.
"""

from __future__ import annotations

from collections.abc import Sequence


class SessionBlocks:
    def __init__(self) -> None:
        self._blocks: dict[str, Sequence[int]] = {}
        self._refs: dict[int, int] = {}

    def blocks(self, session: str) -> Sequence[int]:
        """The session's latest context, as chained block hashes (empty if unknown)."""
        return self._blocks.get(session, ())

    def update(self, session: str, blocks: Sequence[int]) -> None:
        """``session`` now has ``blocks`` (a prefix of what it already has changes nothing).
        Contexts are append-only, so usually only the new tail is counted (chained hashes:
        equal last blocks mean an equal prefix)."""
        old = self._blocks.get(session, ())
        if not blocks or (len(blocks) <= len(old) and old[len(blocks) - 1] == blocks[-1]):
            return
        self._blocks[session] = blocks
        if old and len(old) <= len(blocks) and blocks[len(old) - 1] == old[-1]:
            self._count(blocks[len(old):], 1)
        else:
            self._count(old, -1)
            self._count(blocks, 1)

    def unique(self, session: str) -> list[int]:
        """The session's blocks no other session it knows references."""
        refs = self._refs
        return [b for b in self._blocks.get(session, ()) if refs[b] == 1]

    def forget(self, session: str, keep: int = 0) -> list[int]:
        """The session ended: returns the blocks it alone referenced, past its first ``keep``
        (those stay cached, referenced by nobody, for LRU to age out)."""
        blocks = self._blocks.pop(session, ())
        alone = [b for b in blocks[keep:] if self._refs[b] == 1]
        self._count(blocks, -1)
        return alone

    def _count(self, blocks: Sequence[int], delta: int) -> None:
        refs = self._refs
        for block in blocks:
            count = refs.get(block, 0) + delta
            if count:
                refs[block] = count
            else:
                del refs[block]
