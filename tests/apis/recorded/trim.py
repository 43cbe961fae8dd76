"""Turn requests the simulator recorded (``saar sim-server --record-dir DIR``) into fixtures:
every string longer than ``KEEP`` characters cut to its head (system prompts and tool
descriptions run to tens of kilobytes), the structure, ids and short fields as sent.

    python -m tests.apis.recorded.trim DIR/qwen3-8b-0-00001.json NAME  # writes NAME.json here
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

KEEP = 160
_DROPPED_HEADERS = ("host", "content-length", "authorization", "x-api-key")


def trimmed(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= KEEP else f"{value[:KEEP]}…[{len(value) - KEEP} more]"
    if isinstance(value, list):
        return [trimmed(v) for v in value]
    if isinstance(value, dict):
        return {k: trimmed(v) for k, v in value.items()}
    return value


def fixture(recorded: dict[str, Any]) -> dict[str, Any]:
    headers = {k: v for k, v in recorded["headers"].items() if k not in _DROPPED_HEADERS}
    return {"path": recorded["path"], "headers": headers,
            "body": trimmed(json.loads(recorded["body"]))}


if __name__ == "__main__":
    source, name = Path(sys.argv[1]), sys.argv[2]
    out = Path(__file__).parent / f"{name}.json"
    out.write_text(json.dumps(fixture(json.loads(source.read_text())), indent=1,
                              ensure_ascii=False) + "\n")
