"""``saar demo``: a scripted agent session through the real Envoy, shown turn by turn, then
where to look at it: the web view, the session's timeline (Perfetto), the replay records.

The session exercises what SAAR decides: a tool loop held on its issuer even when the client
adds a new request beside the tool output (a drift the lock overrides), a sub-agent, a drift
to the cheap tier, a streamed answer and a Responses chain held by its provider state.
"""

from __future__ import annotations

import copy
import json
import secrets
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from ..adapter.contract import DIAGNOSTIC_HEADERS, REPLAY_HEADER, WORKER_HEADER
from ..observability.explain import explain
from ..observability.timeline import timeline
from . import EXAMPLE_CONFIG
from .harness import Stack, run_stack
from .records import fetch_records

SESSION = "demo-session-1"
SUB_AGENT = "demo-session-1-explorer"
API_KEY = "demo-key"
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


DIAGNOSTIC = {key: header for header, key in DIAGNOSTIC_HEADERS.items()}


def demo_config(base: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """``base`` with the demo's admin token, replay records and Mooncake trace in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    token = workdir / "admin-token"
    token.write_text(secrets.token_hex(24) + "\n")
    token.chmod(0o600)
    config = copy.deepcopy(base)
    config["replay"] = {**(config.get("replay") or {}),
                        "jsonl_path": str(workdir / "replay.jsonl"),
                        "mooncake_trace_path": str(workdir / "trace.mooncake.jsonl")}
    config["admin"] = {"token_file": str(token)}
    return config


def _row(turn: str, raw: Any) -> dict[str, str]:
    headers = raw.headers
    return {
        "turn": turn,
        "model": headers.get(DIAGNOSTIC["selected_model"], "?"),
        "worker": headers.get(WORKER_HEADER, "?"),
        "decision": headers.get(DIAGNOSTIC["decision"], "?"),
        "phase": headers.get(DIAGNOSTIC["session_phase"], "?"),
        "action": headers.get(DIAGNOSTIC["action"], "?"),
        "replay": headers.get(REPLAY_HEADER, "?"),
    }


def session(stack: Stack) -> list[dict[str, str]]:
    """Run the demo's agent session through ``stack``; one row per turn, as the client saw it."""
    from openai import OpenAI

    def client(**headers: str) -> Any:
        return OpenAI(base_url=f"{stack.url}/v1", api_key=API_KEY, default_headers=headers,
                      max_retries=0)

    agent = client(**{"x-session-id": SESSION})
    rows: list[dict[str, str]] = []
    messages: list[Any] = [
        {"role": "user", "content": "Refactor the parser module, then run the tests."}
    ]
    chat = agent.chat.completions.with_raw_response
    for turn in range(2):
        raw = chat.create(model="auto", messages=messages, tools=TOOLS)
        rows.append(_row(f"{len(rows) + 1} chat: user asks", raw))
        message = raw.parse().choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "12 passed"})
            label = "tool result"
            if turn == 0:
                # Harnesses add instructions beside tool output: a new task by its words,
                # but the results still belong to the model that called the tool.
                messages.append({"role": "user", "content": "Also explain the failing case."})
                label = "tool result + user"
            raw = chat.create(model="auto", messages=messages, tools=TOOLS)
            rows.append(_row(f"{len(rows) + 1} chat: {label}", raw))
            messages.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
        if turn == 0:
            explorer = client(**{"x-session-id": SUB_AGENT, "x-parent-session-id": SESSION,
                                 "x-dynamo-session-final": "true"})  # done after one call
            raw = explorer.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user",
                                         "content": "Explain how the tokenizer module works."}])
            rows.append(_row(f"{len(rows) + 1} sub-agent: explore", raw))
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

    responses = agent.responses.with_raw_response
    opened = responses.create(model="auto", input="Plan the next refactor step.")
    rows.append(_row(f"{len(rows) + 1} responses: new chain", opened))
    chained = responses.create(
        model="auto", input="go on", previous_response_id=opened.parse().id
    )
    rows.append(_row(f"{len(rows) + 1} responses: previous_response_id", chained))
    return rows


def admin_get(stack: Stack, path: str, token: str) -> Any:
    request = urllib.request.Request(f"{stack.processor_http}{path}",
                                     headers={"authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def _violations(stack: Stack) -> int:
    return sum(stack.continuity()["violations"].values())


def run_demo(config_path: str | None, workdir: str | Path | None = None,
             wait: bool | None = None) -> int:
    """Run the demo; ``wait`` (default: stdin is a terminal) keeps the stack up until Enter,
    so the web view can be opened."""
    place = Path(workdir or tempfile.mkdtemp(prefix="saar-demo-"))
    config = demo_config(yaml.safe_load(Path(config_path or EXAMPLE_CONFIG).read_text()), place)
    token_file = Path(config["admin"]["token_file"])
    token = token_file.read_text().strip()
    with run_stack(config, workdir=place) as stack:
        print(f"Envoy {stack.url} → processor {stack.processor_http} → sims {stack.sims}")
        rows = session(stack)
        widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in rows[0]}
        print("  ".join(k.ljust(w) for k, w in widths.items()))
        for row in rows:
            print("  ".join(row[k].ljust(w) for k, w in widths.items()))
        record = admin_get(stack, f"/v1/replay/{rows[1]['replay']}", token)
        print(f"\nturn 2, as `saar replay show {rows[1]['replay']}` tells it:")
        print(explain(record))
        violations = _violations(stack)
        print(f"continuity violations reported by the model servers: {violations}")
        trace = place / "demo-timeline.json"
        trace.write_text(json.dumps(timeline(fetch_records(stack.processor_http, token))))
        print(f"\nweb view:  {stack.processor_http}/ui#{rows[1]['replay']}  (turn 2; sign in "
              f"with the admin token in {token_file})")
        print(f"timeline:  {trace}  (open it at https://ui.perfetto.dev or chrome://tracing)")
        print(f"records:   {config['replay']['jsonl_path']}  (saar trace export --replay …, "
              "saar replay what-if --replay … --config NEW.yaml)")
        print(f"trace:     {config['replay']['mooncake_trace_path']}  (saar replay-trace "
              "--trace … --url …, saar simulate --trace …)")
        if wait if wait is not None else sys.stdin.isatty():
            input("\nThe stack stays up for the web view: press Enter to stop it. ")
        return 0 if violations == 0 and all(r["replay"] != "?" for r in rows) else 1
