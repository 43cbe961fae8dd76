"""Issue 29 end to end, through the real Envoy with the official SDK: legacy ``/v1/completions``
is routed (the logical model resolved and rewritten, the worker picked from the prompt's
prefix) and its answer observed, whole or streamed, into the replay record; an operation on a
stored response reaches the worker that answered it, in the caller's tenant only."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from extproc.dev.harness import Stack, run_stack
from tests.e2e.conftest import e2e_config, replay_outcome

pytestmark = pytest.mark.e2e
HARD = "Please refactor the storage layer:\n"
DOCUMENTS = 5
"""Interleaved documents, an odd number: round robin cannot keep one on a worker by chance."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    config = e2e_config()
    config["scheduling"] = {"scrape_interval_seconds": 0.05}
    with run_stack(config, workers_per_model=2,
                   workdir=tmp_path_factory.mktemp("completions")) as running:
        yield running


def client(stack: Stack, key: str = "key-completions", **headers: str) -> OpenAI:
    return OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0,
                  default_headers=headers)


def test_a_completion_is_routed_and_its_outcome_recorded(stack):
    raw = client(stack, **{"x-session-id": "legacy-1"}).completions.with_raw_response.create(
        model="auto", prompt=HARD, max_tokens=4)
    completion = raw.parse()
    assert completion.object == "text_completion"
    assert completion.model == "qwen3-32b"  # the sim answers 404 to any model but its own
    assert raw.headers["x-saar-selected-model"] == "qwen3-32b"
    assert raw.headers["x-sim-instance"].startswith("qwen3-32b-")
    assert completion.choices[0].finish_reason == "length"
    record = replay_outcome(stack, raw.headers["x-replay-id"], until=("usage",))
    assert record["request"]["api"] == "openai_completions"
    assert record["session"]["id"] == "legacy-1"
    assert record["worker"]["picked"] == raw.headers["x-saar-worker"]
    outcome = record["outcome"]
    assert outcome["status"] == 200 and outcome["finish_reason"] == "length"
    assert completion.usage is not None
    assert outcome["usage"]["prompt_tokens"] == completion.usage.prompt_tokens
    assert outcome["usage"]["completion_tokens"] == completion.usage.completion_tokens == 4
    assert outcome["usage"]["source"] == "engine"


@pytest.mark.parametrize("include_usage", [True, False])
def test_a_streamed_completion_is_routed_and_its_outcome_recorded(stack, include_usage):
    with client(stack).completions.with_streaming_response.create(
        model="auto", prompt=HARD, stream=True,
        stream_options={"include_usage": include_usage},
    ) as response:
        assert response.headers["x-saar-selected-model"] == "qwen3-32b"
        chunks = list(response.parse())
        replay_id = response.headers["x-replay-id"]
    assert {c.model for c in chunks} == {"qwen3-32b"}
    assert "".join(choice.text for c in chunks for choice in c.choices)
    finish = [choice.finish_reason for c in chunks for choice in c.choices if choice.finish_reason]
    assert finish == ["stop"]
    record = replay_outcome(stack, replay_id, until=("usage",))
    assert record["request"]["api"] == "openai_completions" and record["request"]["stream"]
    assert record["session"]["id"] is None  # no session header: none is opened
    outcome = record["outcome"]
    assert outcome["status"] == 200 and outcome["finish_reason"] == "stop"
    if include_usage:
        usage = chunks[-1].usage
        assert usage is not None and not chunks[-1].choices
        assert outcome["usage"]["prompt_tokens"] == usage.prompt_tokens
        assert outcome["usage"]["completion_tokens"] == usage.completion_tokens
        assert outcome["usage"]["source"] == "engine"


def test_the_worker_is_picked_from_the_prompts_prefix(stack):
    """Documents continued by resending the prompt with the answer appended, with no session
    header: each stays on the worker that holds its prefix, and that worker finds it cached."""
    oai = client(stack)
    prompts = [f"Document {i}. " + " ".join(f"w{i}x{j}" for j in range(400))
               for i in range(DOCUMENTS)]
    picks: list[set[str]] = [set() for _ in range(DOCUMENTS)]
    cached: list[int] = []
    for turn in range(3):
        for i in range(DOCUMENTS):
            raw = oai.completions.with_raw_response.create(model="qwen3-8b", prompt=prompts[i])
            prompts[i] += raw.parse().choices[0].text + f" Then step {turn}."
            picks[i].add(raw.headers["x-saar-worker"])
            if turn:
                cached.append(int(raw.headers["x-sim-cached-tokens"]))
    assert all(len(p) == 1 for p in picks), picks  # each document on one worker
    assert len(set().union(*picks)) == 2  # documents spread over both workers
    assert min(cached) > 400  # the prompt and the answer found cached on the worker


def test_a_stored_response_is_served_by_its_issuer(stack):
    oai = client(stack, **{"x-session-id": "stored-1"})
    raw = oai.responses.with_raw_response.create(model="auto", input=HARD)
    response = raw.parse()
    issuer = raw.headers["x-sim-instance"]
    assert issuer.startswith("qwen3-32b-")
    for _ in range(4):  # any other worker, or the default cluster, answers 404
        got = oai.responses.with_raw_response.retrieve(response.id)
        assert got.parse().id == response.id
        assert got.headers["x-sim-instance"] == issuer
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        oai.responses.cancel(response.id)  # the issuer's own answer, not a stranger's 404
    with pytest.raises(openai.NotFoundError):  # another tenant's caller learns nothing
        client(stack, key="key-stranger").responses.retrieve(response.id)
