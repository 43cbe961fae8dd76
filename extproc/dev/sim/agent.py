"""The model an agent CLI talks to: it runs the commands its task names, with the CLI's own
shell tool, delegates to the CLI's sub-agent tool, and then answers quoting what they printed.

A task names its steps as directives in its text: ``[[run: CMD]]`` runs CMD with the shell
tool the request offers; ``[[agent: CMD]]`` hands ``[[run: CMD]]`` to a sub-agent through the
request's sub-agent tool (or runs CMD itself when it has none, as a sub-agent does). The task
is the newest user message holding a directive (else the newest user message); each tool call
the model made after it is one step done. With steps left, the answer is the next call, its
arguments valid for that tool's schema; without, a text answer that quotes every tool result
since the task, so the CLI's own output shows what really ran. Everything is a pure function
of the request, so a run is reproducible.

The tools are found by name, in every body format the CLIs use: Claude Code ``Bash`` and
``Agent``, Codex ``exec_command`` and ``spawn_agent`` (in a namespace), or in its default
"responses-lite" format the free-form ``exec`` tool taking JavaScript that calls
``tools.exec_command``; OpenCode ``bash`` and ``task``; Qwen Code ``run_shell_command`` and
``agent``. A request offering none of them gets the simulator's plain rule (``reply``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from ...apis.common import as_dict, as_list, text
from ...apis.formats import FORMATS
from ...apis.tools import Tool, offered
from ...types import Api

DIRECTIVE = re.compile(r"\[\[(run|agent):\s*(.+?)\s*\]\]", re.DOTALL)
SHELL_TOOLS = ("Bash", "bash", "run_shell_command", "exec_command", "shell")
"""Preferred first: a request offering several gets the first of these it has."""
AGENT_TOOLS = ("Agent", "Task", "task", "agent", "spawn_agent")
WAIT_TOOL = "wait_agent"
JS_EXEC = "exec"
"""Codex's free-form tool: JavaScript whose ``tools.exec_command`` runs a shell command."""
AGENT_MESSAGE = "agent_message"
QUOTE_CHARS = 240
_COMMAND_KEYS = ("command", "cmd")
_PROMPT_KEYS = ("prompt", "message")
_SUBAGENT_TYPES = ("general-purpose", "general")


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call to make: ``arguments`` is compact JSON, or the text of a custom tool."""

    tool: Tool
    arguments: str


@dataclass(frozen=True, slots=True)
class Answer:
    """The text to answer with: what the tool results since the task said."""

    quotes: tuple[str, ...]


def decide(api: Api, body: dict[str, Any]) -> Call | Answer | None:
    """The next step of the task ``body`` carries, or the final answer; None if the request
    offers neither a shell nor a sub-agent tool this module knows (no agent CLI sent it)."""
    tools = offered(FORMATS[api].tools(body))
    if _shell(tools) is None and _agent(tools) is None:
        return None
    events = list(_events(api, FORMATS[api].entries(body)))
    start = _task(events)
    task = events[start][1] if start >= 0 else ""
    since = events[start + 1 :]
    done = sum(kind == "call" for kind, _ in since)
    results = [value for kind, value in since if kind == "result"]
    steps = [step for match in DIRECTIVE.finditer(task)
             for step in _steps(match.group(1), match.group(2), tools, results)]
    if done < len(steps):
        return steps[done]
    return Answer(tuple(_quote(value) for value in results))


def _steps(verb: str, command: str, tools: tuple[Tool, ...],
           results: list[str]) -> Iterator[Call]:
    """The calls one directive takes. A Codex sub-agent runs beside its parent, which waits
    for it (``wait_agent``, on the agent the spawn's result names): ``codex exec`` ends with
    its root agent's turn."""
    agent = _agent(tools) if verb == "agent" else None
    if agent is not None:
        yield Call(agent, _json(_arguments(agent, {
            **dict.fromkeys(_PROMPT_KEYS, f"Run this and report its output: [[run: {command}]]"),
            "description": "Run a delegated command",
            "task_name": "delegated_run",
            "run_in_background": False,
            "fork_context": False,
        })))
        wait = next((t for t in tools if t.name == WAIT_TOOL and t.namespace == agent.namespace),
                    None)
        if wait is not None:
            spawned = _spawned(results[-1] if results else "")
            yield Call(wait, _json(_arguments(wait, {"targets": spawned, "timeout_ms": 60_000})))
        return
    shell = _shell(tools)
    if shell is None:
        return
    if shell.custom:
        source = f"const r = await tools.exec_command({{cmd: {_json(command)}}});\ntext(r.output);"
        yield Call(shell, source)
        return
    kind = _property(shell, _COMMAND_KEYS)[1].get("type")
    value: Any = ["bash", "-lc", command] if kind == "array" else command
    yield Call(shell, _json(_arguments(shell, {
        **dict.fromkeys(_COMMAND_KEYS, value), "description": "Run the requested command"})))


def _spawned(result: str) -> list[str]:
    """The agent a spawn's result names (Codex answers a JSON object: its id or task name)."""
    try:
        doc = orjson.loads(result)
    except orjson.JSONDecodeError:
        return []
    found = [as_dict(doc).get(key) for key in ("agent_id", "id", "task_name")]
    return [value for value in found if isinstance(value, str) and value][:1]


def _shell(tools: tuple[Tool, ...]) -> Tool | None:
    by_name = {t.name: t for t in tools if not t.custom and _property(t, _COMMAND_KEYS)[0]}
    for name in SHELL_TOOLS:
        if name in by_name:
            return by_name[name]
    return next((t for t in tools if t.custom and t.name == JS_EXEC), None)


def _agent(tools: tuple[Tool, ...]) -> Tool | None:
    by_name = {t.name: t for t in tools if not t.custom and _property(t, _PROMPT_KEYS)[0]}
    return next((by_name[name] for name in AGENT_TOOLS if name in by_name), None)


def _property(tool: Tool, keys: tuple[str, ...]) -> tuple[str | None, dict[str, Any]]:
    properties = as_dict(tool.schema.get("properties"))
    for key in keys:
        if isinstance(properties.get(key), dict):
            return key, properties[key]
    return None, {}


def _arguments(tool: Tool, wanted: dict[str, Any]) -> dict[str, Any]:
    """What the schema requires, plus those of ``wanted`` it has: valid for the schema."""
    properties = as_dict(tool.schema.get("properties"))
    required = [k for k in as_list(tool.schema.get("required")) if isinstance(k, str)]
    out: dict[str, Any] = {}
    for key, schema in properties.items():
        schema = as_dict(schema)
        if key == "subagent_type":
            if chosen := _subagent_type(tool, schema, key in required):
                out[key] = chosen
        elif key == "fork_turns":
            if "`none`" in str(schema.get("description", "")):
                out[key] = "none"
        elif key in wanted and _fits(wanted[key], schema):
            out[key] = wanted[key]
        elif key in required:
            out[key] = _filler(schema)
    for key in required:
        out.setdefault(key, "x")
    return out


def _subagent_type(tool: Tool, schema: dict[str, Any], required: bool) -> str | None:
    choices = [c for c in as_list(schema.get("enum")) if isinstance(c, str)]
    known = choices or [t for t in _SUBAGENT_TYPES if t in tool.description]
    found = next((t for t in _SUBAGENT_TYPES if t in known), known[0] if known else None)
    return found or (_SUBAGENT_TYPES[0] if required else None)


def _fits(value: Any, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    kinds = {"string": str, "boolean": bool, "array": list, "object": dict}
    return kind not in kinds or isinstance(value, kinds[kind])


def _filler(schema: dict[str, Any]) -> Any:
    """A value of the schema's type: the first of an enum, the least allowed number."""
    if enum := as_list(schema.get("enum")):
        return enum[0]
    kind = schema.get("type")
    if kind in ("integer", "number"):
        least = schema.get("minimum")
        return max(least, 1) if isinstance(least, int | float) else 1
    return {"boolean": False, "array": [], "object": {}}.get(kind, "x") if isinstance(
        kind, str) else "x"


def _events(api: Api, entries: list[Any]) -> Iterator[tuple[str, str]]:
    """The conversation as ("user", text) / ("call", "") / ("result", text), in order."""
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        role = entry.get("role")
        kind = entry.get("type", "message")
        if api is Api.RESPONSES and isinstance(kind, str) and kind != "message":
            if kind == AGENT_MESSAGE:  # a task from a Codex parent, or a sub-agent's report
                said = _agent_message(entry)
                yield "user" if DIRECTIVE.search(said) else "result", said
            elif kind.endswith("_call"):
                yield "call", ""
            elif kind.endswith("_call_output"):
                yield "result", text(entry.get("output"))
        elif role == "assistant":
            calls = len(as_list(entry.get("tool_calls"))) + sum(
                as_dict(b).get("type") == "tool_use" for b in as_list(entry.get("content")))
            yield from (("call", "") for _ in range(calls))
        elif role == "tool":
            yield "result", text(entry.get("content"))
        elif role == "user":
            content = entry.get("content")
            for block in as_list(content):
                if as_dict(block).get("type") == "tool_result":
                    yield "result", text(as_dict(block).get("content"))
            if said := text(content):
                yield "user", said


def _agent_message(item: dict[str, Any]) -> str:
    """Its text parts and the payload Codex carries as ``encrypted_content`` (which a real
    provider encrypts; the simulator's spawn arguments arrive as written)."""
    parts = (as_dict(p) for p in as_list(item.get("content")))
    found = (p.get("text") or p.get("encrypted_content") for p in parts)
    return "\n".join(part for part in found if isinstance(part, str))


def _task(events: list[tuple[str, str]]) -> int:
    """Index of the newest user message with a directive, else of the newest user message."""
    users = [i for i, (kind, _) in enumerate(events) if kind == "user"]
    directed = [i for i in users if DIRECTIVE.search(events[i][1])]
    return (directed or users or [-1])[-1]


def _quote(result: str) -> str:
    flat = " ".join(result.split())
    return flat[-QUOTE_CHARS:]


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
