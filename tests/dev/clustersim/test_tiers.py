"""The simulated engine's KV tiers and its handling of KV hints, fed event sequences."""

from __future__ import annotations

import pytest

from extproc.dev.clustersim.blocks import Stream
from extproc.dev.clustersim.engine import CostModel, EngineWorker, SimRequest, WorkerSpec
from extproc.dev.clustersim.tiers import CPU, DISK, GPU, TieredKV
from extproc.scheduling.kv_events import BlockRemoved, BlockStored, KVEvent
from extproc.scheduling.kv_hints import KvHint

BLOCK = 64


def chain(owner: int, blocks: int, parent: Stream | None = None, inherit: int = 0) -> list[int]:
    return list(Stream(owner, BLOCK, parent, inherit).hashes(blocks * BLOCK))


def kv(device: int, cpu: int = 0, disk: int = 0, *, offload: bool = True, share: int = 0,
       events: list[KVEvent] | None = None) -> TieredKV:
    return TieredKV(block_size=BLOCK, device_blocks=device, cpu_blocks=cpu, disk_blocks=disk,
                    offload=offload, share_blocks=share, cpu_tokens_per_s=64_000.0,
                    disk_tokens_per_s=6_400.0,
                    listener=None if events is None else events.append)


def test_device_evictions_are_offloaded_and_cost_a_transfer_back() -> None:
    events: list[KVEvent] = []
    cache = kv(4, 8, events=events)
    a, b = chain(1, 4), chain(2, 4)
    cache.touch(a)
    cache.touch(b)
    assert all(cache.tier_of(x) == CPU for x in a)
    assert BlockRemoved(tuple(a[::-1]), GPU) in events
    assert BlockStored(tuple(a[::-1]), None, (), BLOCK, None, CPU) in events
    found = cache.lookup(a, 4, now=10.0)
    assert (found.device, found.lower) == (0, {CPU: 4})
    assert found.ready_s == pytest.approx(10.0 + 4 * BLOCK / 64_000)
    assert all(cache.tier_of(x) == GPU for x in a)


def test_without_offload_evicted_blocks_are_gone() -> None:
    cache = kv(4, 8, offload=False)
    a = chain(1, 4)
    cache.touch(a)
    cache.touch(chain(2, 4))
    assert cache.lookup(a, 4, now=0.0).lower == {}


def test_host_memory_evicts_to_disk_which_is_slower() -> None:
    cache = kv(2, 2, 4)
    a, b, c = chain(1, 2), chain(2, 2), chain(3, 2)
    for blocks in (a, b, c):
        cache.touch(blocks)
    assert [cache.tier_of(x) for x in (a[0], b[0], c[0])] == [DISK, CPU, GPU]
    found = cache.lookup(a, 2, now=0.0)
    assert found.lower == {DISK: 2}
    assert found.ready_s == pytest.approx(2 * BLOCK / 6_400)


def test_demote_then_prefetch_brings_a_session_back_before_its_turn() -> None:
    cache = kv(8, 8)
    paused, other = chain(1, 6), chain(2, 6)
    cache.touch(paused)
    assert cache.demote("paused", paused)
    assert all(cache.tier_of(x) == CPU for x in paused)
    cache.touch(other)
    cache.touch(chain(3, 8))
    assert all(cache.tier_of(x) == CPU for x in paused), "held in host memory, not churned"
    assert cache.prefetch("paused", paused, now=100.0)
    landed = 100.0 + 6 * BLOCK / 64_000
    early = cache.lookup(paused, 6, now=100.0)
    assert (early.device, early.lower, early.ready_s) == (0, {CPU: 6}, pytest.approx(landed))
    late = cache.lookup(paused, 6, now=landed)
    assert (late.device, late.lower) == (6, {})


def test_demote_keeps_pinned_blocks_on_the_device() -> None:
    cache = kv(8, 8, share=4)
    system = chain(0, 2)
    own = chain(1, 4, Stream(0, BLOCK), 2)
    cache.touch(own)
    assert cache.share("other", system)
    assert cache.demote("s", own)
    assert [cache.tier_of(x) for x in own] == [GPU, GPU, CPU, CPU]


def test_demote_with_host_memory_full_falls_back_to_eviction() -> None:
    cache = kv(4, 4)
    first, second = chain(1, 4), chain(2, 4)
    cache.touch(first)
    assert cache.demote("first", first)
    cache.touch(second)
    assert not cache.demote("second", second), "host memory holds the first session's"
    assert all(cache.tier_of(x) == GPU for x in second)
    cache.touch(chain(3, 4))
    assert cache.lookup(second, 4, now=0.0).device == 0
    assert all(cache.tier_of(x) == CPU for x in first)


