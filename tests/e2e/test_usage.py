"""Issue 29 end to end: usage and finish reason in the replay record for every answer, through
Envoy and the processor, against simulated workers that answer at once (a fast upstream is
where the record used to lose them), with the official ``openai`` SDK.

A JSON answer's record is read the moment the client has the answer, without polling: the
processor records what the answer carried as its body passes, before Envoy sends it on. A
streamed answer is observed off the request path (observability mode), so its record is
polled for; without ``stream_options.include_usage`` the engine sends no usage and the client's
stream stays exactly as it asked for it, so the record holds the router's estimate, marked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from extproc.apis import CHARS_PER_TOKEN
from extproc.dev.harness import Stack, run_stack
from tests.e2e.conftest import e2e_config, get_json, replay_outcome

pytestmark = pytest.mark.e2e
MODEL = "qwen3-8b"
ANSWERS = 20
TOOLS: Any = [{"type": "function", "function": {
    "name": "read", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def fast(tmp_path_factory) -> Iterator[Stack]:
    with run_stack(e2e_config(), workdir=tmp_path_factory.mktemp("fast"),
                   sim_args=["--time-scale", "0"]) as running:
        yield running


def client(url: str, session: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="key-usage", max_retries=0,
                  default_headers={"x-session-id": session})


def test_every_fast_json_answer_has_its_usage_and_finish_in_the_record_at_once(fast):
    """Every other request offers a tool: an answer that may carry ids and one that cannot
    (whose body the processor once let pass unread) are both recorded before the client has
    them."""
    openai = client(fast.url, "usage-json")
    missing = []
    for turn in range(ANSWERS):
        raw = openai.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"question {turn}"}],
            **({"tools": TOOLS} if turn % 2 else {}))
        completion = raw.parse()
        assert completion.usage is not None
        # Read at once, no polling: the record must hold the answer's usage already.
        outcome = get_json(f"{fast.processor_http}/v1/replay/{raw.headers['x-replay-id']}"
                           ).get("outcome") or {}
        expected = {"prompt_tokens": completion.usage.prompt_tokens,
                    "completion_tokens": completion.usage.completion_tokens,
                    "source": "engine"}
        usage = outcome.get("usage") or {}
        if {k: usage.get(k) for k in expected} != expected or outcome.get(
                "finish_reason") != completion.choices[0].finish_reason:
            missing.append((turn, outcome))
    assert missing == []


def _shape(chunks: list[Any]) -> list[tuple[Any, ...]]:
    """What a client reads of a stream, without its ids and times."""
    return [(tuple((c.delta.role, c.delta.content, c.finish_reason) for c in chunk.choices),
             chunk.usage is not None) for chunk in chunks]


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_stream_is_left_as_the_client_asked_and_its_usage_recorded(fast, include_usage):
    body: dict[str, Any] = {"model": MODEL, "stream": True,
                            "messages": [{"role": "user", "content": "stream a summary"}]}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    # The same request straight to the worker: what the client gets without the router.
    direct = list(client(fast.sims[MODEL][0], "usage-direct").chat.completions.create(**body))
    for turn in range(5):
        session = f"usage-stream-{include_usage}-{turn}"
        with client(fast.url, session).chat.completions.with_streaming_response.create(
                **body) as response:
            chunks = list(response.parse())
            replay_id = response.headers["x-replay-id"]
        assert _shape(chunks) == _shape(direct)
        assert any(c.usage is not None for c in chunks) is include_usage
        record = replay_outcome(fast, replay_id, until=("usage", "finish_reason"))
        outcome = record["outcome"]
        assert outcome["finish_reason"] == "stop"
        usage = outcome["usage"]
        if include_usage:
            reported = chunks[-1].usage
            assert reported.prompt_tokens_details is not None
            assert usage == {"prompt_tokens": reported.prompt_tokens,
                             "completion_tokens": reported.completion_tokens,
                             "cached_tokens": reported.prompt_tokens_details.cached_tokens,
                             "source": "engine"}
        else:
            text = "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
            assert usage == {"prompt_tokens": record["request"]["context_tokens"],
                             "completion_tokens": -(-len(text) // CHARS_PER_TOKEN),
                             "cached_tokens": None, "source": "estimated"}
