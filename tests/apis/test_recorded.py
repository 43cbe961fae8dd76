"""What the four agent CLIs really send (tests/apis/recorded: requests the simulator recorded
from Claude Code 2.1.332, Codex 0.171.0, OpenCode 1.18.33 and Qwen Code 0.24.4, long strings
trimmed by ``trim.py``), read by the parser: the tools they offer in every format, the calls
and results of their tool loops, their provider-bound blobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from extproc.apis import ResponseObserver, parse_request, render_prompt
from extproc.apis.formats import FORMATS
from extproc.apis.tools import Tool, offered
from extproc.types import API_PATHS, Api, RequestSummary
from tests.apis.bodies import feed_in_pieces, sse

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    return doc


def summary_of(name: str) -> RequestSummary:
    doc = recorded(name)
    api = API_PATHS[doc["path"].split("?", 1)[0]]
    return parse_request(api, orjson.dumps(doc["body"]), max_body_bytes=1 << 24)


# fixture, API, tools offered, some of their names, tool calls in history, pending results,
# provider-bound blobs
CASES = [
    ("claude-code-first", Api.MESSAGES, 12, {"Agent", "Bash", "Write"}, 0, 0, 0),
    ("claude-code-subagent-first", Api.MESSAGES, 10, {"Agent", "Bash"}, 0, 0, 0),
    ("claude-code-after-subagent", Api.MESSAGES, 12, {"Agent", "Bash"}, 1, 1, 1),
    # responses-lite: no top-level tools, all of them in the additional_tools item, in
    # namespaces (functions.exec is free-form JavaScript)
    ("codex-lite-first", Api.RESPONSES, 12, {"exec", "wait", "spawn_agent", "wait_agent"},
     0, 0, 0),
    ("codex-lite-custom-tool-result", Api.RESPONSES, 12, {"exec"}, 1, 1, 1),
    ("codex-lite-after-spawn", Api.RESPONSES, 12, {"spawn_agent"}, 1, 1, 1),
    ("codex-lite-subagent-first", Api.RESPONSES, 10, {"exec", "wait"}, 0, 0, 0),
    ("codex-standard-first", Api.RESPONSES, 13,
     {"exec_command", "spawn_agent", "wait_agent", "web_search"}, 0, 0, 0),
    ("opencode-title", Api.CHAT, 0, set(), 0, 0, 0),
    ("opencode-first", Api.CHAT, 10, {"bash", "task"}, 0, 0, 0),
    ("opencode-subagent-first", Api.CHAT, 8, {"bash"}, 0, 0, 0),
    ("qwen-code-first", Api.CHAT, 14, {"run_shell_command", "agent"}, 0, 0, 0),
    ("qwen-code-after-subagent", Api.CHAT, 14, {"run_shell_command", "agent"}, 1, 1, 0),
]


@pytest.mark.parametrize(("name", "api", "count", "names", "calls", "results", "state"), CASES)
def test_what_the_clis_send_is_read(name, api, count, names, calls, results, state):
    s = summary_of(name)
    assert s.api is api
    assert len(s.tools_offered) == count
    assert names <= set(s.tools_offered)
    assert (len(s.tool_call_ids), len(s.tool_result_ids), len(s.provider_state)) == (
        calls, results, state)
    if results:  # the pending results answer the newest calls
        assert s.tool_result_ids == s.tool_call_ids[-results:]


def test_codex_lite_tools_are_namespaced_and_exec_is_free_form():
    body = recorded("codex-lite-first")["body"]
    assert "tools" not in body and body["input"][0]["type"] == "additional_tools"
    tools = {t.name: t for t in offered(FORMATS[Api.RESPONSES].tools(body))}
    assert tools["exec"] == Tool("exec", namespace="functions", custom=True)
    assert tools["spawn_agent"].namespace == "collaboration"
    assert tools["spawn_agent"].schema["required"] == ["task_name", "message"]


def test_codex_lite_calls_carry_their_namespace_and_custom_calls_their_call_id():
    items = recorded("codex-lite-custom-tool-result")["body"]["input"]
    call = next(i for i in items if i["type"] == "custom_tool_call")
    output = next(i for i in items if i["type"] == "custom_tool_call_output")
    assert call["namespace"] == "functions" and call["call_id"] == output["call_id"]
    assert summary_of("codex-lite-custom-tool-result").tool_result_ids == (call["call_id"],)
    spawn = next(i for i in recorded("codex-lite-after-spawn")["body"]["input"]
                 if i["type"] == "function_call")
    assert (spawn["name"], spawn["namespace"]) == ("spawn_agent", "collaboration")


def test_the_additional_tools_item_is_part_of_the_rendered_prompt():
    """Codex-lite's tools sit in its input: the prefix shared with the next turn covers them."""
    prompt = render_prompt(summary_of("codex-lite-first"))
    assert prompt.startswith("<|tools|>\n") and '"name":"exec"' in prompt


CUSTOM_CALL = {"id": "ctc_1", "type": "custom_tool_call", "status": "completed",
               "call_id": "call_js", "name": "exec", "namespace": "functions",
               "input": "text(1)"}
SPAWN = {"id": "fc_2", "type": "function_call", "status": "completed", "call_id": "call_sp",
         "name": "spawn_agent", "namespace": "collaboration", "arguments": "{}"}


@pytest.mark.parametrize(("terminal_output", "expected"), [
    ([CUSTOM_CALL], ["call_js"]),  # the final object restates the items: counted once
    ([], ["call_js"]),  # a final object without its output: the items read as done stand
    ([CUSTOM_CALL, SPAWN], ["call_js", "call_sp"]),
])
def test_a_streamed_custom_tool_call_is_owned_like_a_function_call(terminal_output, expected):
    response = {"id": "resp_1", "status": "completed", "output": terminal_output}
    data = sse({"type": "response.created", "response": {"id": "resp_1"}},
               {"type": "response.output_item.done", "output_index": 0, "item": CUSTOM_CALL},
               {"type": "response.completed", "response": response}, done=False)
    observer = ResponseObserver(Api.RESPONSES, streaming=True)
    feed_in_pieces(observer, data)
    assert observer.done and observer.summary.tool_call_ids == expected
    assert observer.summary.tool_names[0] == "exec"
