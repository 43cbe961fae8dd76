"""A stand-in for the Semantic Router's live benchmark script, for the tests: its
``response_record`` signature and record shape, and the ``x-vsr-*`` names their script at
``3d48f8c9`` reads (recorded from it; their code is not in this project)."""

from __future__ import annotations

import json
import time
from typing import Any

READ_HEADERS = ("x-vsr-context-token-count", "x-vsr-matched-conversation", "x-vsr-replay-id",
                "x-vsr-selected-confidence", "x-vsr-selected-decision",
                "x-vsr-selected-model", "x-vsr-session-phase")


def response_record(status: int, headers: dict[str, str], payload: str,
                    started: float) -> dict[str, Any]:
    return {"status": status, "latency_ms": (time.perf_counter() - started) * 1000,
            "headers": {key.lower(): value for key, value in headers.items()},
            "json": json.loads(payload) if payload else {}}


def main() -> int:
    return 0
