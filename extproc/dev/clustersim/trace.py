"""Mooncake-format traces (JSONL) read for replay; ``extproc.trace`` writes them.

A row is ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [int...]}`` plus, for
agentic traffic, ``session_id`` and ``delay`` (ms of tool time after the session's previous
call ended), and for flow control ``tenant``, ``class`` (its priority class) and ``ttft_ms``
(its TTFT target), read from a session's first row. Each hash id names one block of
``block_size`` tokens and rows share a prefix exactly when they share leading ids, so a trace
carries cache behaviour without any content.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .workload import Script, Step

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per hash id in the published Mooncake traces."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_id: str | None = None
    delay_ms: float | None = None
    tenant: str | None = None
    klass: str | None = None
    ttft_ms: float | None = None


def read_trace(path: str | Path) -> list[TraceRow]:
    """Every row of a Mooncake JSONL file; a malformed row fails with its line number."""
    rows: list[TraceRow] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(_row(json.loads(line)))
                except (ValueError, TypeError, KeyError) as exc:
                    raise ValueError(f"{path}:{number}: bad trace row: {exc}") from None
    return rows


def _row(data: dict[str, Any]) -> TraceRow:
    session = data.get("session_id")
    delay = data.get("delay")
    tenant, klass, ttft = data.get("tenant"), data.get("class"), data.get("ttft_ms")
    row = TraceRow(
        timestamp_ms=float(data["timestamp"]),
        input_length=int(data["input_length"]),
        output_length=int(data["output_length"]),
        hash_ids=tuple(int(h) for h in data["hash_ids"]),
        session_id=None if session is None else str(session),
        delay_ms=None if delay is None else float(delay),
        tenant=None if tenant is None else str(tenant),
        klass=None if klass is None else str(klass),
        ttft_ms=None if ttft is None else float(ttft),
    )
    if row.input_length < 1 or row.output_length < 0:
        raise ValueError("input_length must be >= 1 and output_length >= 0")
    return row


def scripts_from_trace(rows: Iterable[TraceRow]) -> list[Script]:
    """One script per session (a row without ``session_id`` is a session of one call).

    A session's calls run in order: a call with ``delay`` arrives that long after the previous
    one ended (closed loop, as AIPerf replays agentic rows); one without arrives at its
    timestamp, or when the previous call ends if that is later.
    """
    ordered = sorted(rows, key=lambda r: r.timestamp_ms)
    if not ordered:
        return []
    origin = ordered[0].timestamp_ms
    sessions: dict[str, list[TraceRow]] = {}
    for n, row in enumerate(ordered):
        sessions.setdefault(row.session_id or f"row{n}", []).append(row)
    scripts = []
    for key, session_rows in sessions.items():
        steps = tuple(
            Step(
                prompt_tokens=row.input_length,
                output_tokens=row.output_length,
                delay_s=(row.delay_ms or 0.0) / 1000.0 if i else 0.0,
                not_before_s=(row.timestamp_ms - origin) / 1000.0
                if i == 0 or row.delay_ms is None else 0.0,
                hash_ids=row.hash_ids,
            )
            for i, row in enumerate(session_rows)
        )
        first = session_rows[0]
        scripts.append(Script(key, steps, start_s=(first.timestamp_ms - origin) / 1000,
                              tenant=first.tenant or "default", klass=first.klass,
                              ttft_s=None if first.ttft_ms is None else first.ttft_ms / 1000))
    return scripts
