"""The simulator's legacy Completions and stored responses, driven by the official SDK as vLLM
is (issue 29): the shapes vLLM answers with, the usage asked for, the prefix cache across a
prompt that resends the answer, and a stored response on the instance that answered it only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest

from .conftest import RunningSim, StartSim

MODEL = "qwen3-8b"
LONG_PROMPT = " ".join(f"fact{i}" for i in range(200))


@pytest.fixture
async def oai(sim: RunningSim) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=sim.openai_url, api_key="x", max_retries=0) as client:
        yield client


async def test_a_completion_is_a_text_completion_with_usage(oai: openai.AsyncOpenAI) -> None:
    raw = await oai.completions.with_raw_response.create(model=MODEL, prompt="Once upon a time")
    completion = raw.parse()
    assert raw.headers["x-sim-instance"] == "simA"
    assert completion.object == "text_completion" and completion.model == MODEL
    assert completion.id.startswith("cmpl-")
    (choice,) = completion.choices
    assert (choice.index, choice.logprobs, choice.finish_reason) == (0, None, "stop")
    assert len(choice.text.split()) == 16
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 16 and completion.usage.prompt_tokens == 4


async def test_max_tokens_echo_and_one_choice_per_prompt(oai: openai.AsyncOpenAI) -> None:
    completion = await oai.completions.create(model=MODEL, prompt=["def f(", "class A("],
                                              max_tokens=3, echo=True)
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.choices[0].text.startswith("def f(")
    assert completion.choices[1].text.startswith("class A(")
    assert {c.finish_reason for c in completion.choices} == {"length"}
    assert completion.usage is not None and completion.usage.completion_tokens == 3


@pytest.mark.parametrize("include_usage", [True, False])
async def test_a_streamed_completion(oai: openai.AsyncOpenAI, include_usage: bool) -> None:
    stream = await oai.completions.create(
        model=MODEL, prompt=[101, 7592, 2088], stream=True,
        stream_options={"include_usage": include_usage})
    text, finish, usage, kinds = "", None, None, set()
    async for chunk in stream:
        kinds.add(chunk.object)
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert kinds == {"text_completion"}
    assert finish == "stop" and len(text.split()) == 16
    assert (usage is not None) is include_usage
    if usage is not None:
        assert usage.completion_tokens == 16 and usage.prompt_tokens == 3


async def test_a_prompt_that_resends_the_answer_finds_it_cached(oai: openai.AsyncOpenAI) -> None:
    first = await oai.completions.create(model=MODEL, prompt=LONG_PROMPT)
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = await oai.completions.create(
        model=MODEL, prompt=LONG_PROMPT + first.choices[0].text + " and then")
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The prompt and the answer were cached (as vLLM caches generated blocks); the tail block
    # is recomputed.
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 16
    assert cached < second.usage.prompt_tokens


async def test_a_prompt_of_no_shape_is_a_400(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="prompt"):
        await oai.completions.create(model=MODEL, prompt=[1, "a"])  # type: ignore[list-item]


async def test_a_stored_response_lives_on_the_instance_that_answered_it(
    start_sim: StartSim, oai: openai.AsyncOpenAI
) -> None:
    response = await oai.responses.create(model=MODEL, input="hello there")
    stored = await oai.responses.retrieve(response.id)
    assert (stored.id, stored.status, stored.output_text) == (
        response.id, "completed", response.output_text)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        await oai.responses.cancel(response.id)
    unstored = await oai.responses.create(model=MODEL, input="hello", store=False)
    other = await start_sim(instance_id="simB")
    async with openai.AsyncOpenAI(base_url=other.openai_url, api_key="x",
                                  max_retries=0) as elsewhere:
        for client, response_id in ((elsewhere, response.id), (oai, unstored.id)):
            with pytest.raises(openai.NotFoundError, match="not found"):
                await client.responses.retrieve(response_id)
            with pytest.raises(openai.NotFoundError):
                await client.responses.cancel(response_id)
