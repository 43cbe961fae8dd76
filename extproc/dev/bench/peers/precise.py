"""saar's precise prefix index judged against the engine: before a request is sent the index
says how many of its blocks the picked worker holds (the replay record's
``worker.matched_blocks``, in the engine's blocks); the engine then reports the prompt tokens it
found cached (``usage.prompt_tokens_details.cached_tokens``, which the client reads from the
stream's usage chunk). A request counts when the record has a match for the worker that served
it and the engine reported its cached tokens; it is within one block when ``|matched × block
size − cached| ≤ block size`` (vLLM recomputes a fully cached prompt's last block, so an exact
index is off by at most one block there).

The records come from the replay JSONL saar writes in the bench (``replay.jsonl_path``); the
decision is written before the answer starts, so it is there by the time the workload ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ....observability.replay import read_records
from .client import Observed
from .stats import PreciseCount

READ_TIMEOUT_S = 3.0


def predicted_blocks(record: Mapping[str, Any], worker: str | None) -> float | None:
    """The blocks the record's index matched on ``worker`` (default: the worker it picked)."""
    placed = record.get("worker")
    if not isinstance(placed, Mapping):
        return None
    served = worker or placed.get("picked")
    matched = placed.get("matched_blocks")
    if not isinstance(matched, Mapping) or served not in matched:
        return None
    value = matched[served]
    return float(value) if isinstance(value, int | float) else None


def count(observed: Iterable[Observed], records: Mapping[str, Mapping[str, Any]],
          block_size: int) -> PreciseCount:
    """The requests ``observed`` whose prediction and report can be compared, and how many of
    them agree within one block."""
    requests = within = 0
    for seen in observed:
        record = records.get(seen.replay_id)
        if record is None or seen.cached_tokens is None:
            continue
        blocks = predicted_blocks(record, seen.worker)
        if blocks is None:
            continue
        requests += 1
        within += abs(blocks * block_size - seen.cached_tokens) <= block_size
    return PreciseCount(requests, within)


def records_for(path: Path, replay_ids: Iterable[str],
                timeout_s: float = READ_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """The records of ``replay_ids`` in saar's replay JSONL, waiting a little for the writer
    thread's last lines; those still absent after ``timeout_s`` are left out."""
    wanted = set(replay_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        found = ({str(r.get("replay_id")): r for r in read_records(path)}
                 if path.exists() else {})
        if wanted <= found.keys() or time.monotonic() > deadline:
            return {key: found[key] for key in wanted if key in found}
        time.sleep(0.1)