def test_share_pins_a_prefix_within_its_budget() -> None:
    cache = kv(6, 0, share=3)
    system = chain(0, 3)
    cache.touch(system)
    assert cache.share("s1", system)
    extra = chain(9, 1)
    cache.touch(extra)
    assert not cache.share("s2", extra), "over the budget"
    cache.touch(chain(1, 6))
    assert all(cache.tier_of(x) == GPU for x in system)
    cache.release("s1", [])
    cache.touch(chain(2, 6))
    assert all(cache.tier_of(x) is None for x in system)


def test_release_frees_only_what_the_session_alone_held() -> None:
    events: list[KVEvent] = []
    cache = kv(16, 16, events=events)
    parent = Stream(1, BLOCK)
    shared = chain(1, 4)
    child = chain(2, 8, parent, 4)
    cache.touch(shared)
    cache.touch(child)
    cache.release("child", child[4:])
    assert all(cache.tier_of(x) == GPU for x in shared)
    assert all(cache.tier_of(x) is None for x in child[4:])
    assert BlockRemoved(tuple(child[4:]), GPU) in events


def worker(cpu_tokens: int = 64 * BLOCK) -> EngineWorker:
    spec = WorkerSpec(capacity_tokens=32 * BLOCK, max_batch=4, cpu_tokens=cpu_tokens)
    return EngineWorker("w", spec, CostModel(), BLOCK)


def turn(engine: EngineWorker, session: str, blocks: list[int], now: float = 0.0) -> SimRequest:
    """Run one turn of ``len(blocks)`` full blocks and one output token to its end."""
    request = SimRequest(session, len(blocks) * BLOCK + 1, 1, blocks, blocks, now)
    engine.submit(request, now)
    while request in engine.running or not request.first_token_s:
        duration = engine.start_step(now)
        assert duration is not None
        now += duration
        engine.finish_step(now)
    return request


def test_engine_hints_resolve_sessions_and_skip_sessions_in_use() -> None:
    engine = worker()
    system = chain(0, 4)
    a = chain(1, 12, Stream(0, BLOCK), 4)
    b = chain(2, 12, Stream(0, BLOCK), 4)
    turn(engine, "a", a)
    turn(engine, "b", b)
    assert not engine.hint(KvHint("demote", "nobody", "w"), 0.0)
    assert engine.hint(KvHint("demote", "a", "w"), 0.0)
    assert [engine.kv.tier_of(x) for x in a] == [GPU] * 4 + [CPU] * 8, "the system prompt stays"
    assert engine.hint(KvHint("prefetch", "a", "w"), 0.0)
    assert turn(engine, "a", a, now=1.0).lower_tokens == {}
    engine.submit(SimRequest("b", 12 * BLOCK, 1, b, b, 2.0), 2.0)
    assert not engine.hint(KvHint("demote", "b", "w"), 2.0), "b has a request waiting here"
    assert engine.hint(KvHint("release", "a", "w"), 2.0)
    assert all(engine.kv.tier_of(x) == GPU for x in system)
    assert all(engine.kv.tier_of(x) is None for x in a[4:])


def test_a_released_sub_agent_keeps_the_prompt_it_started_from() -> None:
    engine = worker()
    parent = Stream(1, BLOCK)
    turn(engine, "p", chain(1, 6))
    child = chain(2, 10, parent, 8)
    turn(engine, "p/sub0", child)
    engine.hint(KvHint("release", "p/sub0", "w", prefix_tokens=9 * BLOCK), 1.0)
    assert all(engine.kv.tier_of(x) == GPU for x in child[:9]), "the parent resends these"
    assert engine.kv.tier_of(child[9]) is None


def test_a_host_memory_hit_waits_for_its_copy_and_skips_the_prefill() -> None:
    cold_engine, warm_engine = worker(cpu_tokens=0), worker()
    blocks = chain(1, 24)
    for engine in (cold_engine, warm_engine):
        turn(engine, "s", blocks)
        turn(engine, "other", chain(2, 40))
    cold = turn(cold_engine, "s", blocks, now=10.0)
    warm = turn(warm_engine, "s", blocks, now=10.0)
    assert cold.cached_tokens == 0 and cold.lower_tokens == {}
    assert warm.lower_tokens == {CPU: 24 * BLOCK} and warm.cached_tokens == 24 * BLOCK
    assert warm.loaded_s == pytest.approx(10.0 + 24 * BLOCK / CostModel().cpu_tokens_per_s)
    assert warm.first_token_s is not None and cold.first_token_s is not None
    assert warm.first_token_s - 10.0 < (cold.first_token_s - 10.0) / 3
