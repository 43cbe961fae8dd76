"""The simulator on real token ids, publishing vLLM KV events that the router's precise index
follows exactly."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, trainers

from extproc.apis import parse_request, render_prompt
from extproc.dev.sim.config import SimConfig, add_arguments
from extproc.dev.sim.kv_publisher import KVEventPublisher
from extproc.dev.sim.prefix_cache import PrefixCache, block_hashes
from extproc.dev.sim.server import SIMULATOR, Simulator, build_app
from extproc.scheduling.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    PreciseKVIndex,
)
from extproc.scheduling.tokenizer import Tokenizer
from extproc.service.kv_subscriber import KVEventSubscriber
from extproc.types import Api

MODEL = "qwen3-8b"
WORKER = "sim-kv"
SENTENCES = [
    "you are a careful coding agent working in a large repository",
    "read the file then plan the edit and run the tests before you commit",
    "question one asks about the parser question two asks about the cache",
    "system user assistant tool",
]
SYSTEM = " ".join(SENTENCES[:2] * 6)
"""A long shared prefix: many full blocks at block size 4."""


@pytest.fixture
def tokenizer_path(tmp_path: Path) -> Path:
    """A word-level tokenizer trained here: no hub, no network."""
    tokenizer = HFTokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_tokenizer_encodes_with_the_local_file(tokenizer_path: Path, tmp_path: Path) -> None:
    tokenizer = Tokenizer(tokenizer_path)
    ids = tokenizer.encode("read the file zebra")
    assert len(ids) == 4 and ids == tokenizer.encode("read  the\nfile zebra")
    assert ids[3] == tokenizer.encode("[UNK]")[0] != ids[0]
    with pytest.raises(FileNotFoundError):
        Tokenizer(tmp_path / "missing.json")


def test_flags_and_validation(tokenizer_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--tokenizer", str(tokenizer_path), "--kv-events-endpoint", "tcp://127.0.0.1:5557"]
    )
    cfg = SimConfig.from_args(args)
    assert (cfg.tokenizer, cfg.kv_events_endpoint, cfg.kv_events_topic) == (
        str(tokenizer_path),
        "tcp://127.0.0.1:5557",
        "",  # vLLM's default topic
    )
    default = SimConfig.from_args(parser.parse_args([]))
    assert (default.tokenizer, default.kv_events_endpoint) == (None, None)
    with pytest.raises(ValueError, match="tokenizer"):
        SimConfig(kv_events_endpoint="tcp://127.0.0.1:5557")


def test_cache_changes_become_vllm_events() -> None:
    publisher = KVEventPublisher("tcp://127.0.0.1:*", block_size=2)
    published: list[list[KVEvent]] = []
    publisher.publish = lambda events: published.append(list(events))  # type: ignore[method-assign]
    try:
        cache = PrefixCache(block_size=2, num_gpu_blocks=4, listener=publisher)
        first = [1, 2, 3, 4, 5]
        h = block_hashes(first, 2)
        cache.lookup_and_insert(first)
        assert published.pop() == [
            BlockStored((h[0], h[1]), None, (1, 2, 3, 4), 2, None, "GPU"),
        ]
        cache.lookup_and_insert(first)  # nothing new: no batch
        assert published == []
        longer = [1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
        g = block_hashes(longer, 2)
        cache.lookup_and_insert(longer)  # 3 new blocks after 2 cached; capacity 4: LRU is the tail
        assert published.pop() == [
            BlockStored((g[2], g[3], g[4]), g[1], (6, 7, 8, 9, 10, 11), 2, None, "GPU"),
            BlockRemoved((g[4],), "GPU"),
        ]
        # Non-contiguous new blocks (a middle block was evicted): one event per run.
        publisher.changed(longer, g, {g[1], g[3], g[4]}, [])
        assert published.pop() == [
            BlockStored((g[1],), g[0], (3, 4), 2, None, "GPU"),
            BlockStored((g[3], g[4]), g[2], (8, 9, 10, 11), 2, None, "GPU"),
        ]
        cache.clear()
        assert published.pop() == [AllBlocksCleared()]
    finally:
        publisher.close()


@pytest.fixture
async def kv_sim(tokenizer_path: Path) -> AsyncIterator[tuple[str, Simulator]]:
    """A simulator with a real tokenizer and a KV-event publisher on a free loopback port."""
    cfg = SimConfig(
        port=0,
        time_scale=0.0,
        block_size=4,
        num_gpu_blocks=48,
        tokenizer=str(tokenizer_path),
        kv_events_endpoint="tcp://127.0.0.1:*",
    )
    app = build_app(cfg)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", app[SIMULATOR]
    finally:
        await runner.cleanup()
        await app[SIMULATOR].close()


def chat(user: str, system: str = SYSTEM) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }


async def test_precise_index_follows_the_simulators_cache(
    kv_sim: tuple[str, Simulator], tokenizer_path: Path
) -> None:
    url, sim = kv_sim
    assert sim.kv_events is not None
    index = PreciseKVIndex(block_size=4)
    subscriber = KVEventSubscriber(index, WORKER, sim.kv_events.endpoint)
    subscriber.start()
    tokenizer = Tokenizer(tokenizer_path)

    def prompt_ids(body: dict[str, Any]) -> list[int]:
        summary = parse_request(Api.CHAT, orjson.dumps(body), max_body_bytes=1 << 20)
        return tokenizer.encode(render_prompt(summary))

    def sim_holds(ids: list[int]) -> int:
        """The simulator's truth: longest cached prefix of ``ids``, in blocks."""
        held = 0
        for block_hash in block_hashes(ids, 4):
            if block_hash not in sim.cache:
                break
            held += 1
        return held

    first, second = chat("question one asks about the parser"), chat("question two asks")
    unsent, unrelated = chat("question two asks about the cache"), chat("hi", system="tool tool")
    probes = [prompt_ids(body) for body in (first, second, unsent, unrelated)]

    def agrees() -> bool:
        return index.block_count(WORKER) == len(sim.cache) and all(
            index.matched_blocks(WORKER, index.hash_tokens(ids)) == sim_holds(ids)
            for ids in probes
        )

    try:
        # PUB/SUB joins asynchronously: reset (AllBlocksCleared) until the subscriber hears one.
        deadline = time.monotonic() + 5.0
        while index.last_seq(WORKER) is None:
            assert time.monotonic() < deadline, "no KV events received"
            sim.reset()
            await asyncio.sleep(0.02)
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
            for body in (first, second):
                await client.chat.completions.create(**body)
        deadline = time.monotonic() + 5.0
        while not agrees() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        held = [sim_holds(ids) for ids in probes]
        matched = [index.matched_blocks(WORKER, index.hash_tokens(ids)) for ids in probes]
        assert matched == held
        assert index.block_count(WORKER) == len(sim.cache) == sim.cache.num_gpu_blocks
        # The second prompt is fully cached; the unsent one shares the system prefix only.
        assert held[1] == len(block_hashes(probes[1], 4))
        assert 0 < held[2] < len(block_hashes(probes[2], 4))
        assert held[3] == 0
        assert (index.gaps, index.skipped_blocks, index.stale(WORKER), subscriber.errors) == (
            0,
            0,
            False,
            0,
        )
    finally:
        await subscriber.stop()
