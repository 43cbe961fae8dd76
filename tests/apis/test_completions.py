"""OpenAI's legacy Completions (issue 29): the prompt's shapes, a body with no tool or provider
state, the prompt rendered bare, and the answer's usage and finish reason, whole or streamed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extproc.apis import ResponseObserver, prompt_blocks, render_prompt
from extproc.core.identity import IdentityReader
from extproc.errors import MalformedRequest
from extproc.types import Api, Usage
from tests.apis.bodies import feed_in_pieces, parse, sse


@pytest.mark.parametrize(("prompt", "entries", "latest"), [
    ("Once upon a time", 1, "Once upon a time"),
    ("", 1, ""),
    (["def f():", "class A:"], 2, "def f():\nclass A:"),
    ([101, 7592, 2088], 1, ""),
    ([[101, 7592], [2088]], 2, ""),
    (["text", [5, 6]], 2, "text"),
])
def test_every_prompt_shape_openai_and_vllm_take(prompt: Any, entries: int, latest: str):
    s = parse(Api.COMPLETIONS, {"model": "auto", "prompt": prompt})
    assert s.api is Api.COMPLETIONS and s.model == "auto"
    assert (s.message_count, s.latest_text) == (entries, latest)


@pytest.mark.parametrize("prompt", [None, [], 7, {"text": "x"}, [1, "a"], [[]], [None],
                                    [1.5, 2], [True, 2]])
def test_a_prompt_of_no_shape_is_malformed(prompt: Any):
    body = {"model": "auto"} if prompt is None else {"model": "auto", "prompt": prompt}
    with pytest.raises(MalformedRequest, match='"prompt"'):
        parse(Api.COMPLETIONS, body)


def test_a_completion_carries_no_tool_or_provider_state():
    """Whatever else its body holds (fields of other APIs, or of other routers' clients)."""
    s = parse(Api.COMPLETIONS, {
        "model": "auto", "prompt": "refactor the parser", "stream": True,
        "tools": [{"type": "function", "function": {"name": "grep"}}],
        "functions": [{"name": "grep"}], "previous_response_id": "resp_1",
        "messages": [{"role": "assistant", "tool_calls": [{"id": "c1"}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "x"}],
    })
    assert s.stream
    assert (s.tools_offered, s.tool_call_ids, s.tool_result_ids, s.tool_results) == ((), (), (), 0)
    assert s.previous_response_id is None and not s.has_provider_state
    assert not s.may_issue  # its answer issues no id: nothing to claim
    assert s.trail is None and s.conversation is None and not s.opening


def test_the_session_is_the_one_the_headers_name_or_none():
    reader = IdentityReader()
    s = parse(Api.COMPLETIONS, {"model": "auto", "prompt": "hello there"})
    named = reader.read({"x-session-id": "s1", "authorization": "Bearer k"}, s)
    assert named.session_id == "s1"
    nameless = reader.read({"authorization": "Bearer k"}, s)
    assert nameless.session_id is None and not nameless.opens  # no session opened per call


def test_the_prompt_renders_bare_and_the_next_prompt_extends_it():
    """No template wraps a completion's prompt: a client that sends the prompt with the answer
    appended shares every block of the first prompt, as the engine's prefix cache does."""
    first = "The parser reads a token stream and builds a tree. " * 8
    s = parse(Api.COMPLETIONS, {"model": "auto", "prompt": first})
    assert render_prompt(s) == first
    then = parse(Api.COMPLETIONS, {"model": "auto", "prompt": first + " It also recovers."})
    blocks = prompt_blocks("m", render_prompt(s), 16)
    assert len(blocks) == len(first) // 16
    assert prompt_blocks("m", render_prompt(then), 16)[: len(blocks)] == blocks


def test_token_ids_render_so_a_longer_prompt_extends_a_shorter_one():
    short = render_prompt(parse(Api.COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}))
    longer = render_prompt(parse(Api.COMPLETIONS, {"model": "m", "prompt": [1, 2, 34]}))
    assert short == "1 2 3 " and not longer.startswith(short)
    assert render_prompt(parse(Api.COMPLETIONS, {"model": "m", "prompt": [1, 2, 3, 4]})
                         ).startswith(short)


DOCUMENT = {
    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "qwen3-8b",
    "choices": [{"index": 0, "text": " there", "logprobs": None, "finish_reason": "length",
                 "stop_reason": None}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28,
              "prompt_tokens_details": {"cached_tokens": 8}},
}


def test_a_whole_answer_gives_its_usage_and_finish_reason():
    observer = ResponseObserver(Api.COMPLETIONS, streaming=False)
    feed_in_pieces(observer, orjson.dumps(DOCUMENT))
    summary = observer.summary
    assert observer.done
    assert (summary.model, summary.finish_reason) == ("qwen3-8b", "length")
    assert summary.usage == Usage(12, 16, 8)
    assert summary.tool_call_ids == [] and summary.response_id is None


def chunk(text: str, finish: str | None = None, index: int = 0, **extra: Any) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "qwen3-8b",
            "choices": [{"index": index, "text": text, "logprobs": None,
                         "finish_reason": finish}], **extra}


@pytest.mark.parametrize(("events", "finish", "usage"), [
    ([chunk("Hi"), chunk(" there", "stop")], "stop", None),
    ([chunk("Hi", usage=None), chunk(" there", "length", usage=None),
      {**chunk(""), "choices": [], "usage": DOCUMENT["usage"]}], "length", Usage(12, 16, 8)),
    ([chunk("a", index=0), chunk("b", index=1), chunk("", "stop", index=1),
      chunk("", "length", index=0)], "length", None),
])
def test_a_stream_gives_its_finish_reason_and_the_usage_asked_for(events, finish, usage):
    observer = ResponseObserver(Api.COMPLETIONS, streaming=True)
    feed_in_pieces(observer, sse(*events))
    summary = observer.summary
    assert observer.done
    assert (summary.model, summary.finish_reason, summary.usage) == ("qwen3-8b", finish, usage)


def test_the_stream_ends_at_done_even_without_the_bodys_end():
    observer = ResponseObserver(Api.COMPLETIONS, streaming=True)
    observer.feed(sse(chunk("Hi", "stop")))
    assert observer.done and observer.summary.finish_reason == "stop"
