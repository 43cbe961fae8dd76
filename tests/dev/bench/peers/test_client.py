"""The client against an in-process simulator: sessions grow as an agent's do, the first
token is timed, the engine's counters and the usage are read."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from extproc.dev.bench.peers.backends import kv_tokens, prefix_counters
from extproc.dev.bench.peers.client import (
    Observed,
    Tally,
    Target,
    added_latency,
    cached_tokens,
    call,
    closed_loop,
    run_workload,
    tiny,
)
from extproc.dev.bench.peers.workloads import Shape, TraceShape, build
from extproc.dev.sim.server import SIMULATOR, SimConfig, build_app

VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 800.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1024.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny"} 1.7e9
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",num_gpu_blocks="2048"} 1.0
"""


def test_counters_are_read_as_vllm_names_them():
    assert prefix_counters(VLLM_METRICS) == (1024.0, 2000.0)
    assert kv_tokens(VLLM_METRICS) == 2048 * 128
    assert kv_tokens("") is None


async def test_a_workload_runs_as_an_agent_would():
    app = build_app(SimConfig(port=0, time_scale=0.0, output_tokens=16))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    target = Target(f"http://127.0.0.1:{port}", "qwen3-8b")
    try:
        shape = Shape(sessions=2, turns=3, ramp_s=0.0, delay_s=(0.0, 0.0), answer_tokens=8,
                      subagent_share=1.0, subagent_turns=2)
        workload = build("agents", shape=shape, trace=TraceShape(), seed="c", kv_tokens=10**6)
        tally, wall = await run_workload(workload, target)
        assert tally.errors == {}
        assert tally.requests == workload.requests() == 2 * 3 + 2 * 2
        assert len(tally.ttfts_s) == tally.requests and wall > 0
        assert tally.output_tokens == 8 * tally.requests
        sim = app[SIMULATOR]
        text = sim.metrics.render().decode()
        hits, queries = prefix_counters(text)
        assert kv_tokens(text) == SimConfig().num_gpu_blocks * SimConfig().block_size
        assert queries > 0 and hits / queries > 0.5  # every turn resends the one before
        added, failed = await added_latency(target, target, pairs=10, warmup=1)
        assert failed == 0 and abs(added) < 20  # the same server both ways
        ok, failed, elapsed = await closed_loop(target, 4, 0.2)
        assert ok > 0 and failed == 0 and elapsed >= 0.2
    finally:
        await runner.cleanup()
        await asyncio.sleep(0)


def test_cached_tokens_are_read_from_the_usage_details():
    assert cached_tokens({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 8}}) == 8
    assert cached_tokens({"prompt_tokens": 10, "prompt_tokens_details": None}) is None
    assert cached_tokens({"prompt_tokens": 10}) is None


async def test_an_answer_saar_routed_is_noted_with_its_worker_and_cached_tokens():
    """The replay id and worker from saar's response headers, the cached tokens from the
    stream's usage chunk; an answer without a replay id is not noted; the target's own
    headers go with every request."""
    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("x-pin"))
        headers = {"content-type": "text/event-stream"}
        if request.headers.get("x-session-id") != "plain":
            headers.update({"x-replay-id": "r-1", "x-saar-worker": "127.0.0.1:8001"})
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')
        await response.write(b'data: {"choices": [], "usage": {"prompt_tokens": 300, '
                             b'"completion_tokens": 1, "prompt_tokens_details": '
                             b'{"cached_tokens": 256}}}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    target = Target(f"http://127.0.0.1:{port}", "auto", headers=(("x-pin", "7"),))
    try:
        tally = Tally()
        async with aiohttp.ClientSession() as http:
            assert await call(http, target, tiny(target), {"x-session-id": "s"}, tally) == "hi"
            assert await call(http, target, tiny(target), {"x-session-id": "plain"}, tally)
        assert tally.observed == [Observed("r-1", "127.0.0.1:8001", 256)]
        assert tally.output_tokens == 2 and seen == ["7", "7"]
    finally:
        await runner.cleanup()
