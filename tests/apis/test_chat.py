from __future__ import annotations

import orjson

from extproc.apis import ResponseObserver, answer_mark, render_entries
from extproc.types import Api
from tests.apis.bodies import feed_in_pieces, parse, sse


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
    assert s.tool_results == 2
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


def test_latest_text_of_a_body_ending_with_the_model_is_the_last_user_message():
    body = {"model": "auto", "messages": [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "answer"},
    ]}
    assert parse(Api.CHAT, body).latest_text == "question"


def test_chat_answered_history_is_not_an_open_loop():
    body = {
        "model": "auto",
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "continue"},
        ],
    }
    s = parse(Api.CHAT, body)
    assert (s.tool_result_ids, s.tool_results) == ((), 0)
    assert not s.pending_tool_results


def test_chat_results_stay_pending_beside_a_users_reminder():
    """The 352 tool-loop switches in 2,048 requests: harnesses add a user message (system
    reminders) after the tool output, and the results were taken as answered."""
    body = {
        "model": "auto",
        "messages": [
            {"role": "user", "content": "fix the test"},
            {"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "out 1"},
            {"role": "tool", "tool_call_id": "c2", "content": "out 2"},
            {"role": "user", "content": "<system-reminder>todo list</system-reminder>"},
        ],
    }
    s = parse(Api.CHAT, body)
    assert s.tool_result_ids == ("c1", "c2")
    assert s.tool_results == 2
    assert s.latest_text == "out 1\nout 2\n<system-reminder>todo list</system-reminder>"


def test_latest_text_is_capped_to_its_tail():
    body = {"model": "auto", "messages": [
        {"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a" * 10_000},
        {"role": "tool", "tool_call_id": "c2", "content": "b" * 3_000},
    ]}
    latest = parse(Api.CHAT, body).latest_text
    assert latest == "a" * (4096 - 3001) + "\n" + "b" * 3000


def test_chat_conversation_is_the_opening_and_survives_growth():
    opening = [
        {"role": "system", "content": "you are an agent"},
        {"role": "user", "content": "build it"},
    ]
    first = parse(Api.CHAT, {"model": "auto", "messages": opening})
    later = parse(Api.CHAT, {"model": "auto", "messages": [
        *opening,
        {"role": "assistant", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "now test it"},
    ]})
    other = parse(Api.CHAT, {"model": "auto", "messages": [opening[0], {
        "role": "user", "content": "build something else"}]})
    other_system = parse(Api.CHAT, {"model": "auto", "messages": [
        {"role": "system", "content": "you are terse"}, opening[1]]})
    assert first.conversation is not None
    assert first.conversation == later.conversation
    assert len({first.conversation, other.conversation, other_system.conversation}) == 3


def test_chat_without_a_user_turn_has_no_conversation():
    body = {"model": "auto", "messages": [{"role": "system", "content": "hi"}]}
    assert parse(Api.CHAT, body).conversation is None


def test_chat_rendering_keeps_calls_and_results():
    function = {"name": "ls", "arguments": '{"b":1,"a":2}'}
    call = {"id": "c1", "type": "function", "function": function}
    text = render_entries(Api.CHAT, [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
    ])
    assert text == '<|assistant|>\ncall ls {"a":2,"b":1}\n<|tool|>\nx\n<|tool|>\nresult c1\n'


def test_chat_stream_tool_calls_and_usage():
    data = sse(
        {"model": "m1", "choices": [{"delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "grep", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                                  "prompt_tokens_details": {"cached_tokens": 64}}},
    )
    observer = ResponseObserver(Api.CHAT, streaming=True)
    feed_in_pieces(observer, data)
    s = observer.summary
    assert s.tool_call_ids == ["call_1"]
    assert s.tool_names == ["grep"]
    assert s.finish_reason == "tool_calls"
    assert s.usage is not None
    assert (s.usage.prompt_tokens, s.usage.cached_tokens) == (100, 64)
    assert s.model == "m1"


def test_chat_whole_document():
    doc = {"model": "m1", "choices": [{"finish_reason": "tool_calls", "message": {
        "tool_calls": [{"id": "call_9", "function": {"name": "ls"}}]}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
    observer = ResponseObserver(Api.CHAT, streaming=False)
    feed_in_pieces(observer, orjson.dumps(doc))
    s = observer.summary
    assert (s.model, s.tool_call_ids, s.tool_names, s.finish_reason) == (
        "m1", ["call_9"], ["ls"], "tool_calls")
    assert s.usage is not None and s.usage.prompt_tokens == 7


def test_chat_answer_ids_of_odd_types_are_ignored():
    """Only non-empty strings are ids: a list or an object would be unhashable downstream."""
    calls = [{"id": bad, "function": {"name": ["x"]}} for bad in ([1], {"a": 1}, 7, None, "")]
    doc = {"model": ["m"], "choices": [{"message": {"tool_calls": [*calls, {"id": "ok"}]},
                                         "finish_reason": {"x": 1}}],
           "usage": {"prompt_tokens": "12", "completion_tokens": -3}}
    observer = ResponseObserver(Api.CHAT, streaming=False)
    observer.feed(orjson.dumps(doc), end=True)
    s = observer.summary
    assert (s.model, s.tool_call_ids, s.tool_names, s.finish_reason) == (None, ["ok"], [], None)
    assert s.usage is not None and (s.usage.prompt_tokens, s.usage.completion_tokens) == (0, 0)


def test_a_streamed_answers_text_is_marked_as_the_history_resends_it():
    """The mark of an answer's text (what a history holding no id chains by) is the same
    whether it streamed in pieces or comes back whole in a later request, trimmed."""
    data = sse({"choices": [{"delta": {"role": "assistant", "content": "Hello"}}]},
               {"choices": [{"delta": {"content": " there.\n"}}]},
               {"choices": [{"delta": {}, "finish_reason": "stop"}]})
    observer = ResponseObserver(Api.CHAT, streaming=True)
    feed_in_pieces(observer, data)
    resent = parse(Api.CHAT, {"model": "m", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello there."},
        {"role": "user", "content": "and?"}]})
    assert observer.summary.text == "Hello there.\n"
    assert resent.answer_mark == answer_mark(observer.summary.text) is not None
    assert resent.trail == resent.answer_mark
    called = parse(Api.CHAT, {"model": "m", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello there."},
        *[{"role": "assistant", "tool_calls": [{"id": "call_1"}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]]})
    assert called.trail == "call_1"  # an id the answer issued comes first
    assert answer_mark("  ") is None
