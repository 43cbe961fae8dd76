"""The framing every API shares: whole documents, SSE lines cut anywhere, terminal events."""

from __future__ import annotations

import orjson
import pytest

from extproc.apis import ResponseObserver
from extproc.apis.observer import MAX_BUFFERED_BODY
from extproc.types import Api
from tests.apis.bodies import feed_in_pieces, nested, sse


def test_garbage_body_is_ignored_not_raised():
    observer = ResponseObserver(Api.CHAT, streaming=False)
    observer.feed(b"<html>bad gateway</html>", end=True)
    assert observer.done
    assert observer.summary.tool_call_ids == []


def test_terminal_event_completes_without_end_of_stream():
    observer = ResponseObserver(Api.CHAT, streaming=True)
    observer.feed(sse({"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]},
                      done=False))
    assert not observer.done
    observer.feed(b"data: [DONE]\n\n")
    assert observer.done


def test_an_oversized_document_is_dropped_not_buffered():
    observer = ResponseObserver(Api.CHAT, streaming=False)
    observer.feed(b'{"model": "m", "pad": "' + b"x" * MAX_BUFFERED_BODY)
    observer.feed(b'"}', end=True)
    assert observer.done and observer.summary.model is None


@pytest.mark.parametrize("api", list(Api))
@pytest.mark.parametrize("streaming", [False, True])
def test_deep_nesting_in_an_answer_never_raises(api: Api, streaming: bool):
    deep = nested(1000)
    fields = b"".join(b',"%s":%s' % (key, deep) for key in (
        b"response", b"message", b"delta", b"usage", b"choices", b"content", b"output"))
    events = [b'{"type":"%s"%s}' % (kind, fields) for kind in (
        b"message_start", b"message_delta", b"content_block_start", b"response.completed")]
    observer = ResponseObserver(api, streaming=streaming)
    data = b"".join(b"data: " + e + b"\n\n" for e in events) if streaming else events[-1]
    observer.feed(data, end=True)
    assert observer.done


@pytest.mark.parametrize("api", list(Api))
def test_events_of_every_json_type_never_raise(api: Api):
    observer = ResponseObserver(api, streaming=True)
    for payload in (b"1", b'"x"', b"[]", b"null", b"{", b'{"type": []}', b'{"choices": "x"}'):
        observer.feed(b"data: " + payload + b"\n")
    observer.feed(b"", end=True)
    assert observer.done


# What an answer tells of its usage, and what the router counts when it tells none: a Chat
# stream carries usage only when its client asked (``stream_options.include_usage``: a last
# chunk with no choices), so the characters generated are counted for the estimate.
REASONED = {"choices": [{"delta": {"reasoning_content": "think"}}]}
WORDS = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
         {"choices": [{"delta": {"content": "Hello"}}]},
         {"choices": [{"delta": {"content": " world"}, "finish_reason": "stop"}]}]
CALLED = {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {
    "name": "read", "arguments": '{"path": "a"}'}}]}, "finish_reason": "tool_calls"}]}
VLLM_USAGE = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": {
    "prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
    "prompt_tokens_details": {"cached_tokens": 32}}}
USAGE = {
    "a stream without include_usage: no usage, its finish, its characters": (
        Api.CHAT, True, sse(*WORDS), None, "stop", 11),
    "reasoning and tool calls' arguments count as generated": (
        Api.CHAT, True, sse(REASONED, CALLED), None, "tool_calls", 18),
    "a stream with include_usage: the last chunk has no choices, its usage is read": (
        Api.CHAT, True, sse(*WORDS, VLLM_USAGE), (40, 3, 32), "stop", 11),
    "a legacy completions stream without include_usage counts its text": (
        Api.COMPLETIONS, True, sse({"choices": [{"index": 0, "text": "Hello"}]},
                                   {"choices": [{"index": 0, "text": " world",
                                                 "finish_reason": "length"}]}),
        None, "length", 11),
    "a JSON answer": (
        Api.CHAT, False, orjson.dumps({"choices": [{"message": {"content": "Hello world"},
                                                    "finish_reason": "length"}],
                                       "usage": VLLM_USAGE["usage"]}),
        (40, 3, 32), "length", 11),
    "a Responses stream always carries usage, cached tokens in input_tokens_details": (
        Api.RESPONSES, True, sse({"type": "response.completed", "response": {
            "id": "r1", "status": "completed", "usage": {
                "input_tokens": 40, "output_tokens": 3,
                "input_tokens_details": {"cached_tokens": 32}}}}, done=False),
        (40, 3, 32), "completed", 0),
    "a Messages stream always carries usage, cached tokens as cache_read_input_tokens": (
        Api.MESSAGES, True, sse(
            {"type": "message_start", "message": {"usage": {
                "input_tokens": 8, "cache_read_input_tokens": 32, "output_tokens": 1}}},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": 3}},
            {"type": "message_stop"}, done=False),
        (40, 3, 32), "end_turn", 0),
}


@pytest.mark.parametrize("case", list(USAGE))
def test_what_an_answer_tells_of_its_usage(case):
    api, streaming, body, usage, finish, generated = USAGE[case]
    observer = ResponseObserver(api, streaming=streaming)
    feed_in_pieces(observer, body)
    summary = observer.summary
    got = summary.usage
    assert usage == (None if got is None else (
        got.prompt_tokens, got.completion_tokens, got.cached_tokens))
    assert summary.finish_reason == finish
    assert summary.output_chars == generated
