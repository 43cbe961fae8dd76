from __future__ import annotations

import orjson
import pytest

from extproc.apis.request import fingerprint, parse_request
from extproc.errors import BodyTooLarge, MalformedRequest, MissingModel
from extproc.types import Api


def parse(api: Api, body: object, limit: int = 1 << 20):
    return parse_request(api, orjson.dumps(body), max_body_bytes=limit)


def test_chat_newest_tool_results_only():
    body = {
        "model": "auto",
        "tools": [{"type": "function", "function": {"name": "grep"}}],
        "messages": [
            {"role": "user", "content": "find it"},
            {"role": "assistant", "tool_calls": [{"id": "old", "function": {"name": "grep"}}]},
            {"role": "tool", "tool_call_id": "old", "content": "x"},
            {"role": "user", "content": "now fix it"},
            {"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a"},
            {"role": "tool", "tool_call_id": "c2", "content": "b"},
        ],
    }
    s = parse(Api.CHAT, body)
    assert s.tool_result_ids == ("c1", "c2")
    assert s.tool_call_ids == ("old", "c1", "c2")
    assert s.tools_offered == ("grep",)
    assert s.latest_text == "a\nb"  # the newest turn is the tool output
    assert s.message_count == 7
    assert not s.has_provider_state


def test_latest_text_is_the_users_message_without_tool_results():
    body = {"model": "auto", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "first"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
    ]}
    assert parse(Api.CHAT, body).latest_text == "second"


def test_chat_answered_history_is_not_an_open_loop():
    body = {
        "model": "auto",
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a"},
            {"role": "user", "content": "continue"},
        ],
    }
    assert parse(Api.CHAT, body).tool_result_ids == ()


def test_responses_provider_state_and_outputs():
    body = {
        "model": "auto",
        "previous_response_id": "resp_1",
        "input": [
            {"type": "reasoning", "encrypted_content": "blob"},
            {"type": "function_call", "call_id": "fc1", "name": "run"},
            {"type": "function_call_output", "call_id": "fc1", "output": "ok"},
        ],
        "stream": True,
    }
    s = parse(Api.RESPONSES, body)
    assert s.previous_response_id == "resp_1"
    assert s.provider_state == (fingerprint("reasoning", "blob"),)
    assert s.tool_result_ids == ("fc1",)
    assert s.stream and s.has_provider_state


def test_responses_string_input():
    s = parse(Api.RESPONSES, {"model": "auto", "input": "hello there"})
    assert s.latest_text == "hello there"
    assert s.message_count == 1


def test_anthropic_tool_result_and_signed_thinking():
    body = {
        "model": "auto",
        "system": "you are terse",
        "messages": [
            {"role": "user", "content": "debug this"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "...", "signature": "sig"},
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
        ],
    }
    s = parse(Api.MESSAGES, body)
    assert s.tool_result_ids == ("toolu_1",)
    assert s.provider_state == (fingerprint("thinking", "sig"),)
    assert s.latest_text == ""  # the newest turn is a tool result without text


def test_context_estimate_grows_with_text():
    small = parse(Api.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]})
    big = parse(Api.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 4000}]})
    # The raw body at 4 characters per token, JSON punctuation included.
    assert small.context_tokens == (400 + 53) // 4
    assert big.context_tokens == (4000 + 53) // 4


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"{not json", MalformedRequest),
        (b"[1, 2]", MalformedRequest),
        (b'{"messages": []}', MissingModel),
        (b'{"model": "auto", "messages": "hi"}', MalformedRequest),
        (b'{"model": "auto", "messages": [1]}', MalformedRequest),
    ],
)
def test_bad_bodies(raw: bytes, error: type[Exception]):
    with pytest.raises(error):
        parse_request(Api.CHAT, raw, max_body_bytes=1 << 20)


def test_oversized_body_is_413():
    with pytest.raises(BodyTooLarge) as info:
        parse_request(Api.CHAT, b"x" * 101, max_body_bytes=100)
    assert info.value.status == 413
