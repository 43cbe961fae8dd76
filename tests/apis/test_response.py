from __future__ import annotations

import orjson

from extproc.apis.request import fingerprint
from extproc.apis.response import ResponseObserver
from extproc.types import Api


def sse(*events: dict, done: bool = True) -> bytes:
    out = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def feed_in_pieces(observer: ResponseObserver, data: bytes, size: int = 7) -> None:
    """Chunk boundaries fall anywhere, mid-line included, as they do through Envoy."""
    for i in range(0, len(data), size):
        observer.feed(data[i : i + size])
    observer.feed(b"", end=True)


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
    assert (s.usage.prompt_tokens, s.usage.cached_tokens) == (100, 64)
    assert s.model == "m1"


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
    assert s.usage.cached_tokens == 4


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
    assert (s.usage.prompt_tokens, s.usage.cached_tokens, s.usage.completion_tokens) == (55, 50, 9)


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
