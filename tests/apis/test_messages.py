from __future__ import annotations

import orjson

from extproc.apis import ResponseObserver, fingerprint, render_entries
from extproc.types import Api
from tests.apis.bodies import feed_in_pieces, parse


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
    assert s.tool_results == 1
    assert s.provider_state == (fingerprint("thinking", "sig"),)
    assert s.latest_text == ""  # the newest turn is a tool result without text


def test_anthropic_results_beside_text_and_before_another_user_message():
    body = {"model": "auto", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}},
            {"type": "tool_use", "id": "t2", "name": "bash", "input": {"cmd": "pwd"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"},
            {"type": "text", "text": "<system-reminder>"}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t2",
             "content": [{"type": "text", "text": "/src"}]}]},
    ]}
    s = parse(Api.MESSAGES, body)
    assert (s.tool_result_ids, s.tool_results) == (("t1", "t2"), 2)
    assert s.latest_text == "<system-reminder>\na.py\n/src"


def test_metadata_user_id_is_the_session_hint():
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"user_id": "user_abc_account_1_session_42"}}
    s = parse(Api.MESSAGES, body)
    assert (s.session_hint, s.session_hint_source) == (
        "user_abc_account_1_session_42", "metadata.user_id")
    for metadata in ({"user_id": ""}, {"user_id": 42}, {"user_id": ["x"]}, "user", None, {}):
        s = parse(Api.MESSAGES, {**body, "metadata": metadata})
        assert (s.session_hint, s.session_hint_source) == (None, None)


def test_anthropic_conversation_is_the_system_prompt_and_first_user_turn():
    system = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "x"}}]
    opening = {"model": "auto", "system": system, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "refactor the parser"}]}]}
    grown = {**opening, "messages": [
        *opening["messages"],
        {"role": "assistant", "content": [{"type": "text", "text": "on it"}]},
        {"role": "user", "content": "and the tests"},
    ]}
    assert parse(Api.MESSAGES, opening).conversation == parse(Api.MESSAGES, grown).conversation
    assert parse(Api.MESSAGES, opening).conversation != parse(
        Api.MESSAGES, {**opening, "system": "You are someone else."}).conversation


def test_anthropic_rendering():
    text = render_entries(Api.MESSAGES, [
        {"role": "assistant", "content": [
            {"type": "text", "text": "look"},
            {"type": "tool_use", "id": "t1", "name": "bash", "input": {"b": 1, "a": 2}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
    ])
    assert text == (
        '<|assistant|>\nlook\n<|assistant|>\ncall bash {"a":2,"b":1}\n'
        "<|user|>\nresult t1\nok\n"
    )


def test_anthropic_stream_signature_and_usage():
    lines = b""
    for event in (
        {"type": "message_start", "message": {"id": "msg_1", "model": "m3", "usage": {
            "input_tokens": 5, "cache_read_input_tokens": 50, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "signature_delta", "signature": "sig-1"}},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 9}},
    ):
        lines += b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
    observer = ResponseObserver(Api.MESSAGES, streaming=True)
    feed_in_pieces(observer, lines, size=13)
    s = observer.summary
    assert s.tool_call_ids == ["toolu_1"]
    assert s.provider_state == [fingerprint("thinking", "sig-1")]
    assert s.finish_reason == "tool_use"
    assert s.usage is not None
    assert (s.usage.prompt_tokens, s.usage.cached_tokens, s.usage.completion_tokens) == (55, 50, 9)


def test_anthropic_message_stop_ends_the_answer():
    observer = ResponseObserver(Api.MESSAGES, streaming=True)
    observer.feed(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert observer.done


def test_anthropic_whole_document_with_odd_ids():
    doc = {"model": "m3", "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": {"x": 1}, "name": "bash"},
        {"type": "tool_use", "id": "toolu_ok", "name": "bash"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "thinking", "signature": ["sig"]},
        7,
    ], "usage": {"input_tokens": 3, "output_tokens": 2, "cache_creation_input_tokens": 10}}
    observer = ResponseObserver(Api.MESSAGES, streaming=False)
    observer.feed(orjson.dumps(doc), end=True)
    s = observer.summary
    assert (s.model, s.finish_reason, s.tool_call_ids) == ("m3", "tool_use", ["toolu_ok"])
    assert s.tool_names == ["bash", "bash"]
    assert s.provider_state == [fingerprint("thinking", "opaque")]
    assert s.usage is not None and (s.usage.prompt_tokens, s.usage.cached_tokens) == (13, 0)
