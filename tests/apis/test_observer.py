"""The framing every API shares: whole documents, SSE lines cut anywhere, terminal events."""

from __future__ import annotations

import pytest

from extproc.apis import ResponseObserver
from extproc.apis.observer import MAX_BUFFERED_BODY
from extproc.types import Api
from tests.apis.bodies import nested, sse


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
