"""Where pending tool results and provider-state references can appear, over the three APIs.

Pending = every tool result after the model's last turn, whatever the client added beside or
after it; ``tool_results`` counts them, ids or not. Only non-empty strings are ids.
"""

from __future__ import annotations

from typing import Any

import pytest

from extproc.apis import fingerprint
from extproc.types import Api
from tests.apis.bodies import parse

BAD_IDS = ([1], {"id": "x"}, 7, None, "")

# -- Chat Completions ---------------------------------------------------------------------------


def user(text: str = "go") -> dict[str, Any]:
    return {"role": "user", "content": text}


def calls(*ids: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": i, "type": "function", "function": {"name": "f"}} for i in ids]}


def tool(call_id: Any, text: str = "out") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def said(text: str = "done", **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


CHAT = {
    "trailing results": ([user(), calls("c1", "c2"), tool("c1"), tool("c2")], ("c1", "c2"), 2),
    "results then a user reminder": (
        [user(), calls("c1", "c2"), tool("c1"), tool("c2"), user("<reminder>")], ("c1", "c2"), 2),
    "results then system and user": (
        [calls("c1"), tool("c1"), {"role": "system", "content": "note"}, user()], ("c1",), 1),
    "answered by a later assistant turn": (
        [user(), calls("c1"), tool("c1"), said(), user("next")], (), 0),
    "older results do not count": (
        [calls("old"), tool("old"), said(), calls("c1"), tool("c1")], ("c1",), 1),
    "results without an assistant turn": ([user(), tool("t1")], ("t1",), 1),
    "a result without an id": ([calls("c1"), {"role": "tool", "content": "x"}], (), 1),
    "ids of odd types": ([calls("c1"), *(tool(bad) for bad in BAD_IDS)], (), len(BAD_IDS)),
    "legacy function result": ([said(None), {"role": "function", "name": "f", "content": "x"}],
                               (), 1),
    "a prefix prefill does not answer": (
        [calls("c1"), tool("c1"), said("Here", prefix=True)], ("c1",), 1),
    "a plain final assistant answers": ([calls("c1"), tool("c1"), said("Here")], (), 0),
    "calls not yet answered": ([user(), calls("c1")], (), 0),
}


@pytest.mark.parametrize("case", sorted(CHAT))
def test_chat_pending_results(case: str):
    messages, ids, count = CHAT[case]
    s = parse(Api.CHAT, {"model": "auto", "messages": messages})
    assert (s.tool_result_ids, s.tool_results) == (ids, count)


def test_chat_continue_final_message_makes_the_last_assistant_a_prefill():
    messages = [calls("c1"), tool("c1"), said("Here")]
    s = parse(Api.CHAT, {"model": "auto", "messages": messages, "continue_final_message": True})
    assert (s.tool_result_ids, s.tool_results) == (("c1",), 1)


def test_chat_call_ids_of_odd_types_are_not_owned():
    s = parse(Api.CHAT, {"model": "auto", "messages": [calls(*BAD_IDS, "ok"), user()]})
    assert s.tool_call_ids == ("ok",)


# -- Anthropic Messages ------------------------------------------------------------------------


def uses(*ids: Any, signature: Any = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if signature is not None:
        blocks.append({"type": "thinking", "thinking": "hm", "signature": signature})
    blocks += [{"type": "tool_use", "id": i, "name": "bash", "input": {}} for i in ids]
    return {"role": "assistant", "content": blocks}


def results(*ids: Any, text: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": i, "content": "out"} for i in ids]
    if text is not None:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


def reply(text: str = "done") -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


MESSAGES = {
    "results": ([user(), uses("t1"), results("t1")], ("t1",), 1),
    "results beside text": ([user(), uses("t1", "t2"), results("t1", "t2", text="<r>")],
                            ("t1", "t2"), 2),
    "results then another user message": ([user(), uses("t1"), results("t1"), user("more")],
                                          ("t1",), 1),
    "results over two user messages": ([uses("t1", "t2"), results("t1"), results("t2")],
                                       ("t1", "t2"), 2),
    "answered by a later assistant turn": ([uses("t1"), results("t1"), reply(), user()], (), 0),
    "a final assistant message is a prefill": ([uses("t1"), results("t1"), reply("Let")],
                                               ("t1",), 1),
    "a result without an id": ([uses("t1"), {"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}], (), 1),
    "ids of odd types": ([uses("t1"), results(*BAD_IDS)], (), len(BAD_IDS)),
    "string content carries no results": ([uses("t1"), user("plain")], (), 0),
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_messages_pending_results(case: str):
    messages, ids, count = MESSAGES[case]
    s = parse(Api.MESSAGES, {"model": "auto", "messages": messages})
    assert (s.tool_result_ids, s.tool_results) == (ids, count)


# -- Responses ---------------------------------------------------------------------------------


def call(call_id: Any, kind: str = "function_call") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "name": "f", "arguments": "{}"}


def output(call_id: Any, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": "out"}


def message(role: str, text: str = "hi") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


RESPONSES = {
    "outputs": ([message("user"), call("fc1"), output("fc1")], ("fc1",), 1),
    "outputs then a user message": ([call("fc1"), output("fc1"), message("user")], ("fc1",), 1),
    "custom and computer outputs": (
        [call("ct1", "custom_tool_call"), output("ct1", "custom_tool_call_output"),
         output("cc1", "computer_call_output")], ("ct1", "cc1"), 2),
    "answered by an assistant message": (
        [call("fc1"), output("fc1"), message("assistant"), message("user")], (), 0),
    "answered by a later call": ([call("fc1"), output("fc1"), call("fc2")], (), 0),
    "reasoning is the model's turn": (
        [call("fc1"), output("fc1"), {"type": "reasoning", "summary": []}], (), 0),
    "a chained request of outputs only": ([output("fc1"), output("fc2")], ("fc1", "fc2"), 2),
    "an output without an id": ([call("fc1"), {"type": "function_call_output", "output": "x"}],
                                (), 1),
    "ids of odd types": ([call("fc1"), *(output(bad) for bad in BAD_IDS)], (), len(BAD_IDS)),
}


@pytest.mark.parametrize("case", sorted(RESPONSES))
def test_responses_pending_results(case: str):
    items, ids, count = RESPONSES[case]
    s = parse(Api.RESPONSES, {"model": "auto", "input": items})
    assert (s.tool_result_ids, s.tool_results) == (ids, count)


# -- provider state ----------------------------------------------------------------------------

ENTRIES = {
    Api.CHAT: ("messages", [user()]),
    Api.RESPONSES: ("input", [message("user")]),
    Api.MESSAGES: ("messages", [user()]),
    Api.COMPLETIONS: ("prompt", "hi"),
}


@pytest.mark.parametrize("api", list(Api))
@pytest.mark.parametrize(("value", "expected"), [
    ("resp_1", "resp_1"), ("", None), (7, None), (["resp_1"], None), ({"id": "r"}, None),
    (None, None),
])
def test_previous_response_id_wherever_the_body_carries_it(api: Api, value: Any, expected: Any):
    """Clients of other routers send it in Chat and Messages bodies too; a completion
    carries no provider state, whatever its body holds."""
    key, entries = ENTRIES[api]
    if api is Api.COMPLETIONS:
        expected = None
    s = parse(api, {"model": "auto", key: entries, "previous_response_id": value})
    assert s.previous_response_id == expected
    assert s.has_provider_state is (expected is not None)
    assert s.provider_state == ()


STATE = {
    "encrypted reasoning": (Api.RESPONSES, "input", [
        {"type": "reasoning", "encrypted_content": "enc"}, message("user")],
        (fingerprint("reasoning", "enc"),)),
    "reasoning without a blob": (Api.RESPONSES, "input", [
        {"type": "reasoning", "encrypted_content": ["enc"]}, message("user")], ()),
    "signed thinking": (Api.MESSAGES, "messages", [user(), uses("t1", signature="sig"),
                                                  results("t1")],
                        (fingerprint("thinking", "sig"),)),
    "redacted thinking": (Api.MESSAGES, "messages", [
        user(), {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "d"}]},
        user()], (fingerprint("thinking", "d"),)),
    "a signature of an odd type": (Api.MESSAGES, "messages", [uses("t1", signature={"s": 1}),
                                                             results("t1")], ()),
    "thinking in a user message is not the model's": (Api.MESSAGES, "messages", [{
        "role": "user", "content": [{"type": "thinking", "signature": "sig"}]}], ()),
}


@pytest.mark.parametrize("case", sorted(STATE))
def test_provider_state_items(case: str):
    api, key, entries, expected = STATE[case]
    s = parse(api, {"model": "auto", key: entries})
    assert s.provider_state == expected
    assert s.previous_response_id is None
