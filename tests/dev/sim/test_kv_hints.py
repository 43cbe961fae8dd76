"""The simulated server takes the router's KV hints: demote / prefetch / release / share act on
its host-memory tier, show in its KV events (medium GPU / CPU) and its ``/metrics``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from extproc.dev.sim.server import SIMULATOR, SimConfig, Simulator, build_app
from extproc.scheduling.kv_events import CPU, DEVICE, PreciseKVIndex
from extproc.scheduling.kv_hints import KvHint, encode_hints
from extproc.service.kv_subscriber import KVEventSubscriber
from tests.dev.sim.test_kv_publisher import chat, tokenizer_path  # noqa: F401 (a fixture)

WORKER = "sim-hints"


@pytest.fixture
async def hinted_sim(tokenizer_path: Path) -> AsyncIterator[tuple[str, Simulator]]:  # noqa: F811
    cfg = SimConfig(port=0, time_scale=0.0, block_size=4, num_gpu_blocks=64, num_cpu_blocks=64,
                    tokenizer=str(tokenizer_path), kv_events_endpoint="tcp://127.0.0.1:*")
    app = build_app(cfg)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", app[SIMULATOR]
    finally:
        await runner.cleanup()


async def settle(index: PreciseKVIndex, sim: Simulator) -> None:
    """Until the index has heard every batch the simulator published."""
    assert sim.kv_events is not None
    deadline = time.monotonic() + 5.0
    while index.last_seq(WORKER) != sim.kv_events._seq - 1:
        assert time.monotonic() < deadline, "KV events did not arrive"
        await asyncio.sleep(0.01)


async def test_demote_prefetch_and_release_move_a_session_between_tiers(
    hinted_sim: tuple[str, Simulator],
) -> None:
    url, sim = hinted_sim
    assert sim.kv_events is not None
    index = PreciseKVIndex(block_size=4)
    subscriber = KVEventSubscriber(index, WORKER, sim.kv_events.endpoint)
    subscriber.start()
    try:
        deadline = time.monotonic() + 5.0
        while index.last_seq(WORKER) is None:  # PUB/SUB joins asynchronously
            assert time.monotonic() < deadline, "no KV events received"
            sim.reset()
            await asyncio.sleep(0.02)
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0,
                                      default_headers={"x-session-id": "s1"}) as client:
            await client.chat.completions.create(**chat("question one asks about the parser"))
        await settle(index, sim)
        on_device = index.block_count(WORKER, DEVICE)
        assert on_device > 10 and index.block_count(WORKER, CPU) == 0

        async def send(*hints: KvHint) -> dict[str, int]:
            async with aiohttp.ClientSession() as http, http.post(
                    f"{url}/v1/kv/hints", data=encode_hints(hints)) as response:
                assert response.status == 200
                result: dict[str, int] = orjson.loads(await response.read())
            await settle(index, sim)
            return result

        assert await send(KvHint("demote", "s1", WORKER), KvHint("demote", "nobody", WORKER)) == {
            "applied": 1, "ignored": 1}
        assert (index.block_count(WORKER, DEVICE), index.block_count(WORKER, CPU)) == (
            0, on_device), "the session alone had these blocks: all moved"
        assert await send(KvHint("prefetch", "s1", WORKER)) == {"applied": 1, "ignored": 0}
        assert (index.block_count(WORKER, DEVICE), index.block_count(WORKER, CPU)) == (
            on_device, 0)
        await send(KvHint("demote", "s1", WORKER))
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0,
                                      default_headers={"x-session-id": "s1"}) as client:
            raw = await client.chat.completions.with_raw_response.create(
                **chat("question one asks about the parser"))
        assert int(raw.headers["x-sim-loaded-tokens"]) > 0, "its next turn hit host memory"
        await settle(index, sim)
        assert await send(KvHint("release", "s1", WORKER, prefix_tokens=8)) == {
            "applied": 1, "ignored": 0}
        assert index.block_count(WORKER) == 2, "only the two blocks to keep are left"
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/v1/kv/hints", data=b'{"hints": 3}') as response:
                assert response.status == 400
            async with http.get(f"{url}/metrics") as response:
                metrics = await response.text()
        assert 'saar_sim_kv_hints_total{kind="demote",outcome="applied"} 2.0' in metrics
        assert 'saar_sim_kv_hints_total{kind="demote",outcome="ignored"} 1.0' in metrics
        assert 'vllm:external_prefix_cache_hits_total{model_name="qwen3-8b"}' in metrics
        assert 'num_cpu_blocks="64"' in metrics
    finally:
        await subscriber.stop()
