"""Writes live traffic as a Mooncake trace (JSONL) that ``saar simulate --trace`` can replay.

A row is ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [int...]}`` plus, for
agentic traffic, ``session_id`` and ``delay`` (ms of tool time after the session's previous call
ended). Block hashes become small ids in first-seen order, so rows share a prefix exactly when
they share leading ids and nothing of the prompt can be recovered: the trace is content-free.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from cachetools import LRUCache

Row = dict[str, Any]
MAX_IDS = 1_000_000
"""Hash → id mappings kept; a prefix unseen for longer gets a fresh id (a miss, never a clash)."""


class MooncakeTraceWriter:
    """Turns request facts into Mooncake rows and hands them to ``sink`` (a file writer, or the
    processor's background JSONL thread)."""

    def __init__(self, sink: Callable[[Row], None], *, max_ids: int = MAX_IDS) -> None:
        self._sink = sink
        self._ids: LRUCache[int, int] = LRUCache(maxsize=max_ids)
        self._next = itertools.count()

    def write(
        self,
        *,
        session_id: str | None,
        timestamp_ms: float,
        input_length: int,
        output_length: int,
        block_hashes: Sequence[int],
        delay_ms: float | None = None,
    ) -> None:
        ids = []
        for block in block_hashes:
            found = self._ids.get(block)
            if found is None:
                found = self._ids[block] = next(self._next)
            ids.append(found)
        row: Row = {
            "timestamp": round(timestamp_ms, 3),
            "input_length": input_length,
            "output_length": output_length,
            "hash_ids": ids,
        }
        if session_id is not None:
            row["session_id"] = session_id
        if delay_ms is not None:
            row["delay"] = round(delay_ms, 3)
        self._sink(row)
