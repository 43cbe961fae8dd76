"""The simulator driven by the official SDKs, as agents and the router's tests will drive it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from extproc.apis import ResponseObserver
from extproc.dev.sim.oracle import VIOLATION_KINDS
from extproc.types import Api, RequestSummary

from .conftest import RunningSim, StartSim

MODEL = "qwen3-8b"
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}},
]
RESPONSES_TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
ANTHROPIC_TOOLS = [{"name": "read_file", "input_schema": {"type": "object"}}]
THINKING = {"type": "enabled", "budget_tokens": 1024}
LONG_CONTEXT = " ".join(f"fact{i}" for i in range(200))


@pytest.fixture
async def oai(sim: RunningSim) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=sim.openai_url, api_key="x", max_retries=0) as client:
        yield client


@pytest.fixture
async def claude(sim: RunningSim) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=sim.url, api_key="x", max_retries=0) as client:
        yield client


async def metrics(http: aiohttp.ClientSession, sim: RunningSim) -> dict[tuple[str, Any], float]:
    """Samples of /metrics keyed by (sample name, sorted label items)."""
    async with http.get(f"{sim.url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def violations(samples: dict[tuple[str, Any], float], kind: str) -> float:
    return samples[("saar_sim_continuity_violations_total", (("kind", kind),))]


async def state(http: aiohttp.ClientSession, sim: RunningSim) -> dict[str, Any]:
    async with http.get(f"{sim.url}/admin/state") as resp:
        return await resp.json()


# -- Chat Completions ------------------------------------------------------------------------


async def test_chat_text_reply_reports_usage_and_headers(oai: openai.AsyncOpenAI) -> None:
    raw = await oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}]
    )
    completion = raw.parse()
    assert raw.headers["x-sim-instance"] == "simA"
    assert raw.headers["x-sim-model"] == MODEL
    assert raw.headers["x-sim-continuity-violations"] == "0"
    assert completion.model == MODEL
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 16
    assert completion.usage.prompt_tokens > 0


async def test_chat_text_is_deterministic_per_model_and_prompt(
    start_sim: StartSim, oai: openai.AsyncOpenAI
) -> None:
    other = await start_sim(instance_id="simB")
    messages = [{"role": "user", "content": "same prompt"}]
    async with openai.AsyncOpenAI(base_url=other.openai_url, api_key="x") as second:
        a = await oai.chat.completions.create(model=MODEL, messages=messages)
        b = await second.chat.completions.create(model=MODEL, messages=messages)
    c = await oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content != c.choices[0].message.content
    assert a.id != b.id


async def test_chat_max_tokens_truncates_with_length(oai: openai.AsyncOpenAI) -> None:
    completion = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 3


async def test_chat_stream_with_usage(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert finish == "stop"
    assert len(text.split()) == 16
    assert usage is not None and usage.completion_tokens == 16
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0


async def test_chat_tool_loop_round_trip(oai: openai.AsyncOpenAI, sim: RunningSim) -> None:
    messages: list[Any] = [{"role": "user", "content": "read the readme"}]
    first = await oai.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "read_file"
    assert call.id.startswith("call_") and "simA" in call.id
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "# readme"},
    ]
    raw = await oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=CHAT_TOOLS
    )
    second = raw.parse()
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content
    assert raw.headers["x-sim-continuity-violations"] == "0"
    assert sim.sim.oracle.violations["tool_call"] == 0


async def test_chat_stream_tool_call_has_id_on_first_delta(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "go"}], tools=CHAT_TOOLS, stream=True
    )
    deltas, finish = [], None
    async for chunk in stream:
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert deltas[0].id is not None and deltas[0].function.name == "read_file"
    assert all(d.id is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert arguments.startswith('{"input":')


async def test_foreign_tool_result_counts_a_violation(
    oai: openai.AsyncOpenAI, sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    foreign = {"id": "call_elsewhere", "type": "function"}
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [{**foreign, "function": {"name": "x", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_elsewhere", "content": "out"},
    ]
    raw = await oai.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert raw.parse().choices[0].message.content  # still answered
    assert raw.headers["x-sim-continuity-violations"] == "1"
    samples = await metrics(http, sim)
    assert violations(samples, "tool_call") == 1
    assert violations(samples, "previous_response") == 0
    assert (await state(http, sim))["violations"]["tool_call"] == 1


async def test_chat_chains_its_own_answers_by_previous_response_id(
    start_sim: StartSim, oai: openai.AsyncOpenAI, sim: RunningSim
) -> None:
    """The Semantic Router's live benchmark sends a chat answer's id back as the next chat
    turn's ``previous_response_id``: its issuer accepts it, any other instance refuses it.
    The prompt stays the messages alone (vLLM ignores the field on Chat), so a chained turn
    costs what the same turn unchained costs."""
    first = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "start"}])
    assert first.id.startswith("chatcmpl-") and "simA" in first.id
    turn = [{"role": "user", "content": "continue"}]
    raw = await oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=turn, extra_body={"previous_response_id": first.id})
    second = raw.parse()
    assert raw.headers["x-sim-continuity-violations"] == "0"
    assert sim.sim.oracle.continued["previous_response"] == 1
    alone = await oai.chat.completions.create(model=MODEL, messages=turn)
    assert second.usage is not None and alone.usage is not None
    assert second.usage.prompt_tokens == alone.usage.prompt_tokens
    other = await start_sim(instance_id="simB")
    async with openai.AsyncOpenAI(base_url=other.openai_url, api_key="x",
                                  max_retries=0) as elsewhere:
        with pytest.raises(openai.BadRequestError) as caught:
            await elsewhere.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "continue"}],
                extra_body={"previous_response_id": second.id})
    assert caught.value.code == "previous_response_not_found"
    assert other.sim.oracle.violations["previous_response"] == 1


# -- Responses -------------------------------------------------------------------------------


async def test_responses_chain_and_foreign_previous_id(
    oai: openai.AsyncOpenAI, sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    first = await oai.responses.create(model=MODEL, input="start")
    assert first.id.startswith("resp_") and "simA" in first.id
    assert first.status == "completed" and first.output_text
    second = await oai.responses.create(
        model=MODEL, input="continue", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    # The chain resumes the stored conversation, so its prompt is longer than its own input.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.BadRequestError) as caught:
        await oai.responses.create(model=MODEL, input="x", previous_response_id="resp_nowhere")
    assert caught.value.code == "previous_response_not_found"
    assert caught.value.param == "previous_response_id"
    assert caught.value.response.headers["x-sim-continuity-violations"] == "1"
    assert violations(await metrics(http, sim), "previous_response") == 1


async def test_responses_stream_events(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.responses.create(model=MODEL, input="hello", stream=True)
    kinds, text, completed = [], "", None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            completed = event.response
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert "response.output_item.added" in kinds and "response.output_item.done" in kinds
    assert completed is not None and completed.output_text == text
    assert completed.usage.output_tokens == 16


async def test_responses_stream_helper_and_tool_call(oai: openai.AsyncOpenAI) -> None:
    async with oai.responses.stream(model=MODEL, input="go", tools=RESPONSES_TOOLS) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    call = final.output[0]
    assert call.type == "function_call" and call.name == "read_file"
    follow = await oai.responses.create(
        model=MODEL,
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}],
        tools=RESPONSES_TOOLS,
    )
    assert follow.output[-1].type == "message"


async def test_encrypted_reasoning_is_provider_state(
    start_sim: StartSim, oai: openai.AsyncOpenAI, sim: RunningSim
) -> None:
    include = ["reasoning.encrypted_content"]
    first = await oai.responses.create(model=MODEL, input="think", include=include, store=False)
    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    history = [
        {"role": "user", "content": "think"},
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"role": "user", "content": "more"},
    ]
    raw = await oai.responses.with_raw_response.create(model=MODEL, input=history, include=include)
    assert raw.headers["x-sim-continuity-violations"] == "0"
    other = await start_sim(instance_id="simB")
    async with openai.AsyncOpenAI(base_url=other.openai_url, api_key="x") as elsewhere:
        raw = await elsewhere.responses.with_raw_response.create(model=MODEL, input=history)
    assert raw.headers["x-sim-continuity-violations"] == "1"
    assert other.sim.oracle.violations["provider_state"] == 1


# -- Anthropic Messages ----------------------------------------------------------------------


async def test_messages_text_usage_and_cache(claude: anthropic.AsyncAnthropic) -> None:
    messages = [{"role": "user", "content": LONG_CONTEXT}]
    first = await claude.messages.create(model=MODEL, max_tokens=64, messages=messages)
    assert first.stop_reason == "end_turn"
    assert first.content[0].type == "text" and first.model == MODEL
    assert first.usage.cache_read_input_tokens == 0
    second = await claude.messages.create(model=MODEL, max_tokens=64, messages=messages)
    cached = second.usage.cache_read_input_tokens
    assert cached > 0 and cached % 16 == 0
    assert second.usage.input_tokens + cached == first.usage.input_tokens


async def test_messages_stream_thinking_and_tool_loop(
    start_sim: StartSim, claude: anthropic.AsyncAnthropic
) -> None:
    messages: list[Any] = [{"role": "user", "content": "list files"}]
    async with claude.messages.stream(
        model=MODEL, max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS, thinking=THINKING
    ) as stream:
        final = await stream.get_final_message()
    thinking, tool_use = final.content
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature
    assert tool_use.type == "tool_use" and tool_use.id.startswith("toolu_simA")
    assert tool_use.input == {"input": tool_use.input["input"]}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0
    result = {"type": "tool_result", "tool_use_id": tool_use.id, "content": "a.txt"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {"role": "user", "content": [result]},
    ]
    raw = await claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS, thinking=THINKING
    )
    answer = await raw.parse()
    assert answer.stop_reason == "end_turn" and answer.content[-1].type == "text"
    assert raw.headers["x-sim-continuity-violations"] == "0"
    # The same history on another instance: a foreign signature and a foreign tool call.
    other = await start_sim(instance_id="simB")
    async with anthropic.AsyncAnthropic(base_url=other.url, api_key="x") as elsewhere:
        raw = await elsewhere.messages.with_raw_response.create(
            model=MODEL, max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS
        )
    assert raw.headers["x-sim-continuity-violations"] == "2"
    assert other.sim.oracle.violations == {
        "previous_response": 0,
        "tool_call": 1,
        "provider_state": 1,
    }


async def test_messages_plain_stream_events(claude: anthropic.AsyncAnthropic) -> None:
    stream = await claude.messages.create(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    kinds = [event.type async for event in stream]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_delta") == 5
    assert kinds[-2] == "message_delta"


# -- model check, faults, cache, operations -------------------------------------------------


async def test_unknown_model_is_404_and_aliases_are_served(
    oai: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await oai.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["message"] == "The model `gpt-x` does not exist."
    assert caught.value.body["type"] == "NotFoundError"
    with pytest.raises(anthropic.NotFoundError):
        await claude.messages.create(
            model="gpt-x", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    aliased = await oai.chat.completions.create(
        model="alias-a", messages=[{"role": "user", "content": "x"}]
    )
    assert aliased.model == "alias-a"


async def test_malformed_bodies_use_the_routers_errors(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{sim.url}/v1/chat/completions", data=b"{nope") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "malformed_request"
    async with http.post(f"{sim.url}/v1/messages", json={"model": MODEL, "messages": []}) as resp:
        assert resp.status == 400
        assert (await resp.json())["type"] == "error"


async def test_fault_injection(
    start_sim: StartSim, oai: openai.AsyncOpenAI, sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{sim.url}/admin/faults", json={"fail_next": 2}) as resp:
        assert (await resp.json())["fail_next"] == 2
    messages = [{"role": "user", "content": "x"}]
    for _ in range(2):
        with pytest.raises(openai.InternalServerError) as caught:
            await oai.chat.completions.create(model=MODEL, messages=messages)
        assert caught.value.status_code == 503
        assert caught.value.body["type"] == "service_unavailable"
    assert (await oai.chat.completions.create(model=MODEL, messages=messages)).choices
    samples = await metrics(http, sim)
    assert samples[("saar_sim_injected_errors_total", ())] == 2
    flaky = await start_sim(instance_id="flaky", fail_every=3)
    statuses = []
    for _ in range(6):
        async with http.post(
            f"{flaky.url}/v1/chat/completions", json={"model": MODEL, "messages": messages}
        ) as resp:
            statuses.append(resp.status)
    assert statuses == [200, 200, 503, 200, 200, 503]


async def test_prefix_cache_reuses_the_previous_turn(oai: openai.AsyncOpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": LONG_CONTEXT}]
    first = await oai.chat.completions.create(model=MODEL, messages=messages)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "and then?"},
    ]
    raw = await oai.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    second = raw.parse()
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The previous prompt *and* the reply were cached; only the tail block is recomputed.
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 16
    assert cached < second.usage.prompt_tokens
    assert raw.headers["x-sim-cached-tokens"] == str(cached)


async def test_metrics_models_health_state_reset(
    oai: openai.AsyncOpenAI, sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    await oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    samples = await metrics(http, sim)
    model = (("model_name", MODEL),)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
    ):
        assert (name, model) in samples, name
    assert samples[("vllm:generation_tokens_total", model)] == 16
    success = (("finished_reason", "stop"), ("model_name", MODEL))
    assert samples[("vllm:request_success_total", success)] == 1
    config = (("block_size", "16"), ("enable_prefix_caching", "True"), ("num_cpu_blocks", "0"),
              ("num_gpu_blocks", "2048"))
    assert samples[("vllm:cache_config_info", config)] == 1
    assert all(violations(samples, kind) == 0 for kind in VIOLATION_KINDS)
    models = [m.id async for m in oai.models.list()]
    assert models == [MODEL, "alias-a"]
    async with http.get(f"{sim.url}/health") as resp:
        assert resp.status == 200
    before = await state(http, sim)
    assert before["instance"] == "simA" and before["requests"] == 1
    assert before["last_request_headers"]["content-type"] == "application/json"
    assert before["last_request_headers"]["authorization"] == "<redacted>"
    # The prompt alone fills no block; prompt plus the 16-token reply fills one.
    assert before["cache"] == {"blocks": 1, "capacity": 2048, "usage": 1 / 2048, "cpu_blocks": 0,
                               "cpu_capacity": 0}
    assert before["issued"] == {"tool_call": 0, "response": 1, "provider_state": 0}
    async with http.post(f"{sim.url}/admin/reset") as resp:
        after = await resp.json()
    assert after["requests"] == 0 and after["cache"]["blocks"] == 0
    assert after["last_request_headers"] == {}


async def test_max_num_seqs_queues_and_timing_follows_the_model(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    slow = await start_sim(
        instance_id="slow", max_num_seqs=1, time_scale=1.0, decode_tokens_per_s=200.0
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}

    async def one() -> float:
        started = time.monotonic()
        async with http.post(f"{slow.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
        return time.monotonic() - started

    tasks = [asyncio.create_task(one()) for _ in range(3)]
    await asyncio.sleep(0.03)
    queued = await state(http, slow)
    durations = sorted(await asyncio.gather(*tasks))
    assert queued["running"] == 1 and queued["waiting"] == 2
    # 16 tokens at 200 tok/s = 80 ms each, served one at a time.
    assert durations[0] >= 0.075 and durations[-1] >= 0.225


# -- the router's response observer reads every stream ---------------------------------------


STREAM_BODIES = {
    Api.CHAT: (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "go"}],
            "tools": CHAT_TOOLS,
            "stream_options": {"include_usage": True},
        },
    ),
    Api.RESPONSES: (
        "/v1/responses",
        {"input": "go", "tools": RESPONSES_TOOLS, "include": ["reasoning.encrypted_content"]},
    ),
    Api.MESSAGES: (
        "/v1/messages",
        {
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "go"}],
            "tools": ANTHROPIC_TOOLS,
            "thinking": THINKING,
        },
    ),
}


@pytest.mark.parametrize("api", list(STREAM_BODIES))
@pytest.mark.parametrize("stream", [True, False])
async def test_response_observer_recovers_ids_and_usage(
    api: Api, stream: bool, sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    path, body = STREAM_BODIES[api]
    payload = {**body, "model": MODEL, "stream": stream}
    observer = ResponseObserver(api, streaming=stream)
    async with http.post(f"{sim.url}{path}", json=payload) as resp:
        assert resp.status == 200
        async for chunk in resp.content.iter_chunked(64):
            observer.feed(chunk)
    observer.feed(b"", end=True)
    summary = observer.summary
    assert summary.model == MODEL
    assert len(summary.tool_call_ids) == 1 and "simA" in summary.tool_call_ids[0]
    assert summary.tool_names == ["read_file"]
    assert summary.usage is not None and summary.usage.completion_tokens > 0
    assert summary.usage.prompt_tokens > 0
    if api is Api.RESPONSES:
        assert summary.response_id is not None and summary.response_id.startswith("resp_simA")
    if api is Api.CHAT:
        assert summary.provider_state == []
    else:
        # The oracle recognises what the observer fingerprinted as its own provider state.
        assert len(summary.provider_state) == 1
        replay = RequestSummary(
            api, MODEL, False, 1, 0, provider_state=tuple(summary.provider_state)
        )
        assert sim.sim.oracle.judge(replay).violations == ()
        foreign = RequestSummary(api, MODEL, False, 1, 0, provider_state=("thinking:0",))
        assert sim.sim.oracle.judge(foreign).violations == ("provider_state",)


async def test_codex_lite_gets_a_namespaced_custom_call_it_can_answer(
    http: aiohttp.ClientSession, sim: RunningSim
) -> None:
    """Codex's default format (tools only in an ``additional_tools`` item): the answer is a
    ``custom_tool_call`` of its ``exec`` tool in its namespace, read back by the router's
    observer as owned, and answered without a violation; the request is recorded."""
    from tests.apis.test_recorded import recorded

    body = recorded("codex-lite-first")["body"]
    body["model"] = MODEL
    async with http.post(f"{sim.url}/v1/responses", json=body) as resp:
        assert resp.status == 200
        stream = await resp.read()
    observer = ResponseObserver(Api.RESPONSES, streaming=True)
    observer.feed(stream, end=True)
    events = [e for e in stream.decode().split("\n") if e.startswith("data: ")]
    assert any("response.custom_tool_call_input.delta" in e for e in events)
    (call_id,) = observer.summary.tool_call_ids
    assert observer.summary.tool_names == ["exec"]
    done = next(e for e in events if "response.completed" in e)
    item = next(i for i in json.loads(done[6:])["response"]["output"]
                if i["type"] == "custom_tool_call")
    assert (item["namespace"], item["call_id"]) == ("functions", call_id)
    assert "tools.exec_command" in item["input"]
    body["input"] += [item, {"type": "custom_tool_call_output", "call_id": call_id,
                             "output": [{"type": "input_text", "text": "ok"}]}]
    async with http.post(f"{sim.url}/v1/responses", json=body) as resp:
        assert resp.status == 200
        await resp.read()
    after = await state(http, sim)
    assert after["violations"]["tool_call"] == 0 and after["continued"]["tool_call"] == 1


async def test_requests_are_recorded_without_secrets(
    http: aiohttp.ClientSession, start_sim: StartSim, tmp_path
) -> None:
    running = await start_sim(record_dir=str(tmp_path))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{running.url}/v1/chat/completions?x=1", json=body,
                         headers={"authorization": "Bearer secret"}) as resp:
        assert resp.status == 200
    (written,) = tmp_path.glob("*.json")
    doc = json.loads(written.read_text())
    assert doc["path"] == "/v1/chat/completions?x=1"
    assert doc["headers"]["authorization"] == "<redacted>"
    assert json.loads(doc["body"]) == body
