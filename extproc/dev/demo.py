"""``saar demo``: a scripted agent session through the real Envoy, shown turn by turn."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .harness import Stack, run_stack

DEFAULT_CONFIG = Path("config/example.yaml")
SESSION = "demo-session-1"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the project's test suite",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def _row(turn: str, raw: Any) -> dict[str, str]:
    headers = raw.headers
    return {
        "turn": turn,
        "model": headers.get("x-saar-selected-model", "?"),
        "worker": headers.get("x-saar-worker", "?"),
        "decision": headers.get("x-saar-decision", "?"),
        "phase": headers.get("x-saar-session-phase", "?"),
        "action": headers.get("x-saar-action", "?"),
        "replay": headers.get("x-replay-id", "?"),
    }


def _session(stack: Stack) -> list[dict[str, str]]:
    from openai import OpenAI

    client = OpenAI(
        base_url=f"{stack.url}/v1",
        api_key="demo-key",
        default_headers={"x-session-id": SESSION},
        max_retries=0,
    )
    rows: list[dict[str, str]] = []
    messages: list[Any] = [
        {"role": "user", "content": "Refactor the parser module, then run the tests."}
    ]
    chat = client.chat.completions.with_raw_response
    for turn in range(2):
        raw = chat.create(model="auto", messages=messages, tools=TOOLS)
        completion = raw.parse()
        rows.append(_row(f"{len(rows) + 1} chat: user asks", raw))
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "12 passed"})
            raw = chat.create(model="auto", messages=messages, tools=TOOLS)
            rows.append(_row(f"{len(rows) + 1} chat: tool result", raw))
            messages.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
        if turn == 0:
            messages.append(
                {"role": "user", "content": "Thanks. Now summarise the change for the changelog."}
            )

    stream = chat.create(
        model="auto", messages=[*messages, {"role": "user", "content": "Summarise so far."}],
        stream=True, stream_options={"include_usage": True},
    )
    for _ in stream.parse():
        pass
    rows.append(_row(f"{len(rows) + 1} chat: streamed summary", stream))

    responses = client.responses.with_raw_response
    opened = responses.create(model="auto", input="Plan the next refactor step.")
    rows.append(_row(f"{len(rows) + 1} responses: new chain", opened))
    chained = responses.create(
        model="auto", input="go on", previous_response_id=opened.parse().id
    )
    rows.append(_row(f"{len(rows) + 1} responses: previous_response_id", chained))
    return rows


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def run_demo(config_path: str | None) -> int:
    config = yaml.safe_load(Path(config_path or DEFAULT_CONFIG).read_text())
    with run_stack(config) as stack:
        print(f"Envoy {stack.url} → processor {stack.processor_http} → sims {stack.sims}")
        rows = _session(stack)
        widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in rows[0]}
        print("  ".join(k.ljust(w) for k, w in widths.items()))
        for row in rows:
            print("  ".join(row[k].ljust(w) for k, w in widths.items()))
        record = _get(f"{stack.processor_http}/v1/replay/{rows[1]['replay']}")
        print(f"\nreplay record of turn 2 ({rows[1]['replay']}):")
        print(json.dumps({k: record[k] for k in ("model", "action", "phase", "reason", "lock")}))
        violations = sum(
            sum(_get(f"{url}/admin/state")["violations"].values())
            for urls in stack.sims.values()
            for url in urls
        )
        print(f"continuity violations reported by the model servers: {violations}")
        return 0 if violations == 0 and all(r["replay"] != "?" for r in rows) else 1
