from __future__ import annotations

import orjson

from extproc.apis import ResponseObserver, fingerprint, render_entries
from extproc.types import Api
from tests.apis.bodies import feed_in_pieces, parse, sse


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
    assert s.tool_call_ids == ("fc1",)
    assert s.stream and s.has_provider_state


def test_responses_string_input():
    s = parse(Api.RESPONSES, {"model": "auto", "input": "hello there"})
    assert s.latest_text == "hello there"
    assert s.message_count == 1


def test_responses_outputs_stay_pending_whatever_follows():
    body = {"model": "auto", "input": [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "fc1", "name": "run"},
        {"type": "function_call_output", "call_id": "fc1", "output": "ran"},
        {"type": "custom_tool_call_output", "call_id": "ct1", "output": "patched"},
        {"role": "user", "content": [{"type": "input_text", "text": "and then?"}]},
    ]}
    s = parse(Api.RESPONSES, body)
    assert (s.tool_result_ids, s.tool_results) == (("fc1", "ct1"), 2)
    assert s.latest_text == "ran\npatched\nand then?"


def test_prompt_cache_key_is_the_session_hint():
    s = parse(Api.RESPONSES, {"model": "auto", "input": "hi", "prompt_cache_key": " conv-1 "})
    assert (s.session_hint, s.session_hint_source) == ("conv-1", "prompt_cache_key")
    for odd in ("", "   ", 7, ["conv"], None):
        s = parse(Api.RESPONSES, {"model": "auto", "input": "hi", "prompt_cache_key": odd})
        assert (s.session_hint, s.session_hint_source) == (None, None)


def test_responses_conversation_is_instructions_and_first_user_turn():
    opening = {"model": "auto", "instructions": "you are codex", "input": [
        {"type": "message", "role": "developer", "content": "sandbox: read-only"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix"}]},
    ]}
    grown = {**opening, "input": [
        *opening["input"],
        {"type": "function_call", "call_id": "fc1", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "fc1", "output": "ok"},
    ]}
    first, later = parse(Api.RESPONSES, opening), parse(Api.RESPONSES, grown)
    assert first.conversation is not None and first.conversation == later.conversation
    other = parse(Api.RESPONSES, {**opening, "instructions": "you are someone else"})
    assert other.conversation != first.conversation


def test_a_chained_request_has_no_conversation_of_its_own():
    """With ``previous_response_id`` the input is only the new turn: its opening is at the
    provider, so fingerprinting it would name a new conversation every turn."""
    s = parse(Api.RESPONSES, {"model": "auto", "previous_response_id": "resp_1", "input": "go on"})
    assert s.conversation is None
    assert s.previous_response_id == "resp_1"


def test_responses_rendering():
    text = render_entries(Api.RESPONSES, [
        {"type": "function_call", "call_id": "fc1", "name": "run", "arguments": '{"b":1,"a":2}'},
        {"type": "function_call_output", "call_id": "fc1", "output": "ok"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
    ])
    assert text == (
        '<|assistant|>\ncall run {"a":2,"b":1}\n<|tool|>\nresult fc1\nok\n<|reasoning|>\nthink\n'
    )


def test_responses_whole_document():
    doc = {
        "id": "resp_9", "model": "m2", "status": "completed",
        "output": [
            {"type": "reasoning", "encrypted_content": "enc"},
            {"type": "function_call", "call_id": "fc_1", "name": "run"},
        ],
        "usage": {"input_tokens": 10, "output_tokens": 2,
                  "input_tokens_details": {"cached_tokens": 4}},
    }
    observer = ResponseObserver(Api.RESPONSES, streaming=False)
    feed_in_pieces(observer, orjson.dumps(doc))
    s = observer.summary
    assert s.response_id == "resp_9"
    assert s.tool_call_ids == ["fc_1"]
    assert s.provider_state == [fingerprint("reasoning", "enc")]
    assert s.usage is not None and s.usage.cached_tokens == 4


def test_responses_stream_counts_items_once():
    response = {"id": "resp_2", "output": [{"type": "function_call", "call_id": "fc", "name": "x"}],
                "status": "completed", "usage": {"input_tokens": 3, "output_tokens": 1}}
    data = sse(
        {"type": "response.created", "response": {"id": "resp_2"}},
        {"type": "response.output_item.done", "item": response["output"][0]},
        {"type": "response.completed", "response": response},
        done=False,
    )
    observer = ResponseObserver(Api.RESPONSES, streaming=True)
    feed_in_pieces(observer, data)
    assert observer.summary.response_id == "resp_2"
    assert observer.summary.tool_call_ids == ["fc"]
    assert observer.done


def test_responses_answer_ids_of_odd_types_are_ignored():
    doc = {"id": ["resp"], "status": 3, "output": [
        {"type": "function_call", "call_id": {"x": 1}, "name": "run"},
        {"type": "function_call", "call_id": "fc_ok", "name": 5},
        {"type": "reasoning", "encrypted_content": ["blob"]},
        "not an item",
    ], "usage": {"input_tokens": 1.5, "input_tokens_details": []}}
    observer = ResponseObserver(Api.RESPONSES, streaming=False)
    observer.feed(orjson.dumps(doc), end=True)
    s = observer.summary
    assert (s.response_id, s.finish_reason, s.provider_state) == (None, None, [])
    assert (s.tool_call_ids, s.tool_names) == (["fc_ok"], ["run"])
