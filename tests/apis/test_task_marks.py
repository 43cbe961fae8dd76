"""A tool call's task text, marked like an id the call issued, and a first request that opens
with that text: the two marks meet whatever the API, whole or streamed (``apis.task_mark``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extproc.apis import ResponseObserver, task_mark
from extproc.apis.common import ARGUMENTS_KEPT
from extproc.types import Api
from tests.apis.bodies import feed_in_pieces, parse, sse

TASK = "Run this and report its output: [[run: echo sub-5]]"
ARGUMENTS = orjson.dumps({"description": "Run a delegated command", "prompt": TASK,
                          "subagent_type": "general-purpose"}).decode()
HALVES = (ARGUMENTS[:20], ARGUMENTS[20:])


def chat_whole() -> dict[str, Any]:
    return {"choices": [{"message": {"tool_calls": [
        {"id": "c0", "function": {"name": "run_shell_command", "arguments": '{"command":"ls"}'}},
        {"id": "c1", "function": {"name": "agent", "arguments": ARGUMENTS}}]},
        "finish_reason": "tool_calls"}]}


def chat_stream() -> bytes:
    def delta(call: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [{"delta": {"tool_calls": [call]}}]}
    return sse(delta({"index": 0, "id": "c0", "function": {"name": "run_shell_command",
                                                            "arguments": '{"command":"ls"}'}}),
               delta({"index": 1, "id": "c1", "function": {"name": "agent", "arguments": ""}}),
               *(delta({"index": 1, "function": {"arguments": half}}) for half in HALVES))


def messages_whole() -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "Delegating."},
                        {"type": "tool_use", "id": "t1", "name": "Agent",
                         "input": orjson.loads(ARGUMENTS)}], "stop_reason": "tool_use"}


def messages_stream() -> bytes:
    return sse(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": "t1", "name": "Agent", "input": {}}},
        *({"type": "content_block_delta", "index": 1,
           "delta": {"type": "input_json_delta", "partial_json": half}} for half in HALVES),
        {"type": "message_stop"}, done=False)


def responses_whole() -> dict[str, Any]:
    return {"id": "resp_1", "output": [
        {"type": "reasoning", "id": "rs_1"},
        {"type": "function_call", "call_id": "fc1", "name": "spawn_agent",
         "arguments": ARGUMENTS}]}


def responses_stream() -> bytes:
    item = responses_whole()["output"][1]
    return sse({"type": "response.output_item.done", "output_index": 1, "item": item},
               {"type": "response.completed", "response": {"id": "resp_1", "output": []}},
               done=False)


def first_request(api: Api) -> dict[str, Any]:
    """A sub-agent's first request: its own system prompt, reminders, then its task."""
    parts = [{"type": "input_text" if api is Api.RESPONSES else "text", "text": t}
             for t in ("<system-reminder>Today is Thursday.</system-reminder>", TASK)]
    if api is Api.RESPONSES:
        return {"model": "m", "instructions": "You are a subagent.",
                "input": [{"type": "message", "role": "user", "content": parts}]}
    if api is Api.MESSAGES:
        return {"model": "m", "max_tokens": 10, "system": "You are a subagent.",
                "messages": [{"role": "user", "content": parts}]}
    return {"model": "m", "messages": [{"role": "system", "content": "You are a subagent."},
                                       {"role": "user", "content": parts}]}


@pytest.mark.parametrize("api, whole, stream", [
    (Api.CHAT, chat_whole, chat_stream),
    (Api.MESSAGES, messages_whole, messages_stream),
    (Api.RESPONSES, responses_whole, responses_stream),
])
def test_the_spawn_calls_task_meets_the_sub_agents_first_request(api, whole, stream):
    observed = []
    for streaming, data in ((False, orjson.dumps(whole())), (True, stream())):
        observer = ResponseObserver(api, streaming=streaming)
        feed_in_pieces(observer, data)
        observed.append({task_mark(a) for a in observer.summary.arguments.values() if a})
    opening = parse(api, first_request(api))
    assert observed[0] == observed[1]
    assert task_mark(ARGUMENTS) in observed[0]
    assert opening.task_marks == (task_mark(ARGUMENTS),)


@pytest.mark.parametrize("arguments, marked", [
    (ARGUMENTS, TASK),                                   # the longest string argument
    ('{"command": "ls -la"}', None),                     # too short to name a task
    ("const r = await tools.exec_command({cmd: 'ls'});", # a free-form tool's whole input
     "const r = await tools.exec_command({cmd: 'ls'});"),
    ('{"n": 3, "flags": ["a long list of words here"]}', None),  # no top-level string
    (f'  {{"prompt": "  {TASK}  "}}', TASK),             # trimmed
])
def test_a_calls_task_text(arguments, marked):
    """The text marked is the one a first user message carrying it is looked up by."""
    expected = parse(Api.CHAT, {"model": "m", "messages": [
        {"role": "user", "content": marked}]}).task_marks[0] if marked else None
    assert task_mark(arguments) == expected


def test_only_a_first_request_carries_task_marks():
    answered = parse(Api.CHAT, {"model": "m", "messages": [
        {"role": "user", "content": TASK}, {"role": "assistant", "content": "done"},
        {"role": "user", "content": "and now?"}]})
    reminder_only = parse(Api.CHAT, {"model": "m", "messages": [
        {"role": "user", "content": "<system-reminder>" + TASK + "</system-reminder>"}]})
    assert answered.task_marks == () and reminder_only.task_marks == ()


def test_arguments_past_the_cap_mark_nothing():
    observer = ResponseObserver(Api.CHAT, streaming=True)
    long = "x" * ARGUMENTS_KEPT
    feed_in_pieces(observer, sse(
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c", "function": {
            "name": "write_file", "arguments": '{"content": "'}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
            "arguments": long + '"}'}}]}}]}), size=4096)
    assert observer.summary.tool_call_ids == ["c"]
    assert observer.summary.arguments == {0: None}
