"""The request bodies the benchmark sends: a small chat turn and long agent loops, and the
small turn streamed.

Sizes are exact (2 KB to 1 MB of JSON) so runs stay comparable; the agent bodies carry 30
tool-call/tool-result turns because that is the shape the router parses hardest. ``2kb-stream``
is the small turn with ``"stream": true``: the answer comes back as SSE past the observe
filter (the canned upstream streams when the request says so, see ``upstream.py``).
"""

from __future__ import annotations

import json
from typing import Any

SIZES = {"2kb": 2 * 1024, "64kb": 64 * 1024, "256kb": 256 * 1024, "1mb": 1024 * 1024,
         "2kb-stream": 2 * 1024}
STREAMED = frozenset({"2kb-stream"})
DEFAULT_BODIES = ("2kb", "64kb", "256kb", "1mb", "2kb-stream")
AGENT_TURNS = 30
_WORDS = ("the", "parser", "module", "reads", "tokens", "and", "builds", "a", "tree", "for",
          "each", "file", "in", "the", "repo")
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name, description in (
        ("read_file", "Read a file of the repository"),
        ("run_tests", "Run the test suite for a path"),
    )
]


def _text(n: int, seed: int = 0) -> str:
    words = (_WORDS[(seed + i) % len(_WORDS)] for i in range(n))
    return " ".join(words)


def _chat(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. "},
            {"role": "user", "content": _text(200, 3)},
        ],
        "max_tokens": 64,
    }


def _agent(model: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. "},
        {"role": "user", "content": "Debug the failing parser tests, then refactor the module."},
    ]
    for turn in range(AGENT_TURNS):
        call_id = f"call_{turn:04d}"
        name = TOOLS[turn % len(TOOLS)]["function"]["name"]
        messages.append({
            "role": "assistant",
            "content": None,
            "tool_calls": [{
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps({"path": f"src/m{turn}.py"})},
            }],
        })
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _text(280, turn)})
    return {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": 64}


def body(name: str, model: str) -> bytes:
    """The body ``name`` (a key of ``SIZES``) for ``model``, padded in the system prompt to
    size."""
    doc = _chat(model) if name.startswith("2kb") else _agent(model)
    if name in STREAMED:
        doc["stream"] = True
    raw = json.dumps(doc, separators=(",", ":")).encode()
    missing = SIZES[name] - len(raw)
    if missing < 0:
        raise ValueError(f"{name} body is {len(raw)} bytes before padding")
    doc["messages"][0]["content"] += "x" * missing
    return json.dumps(doc, separators=(",", ":")).encode()
