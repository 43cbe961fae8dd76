"""The simulator plays the agent CLIs' model: on what each CLI really sent (the recorded
requests), the next step of its task is a call of that CLI's own tool with arguments its
schema accepts, and with no step left a text quoting what the tools printed."""

from __future__ import annotations

import json

import pytest

from extproc.dev.sim import agent
from extproc.types import Api
from tests.apis.test_recorded import summary_of

DELEGATED = "Run this and report its output: [[run: echo sub-$((2+3)) > sub.txt; cat sub.txt]]"
SUB = "echo sub-$((2+3)) > sub.txt; cat sub.txt"


def js(command: str) -> str:
    return f"const r = await tools.exec_command({{cmd: {json.dumps(command)}}});\ntext(r.output);"


# recorded request -> (tool, namespace, arguments: JSON, or the text of a free-form tool)
CALLS = [
    ("claude-code-subagent-first", "Bash", None,
     {"command": SUB, "description": "Run the requested command"}),
    ("codex-lite-first", "exec", "functions", js("printf 'check-%s\\n' $((6*7)) > check.txt")),
    ("codex-lite-custom-tool-result", "exec", "functions", js("cat check.txt")),  # step two
    ("codex-lite-after-spawn", "wait_agent", "collaboration", {"timeout_ms": 60000}),
    ("codex-lite-subagent-first", "exec", "functions", js(SUB)),  # its agent_message task
    ("codex-standard-first", "spawn_agent", "multi_agent_v1",
     {"fork_context": False, "message": DELEGATED}),
    ("opencode-subagent-first", "bash", None, {"command": SUB}),
    ("qwen-code-first", "agent", None,
     {"description": "Run a delegated command", "prompt": DELEGATED,
      "run_in_background": False}),
]


@pytest.mark.parametrize(("name", "tool", "namespace", "arguments"), CALLS)
def test_the_next_step_is_a_call_of_the_clis_own_tool(name, tool, namespace, arguments):
    s = summary_of(name)
    step = agent.decide(s.api, s.body)
    assert isinstance(step, agent.Call)
    assert (step.tool.name, step.tool.namespace) == (tool, namespace)
    if isinstance(arguments, str):
        assert step.tool.custom and step.arguments == arguments
    else:
        assert json.loads(step.arguments) == arguments


def test_a_required_sub_agent_type_is_always_given():
    s = summary_of("opencode-first")
    step = agent.decide(s.api, s.body)
    assert isinstance(step, agent.Call) and step.tool.name == "task"
    arguments = json.loads(step.arguments)
    assert set(step.tool.schema["required"]) <= set(arguments)
    assert arguments["prompt"] == DELEGATED and arguments["subagent_type"]


@pytest.mark.parametrize(("name", "quotes"), [
    ("claude-code-first", 0),  # a plain task: no step, nothing to quote
    ("claude-code-after-subagent", 1),  # the sub-agent's report
    ("qwen-code-after-subagent", 1),
])
def test_with_no_step_left_the_answer_quotes_the_results(name, quotes):
    s = summary_of(name)
    step = agent.decide(s.api, s.body)
    assert isinstance(step, agent.Answer) and len(step.quotes) == quotes


def test_a_request_without_a_known_tool_is_not_played():
    s = summary_of("opencode-title")
    assert agent.decide(s.api, s.body) is None
    body = {"model": "m", "messages": [{"role": "user", "content": "[[run: ls]]"}],
            "tools": [{"type": "function", "function": {"name": "run_tests"}}]}
    assert agent.decide(Api.CHAT, body) is None


def shell_body(*tail):
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}},
        "required": ["command"]}}}]
    return {"model": "m", "tools": tools, "messages": [
        {"role": "user", "content": "Do [[run: echo a]] then [[run: echo b]]"}, *tail]}


def call(i):
    return {"role": "assistant", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}


def test_steps_follow_the_directives_in_order_and_a_new_task_starts_over():
    first = agent.decide(Api.CHAT, shell_body())
    second = agent.decide(Api.CHAT, shell_body(call(1), {"role": "tool", "tool_call_id": "c1",
                                                         "content": "a"}))
    done = agent.decide(Api.CHAT, shell_body(
        call(1), {"role": "tool", "tool_call_id": "c1", "content": "a"},
        call(2), {"role": "tool", "tool_call_id": "c2", "content": "b\n"}))
    assert [json.loads(s.arguments)["command"] for s in (first, second)
            if isinstance(s, agent.Call)] == ["echo a", "echo b"]
    assert done == agent.Answer(("a", "b"))
    again = agent.decide(Api.CHAT, shell_body(
        call(1), {"role": "tool", "tool_call_id": "c1", "content": "a"},
        call(2), {"role": "tool", "tool_call_id": "c2", "content": "b"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "and [[run: echo c]]"}))
    assert isinstance(again, agent.Call) and json.loads(again.arguments) == {"command": "echo c"}
