"""Prompt blocks hashed in proportion to what is new.

An agent resends its whole context every turn: the prompt of turn n+1 is the prompt of turn n
plus a reply and a tool result. Hashing every block of a 1 MB prompt again costs milliseconds of
Python per turn; this memo keeps, per session and model, the block hashes of the last prompt
with digests of its prefix at regular marks, checks the new prompt against them (one C-speed
digest of the reused bytes) and hashes only the blocks after the longest prefix that matches.
The result is exactly what hashing from scratch gives (``prompt_blocks``): a mark matches only
when the bytes before it are the same, and chained hashes of the same bytes are the same.

It is a cache of this process (each replica warms its own): each session's memos hang on its
entry of the session table (they leave with it), and the blocks held over all sessions are
bounded, the least recently active sessions' memos first out.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from ..apis import chain_hashes
from ..state.table import Entry, SessionTable
from ..types import Clock

MARK_EVERY = 512
"""Blocks between two digests of the prefix: how far back a prompt whose tail changed (an edit,
a compaction) reuses what came before."""

_xxh3 = xxhash.xxh3_64_intdigest
_WIDTH = array("Q").itemsize


@dataclass(slots=True)
class Memo:
    hashes: bytes
    """The prompt's block hashes, packed (``array("Q").tobytes()``: bytes, which the garbage
    collector does not track, where an array is one more object per session to scan)."""
    marks: tuple[tuple[int, int], ...]
    """(blocks, digest of the bytes those blocks cover), ascending (tuples: the garbage
    collector stops tracking them)."""


class BlockMemo:
    def __init__(self, block_bytes: int, max_blocks: int = 4_000_000,
                 max_entries: int = 100_000, *, table: SessionTable | None = None,
                 clock: Clock = time.monotonic) -> None:
        """``table``: the process's session table, where each session's memos hang (its
        assembler calls ``left`` when a session leaves it); a table of its own, of
        ``max_entries`` sessions, when none is given."""
        if block_bytes < 1 or max_blocks < 1 or max_entries < 1:
            raise ValueError("block_bytes, max_blocks and max_entries must be positive")
        self.block = block_bytes
        self._max = max_blocks
        self._held = 0
        self._count = 0
        if table is None:
            table = SessionTable(max_sessions=max_entries, clock=clock)
            table.leaving(self.left)
        self._table = table

    def __len__(self) -> int:
        """Memos kept: one per session and model."""
        return self._count

    @property
    def held(self) -> int:
        """Block hashes kept, over every session."""
        return self._held

    def blocks(self, session: str | None, model: str, text: str,
               limit: int | None = None) -> tuple[Sequence[int], int]:
        """The chained hashes of ``text``'s full blocks (the model seeding the chain), at most
        ``limit`` of them, and how many leading ones were reused from this session's previous
        prompt."""
        if limit is None:
            data = text.encode()
        else:  # a character is at least one byte: this many characters are enough
            data = text[: limit * self.block].encode()[: limit * self.block]
        total = len(data) // self.block
        if session is None:
            return _hash(data, self.block, model, 0, array("Q")), 0
        entry = self._table.touch(session)
        memos = entry.memos if entry.memos is not None else {}
        memo = memos.pop(model, None)
        marks, reused = self._marks(data, total, memo)
        base = array("Q") if memo is None else array("Q", memo.hashes[: reused * _WIDTH])
        hashes = _hash(data, self.block, model, reused, base)
        if memo is not None:
            self._held -= len(memo.hashes) // _WIDTH
            self._count -= 1
        memos[model] = Memo(hashes.tobytes(), tuple(marks))
        entry.memos = memos
        self._held += len(hashes)
        self._count += 1
        if self._held > self._max:
            self._shed(session)
        return hashes, reused

    def _shed(self, keep: str) -> None:
        """Over the bound of blocks: the least recently active sessions' memos go first (never
        the one just made)."""
        for key, entry in self._table.oldest():
            if self._held <= self._max:
                return
            if key != keep and entry.memos:
                self._drop(entry)

    def left(self, key: str, entry: Entry) -> None:
        """The session left the table: keep nothing of it (a table's leaving hook)."""
        self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        memos, entry.memos = entry.memos, None
        for memo in (memos or {}).values():
            self._held -= len(memo.hashes) // _WIDTH
            self._count -= 1

    def _marks(
        self, data: bytes, total: int, memo: Memo | None
    ) -> tuple[list[tuple[int, int]], int]:
        """Digests of ``data``'s prefix every ``MARK_EVERY`` blocks, at the previous prompt's
        end and at this one's, in one pass; and the blocks up to the last mark where they equal
        the previous prompt's (a mark can only match if every earlier one did)."""
        before = {} if memo is None else dict(memo.marks)
        ends = {b for b in before if b <= total and b % MARK_EVERY}
        view = memoryview(data)
        stream = xxhash.xxh3_128()
        marks: list[tuple[int, int]] = []
        reused, matching, done = 0, bool(before), 0
        for mark in sorted({*range(MARK_EVERY, total, MARK_EVERY), *ends, total} - {0}):
            stream.update(view[done * self.block : mark * self.block])
            done = mark
            digest = stream.intdigest()
            marks.append((mark, digest))
            if matching and before.get(mark) == digest:
                reused = mark
            elif mark in before:
                matching = False
        return marks, reused


def _hash(data: bytes, size: int, model: str, start: int, base: array[int]) -> array[int]:
    """``base`` (the hashes of the first ``start`` blocks) extended by the rest of ``data``."""
    seed = base[-1] if start else _xxh3(model.encode())
    stop = len(data) - size + 1
    base.extend(chain_hashes([data[i : i + size] for i in range(start * size, stop, size)], seed))
    return base
