"""vLLM KV events: the wire format, the precise prefix index and the ZMQ subscriber."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Callable

import msgpack
import pytest
import xxhash
import zmq
import zmq.asyncio

from extproc.scheduling.kv_events import (
    CPU,
    DEVICE,
    DISK,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventDecodeError,
    PreciseKVIndex,
    TierOverlap,
    TierWeights,
    decode_batch,
    decode_frames,
    encode_batch,
    encode_frames,
    token_block_hashes,
)
from extproc.service.kv_subscriber import KVEventSubscriber
from tests.conftest import FakeClock

BS = 4
W = "10.0.0.1:8000"


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def stored(
    engine: list[int], parent: int | None, token_ids: list[int], **extra: object
) -> BlockStored:
    return BlockStored(tuple(engine), parent, tuple(token_ids), BS, **extra)  # type: ignore[arg-type]


def batch(*events: object) -> EventBatch:
    return EventBatch(1.5, tuple(events))  # type: ignore[arg-type]


# -- wire format -----------------------------------------------------------------------------


def test_frames_round_trip() -> None:
    original = EventBatch(
        1700000000.25,
        (
            BlockStored((1, 2**64 - 1), None, tuple(tokens(8)), BS, None, "GPU"),
            BlockStored((b"\x01" * 32,), 2**64 - 1, tuple(tokens(4, 8)), BS, 3, "CPU"),
            BlockRemoved((1,), "GPU"),
            AllBlocksCleared(),
        ),
        dp_rank=2,
    )
    frames = encode_frames("kv-events", 41, original)
    assert frames[1] == (41).to_bytes(8, "big")
    assert decode_frames(frames) == ("kv-events", 41, original)
    assert decode_batch(encode_batch(batch())) == batch()


def test_decodes_payloads_shaped_exactly_as_vllm_sends_them() -> None:
    # msgspec array_like tagged structs: the class name first, omitted trailing defaults.
    current = msgpack.packb(
        [
            1700000000.5,
            [
                ["BlockStored", [11, 12], None, tokens(8), 4, None, "GPU"],
                ["BlockRemoved", [11], "GPU"],
                ["AllBlocksCleared"],
            ],
            0,
        ]
    )
    assert decode_batch(current) == EventBatch(
        1700000000.5,
        (
            BlockStored((11, 12), None, tuple(tokens(8)), 4, None, "GPU"),
            BlockRemoved((11,), "GPU"),
            AllBlocksCleared(),
        ),
        0,
    )
    # Older vLLM: no medium, no dp rank. Newer: bytes hashes, lora_name, extra_keys, group_idx.
    older = msgpack.packb(
        [2.0, [["BlockStored", [5], 4, tokens(4), 4, None], ["BlockRemoved", [5]]]]
    )
    assert decode_batch(older).events == (
        BlockStored((5,), 4, tuple(tokens(4)), 4),
        BlockRemoved((5,)),
    )
    digest = bytes(range(32))
    newer = msgpack.packb(
        [3.0, [["BlockStored", [digest], None, tokens(4), 4, None, "GPU", None, [None], 0]]],
        use_bin_type=True,
    )
    assert decode_batch(newer).events == (
        BlockStored((digest,), None, tuple(tokens(4)), 4, None, "GPU"),
    )
    as_map = msgpack.packb(
        {"ts": 4.0, "events": [{"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}]}
    )
    assert decode_batch(as_map) == EventBatch(4.0, (BlockRemoved((7,), "GPU"),))


def test_unknown_event_types_are_skipped() -> None:
    payload = msgpack.packb([1.0, [["SomethingNew", 1, 2], ["AllBlocksCleared"]]])
    assert decode_batch(payload).events == (AllBlocksCleared(),)


@pytest.mark.parametrize(
    "doc",
    [
        "not a batch",
        [1.0],
        ["ts", []],
        [1.0, "events"],
        [1.0, [42]],
        [1.0, [["BlockStored", [1], None, [-1, 2, 3, 4], 4, None, "GPU"]]],
        [1.0, [["BlockStored", [1], None, [1, 2, 3, 4], 0, None, "GPU"]]],
        [1.0, [["BlockStored", ["h"], None, [1, 2, 3, 4], 4, None, "GPU"]]],
        [1.0, [["BlockStored", [1], 2.5, [1, 2, 3, 4], 4, None, "GPU"]]],
        [1.0, [["BlockStored", [1], None, [1, 2, 3, 4], 4, None, 7]]],
        [1.0, [["BlockRemoved", None]]],
        [1.0, [], "rank"],
    ],
)
def test_malformed_payloads_raise(doc: object) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(msgpack.packb(doc))


def test_malformed_frames_raise() -> None:
    with pytest.raises(KVEventDecodeError):
        decode_frames([b"kv-events", b"\x00" * 8])
    with pytest.raises(KVEventDecodeError):
        decode_frames([b"kv-events", b"\x00" * 4, encode_batch(batch())])
    with pytest.raises(KVEventDecodeError):
        decode_batch(b"\xc1")


# -- the router's hash -----------------------------------------------------------------------


def test_token_block_hashes_chain_over_packed_token_ids() -> None:
    ids = tokens(10)
    first = xxhash.xxh3_64_intdigest(struct.pack("<4I", 0, 1, 2, 3), seed=0)
    second = xxhash.xxh3_64_intdigest(struct.pack("<4I", 4, 5, 6, 7), seed=first)
    assert token_block_hashes(ids, 4) == [first, second]  # the partial third block has none
    seeded = token_block_hashes(ids, 4, model="qwen3-8b")
    assert seeded[0] == xxhash.xxh3_64_intdigest(
        struct.pack("<4I", 0, 1, 2, 3), seed=xxhash.xxh3_64_intdigest(b"qwen3-8b")
    )
    moved = token_block_hashes([9, 9, 9, 9, 4, 5, 6, 7], 4)
    assert moved[1] != second  # same block after another prefix


# -- the index -------------------------------------------------------------------------------


def test_stored_blocks_match_by_token_content_not_engine_hash() -> None:
    index = PreciseKVIndex(block_size=BS)
    ids = tokens(12)
    index.apply(W, batch(stored([101, 102], None, ids[:8])))
    index.apply(W, batch(stored([103], 102, ids[8:])))  # chained through the parent
    index.apply("other", batch(stored([7, 8, 9], None, ids)))  # other engine hashes, same tokens
    request = index.hash_tokens([*ids, 99])
    assert len(request) == 3
    assert index.matched_blocks(W, request) == 3
    assert index.matched_blocks("other", request) == 3
    assert index.matched_blocks(W, index.hash_tokens([*ids[:4], 50, 51, 52, 53])) == 1
    assert index.matched_blocks("unknown", request) == 0
    index.routed(W, index.hash_tokens(tokens(8, 500)))  # soon cached, not reported
    assert index.block_count(W) == 3


def test_routed_blocks_count_as_on_the_device_until_events_or_time_say_otherwise() -> None:
    """A prompt just routed is matched there before the worker's events come (a concurrent
    identical prompt, a session's next turn), for ``routed_seconds`` at most; a removal
    from the device ends it sooner, and a cleared cache at once."""
    clock = FakeClock()
    index = PreciseKVIndex(block_size=BS, routed_seconds=10.0, clock=clock)
    ids = tokens(12)
    request = index.hash_tokens(ids)
    index.routed(W, request)
    assert index.matched_blocks(W, request) == 3
    assert index.matched_blocks("other", request) == 0
    assert index.block_count(W) == 0  # only events are what it reports
    index.apply(W, batch(stored([1, 2, 3], None, ids)))
    index.apply(W, batch(BlockRemoved((2,), "GPU")))
    assert index.matched_blocks(W, request) == 1  # evicted: no longer "soon cached" either
    index.routed(W, request)
    clock.advance(10.0)
    assert index.matched_blocks(W, request) == 1  # lapsed: what the events say
    index.routed(W, request)
    index.apply(W, batch(AllBlocksCleared()))
    assert index.matched_blocks(W, request) == 0
    off = PreciseKVIndex(block_size=BS, routed_seconds=0.0, clock=clock)
    off.routed(W, request)
    assert off.matched_blocks(W, request) == 0


def test_removed_and_cleared_blocks_stop_matching() -> None:
    index = PreciseKVIndex(block_size=BS)
    ids = tokens(12)
    request = index.hash_tokens(ids)
    index.apply(W, batch(stored([1, 2, 3], None, ids)))
    index.apply(W, batch(BlockRemoved((2,), "GPU")))
    assert index.matched_blocks(W, request) == 1  # block 3 is held but not block 2
    index.apply(W, batch(BlockRemoved((1, 3, 999))))
    assert index.block_count(W) == 0
    index.apply(W, batch(stored([1, 2, 3], None, ids), AllBlocksCleared()))
    assert index.matched_blocks(W, request) == 0


def test_only_blocks_of_the_base_model_in_the_index_block_size_count() -> None:
    index = PreciseKVIndex(block_size=BS)
    ids = tokens(8)
    index.apply(W, batch(stored([3, 4], None, ids, lora_id=1)))
    index.apply(W, batch(BlockStored((5,), None, tuple(ids), 8)))  # another block size
    index.apply(W, batch(stored([6], 12345, ids[4:])))  # parent never seen
    index.apply(W, batch(stored([7], None, ids[:4], medium="EXTERNAL")))  # not a local tier
    index.apply(W, batch(BlockStored((8,), None, (), BS, None, "CPU")))  # moved, never known
    assert index.matched_blocks(W, index.hash_tokens(ids)) == 0
    assert index.skipped_blocks == 2 + 1 + 1 + 1 + 1


def test_a_request_hashed_for_another_model_does_not_match() -> None:
    index = PreciseKVIndex(block_size=BS, model="m1")
    ids = tokens(8)
    index.apply(W, batch(stored([1, 2], None, ids)))
    assert index.matched_blocks(W, index.hash_tokens(ids)) == 2
    assert index.matched_blocks(W, token_block_hashes(ids, BS, model="m1")) == 2
    assert index.matched_blocks(W, token_block_hashes(ids, BS)) == 0


def test_a_sequence_gap_resets_the_worker_and_marks_it_stale() -> None:
    index = PreciseKVIndex(block_size=BS)
    ids = tokens(8)
    request = index.hash_tokens(ids)
    index.apply(W, batch(stored([1], None, ids[:4])), seq=0)
    index.apply("other", batch(stored([1], None, ids[:4])), seq=0)
    index.apply(W, batch(stored([2], 1, ids[4:])), seq=1)
    assert (index.matched_blocks(W, request), index.stale(W), index.gaps) == (2, False, 0)
    index.apply(W, batch(stored([9], None, tokens(4, 100))), seq=5)  # 2..4 lost
    assert (index.matched_blocks(W, request), index.stale(W), index.gaps) == (0, True, 1)
    assert index.block_count(W) == 1  # the batch after the gap still applies
    assert index.matched_blocks("other", request) == 1  # other workers are untouched
    index.apply(W, batch(stored([1], None, ids[:4])), seq=6)
    assert index.stale(W)  # still possibly missing blocks
    index.apply(W, batch(AllBlocksCleared(), stored([1], None, ids[:4])), seq=7)
    assert (index.matched_blocks(W, request), index.stale(W), index.last_seq(W)) == (1, False, 7)


def test_a_publisher_restart_resets_without_staleness_and_late_joiners_are_stale() -> None:
    index = PreciseKVIndex(block_size=BS)
    ids = tokens(4)
    index.apply(W, batch(stored([1], None, ids)), seq=0)
    index.apply(W, batch(), seq=1)
    index.apply(W, batch(), seq=0)  # the server restarted: its cache is empty
    assert (index.block_count(W), index.stale(W), index.gaps) == (0, False, 0)
    index.apply("late", batch(stored([1], None, ids)), seq=40)  # joined mid-stream
    assert index.stale("late") and index.block_count("late") == 1
    index.forget("late")
    assert index.block_count("late") == 0 and not index.stale("late")


def test_memory_is_bounded_per_worker_oldest_first() -> None:
    index = PreciseKVIndex(block_size=BS, max_blocks_per_worker=3)
    ids = tokens(20)
    index.apply(W, batch(stored([1, 2, 3, 4, 5], None, ids)))
    assert index.block_count(W) == 3
    assert index.matched_blocks(W, index.hash_tokens(ids)) == 0  # the head went first
    index.apply(W, batch(BlockRemoved((1, 5))))  # one already dropped, one held
    assert index.block_count(W) == 2


def test_equal_tokens_under_two_engine_hashes_count_until_both_are_removed() -> None:
    index = PreciseKVIndex(block_size=BS)
    ids = tokens(4)
    index.apply(W, batch(stored([1], None, ids), stored([2], None, ids)))  # e.g. cache salts
    index.apply(W, batch(BlockRemoved((1,))))
    assert index.matched_blocks(W, index.hash_tokens(ids)) == 1
    index.apply(W, batch(BlockRemoved((2,))))
    assert index.matched_blocks(W, index.hash_tokens(ids)) == 0


# -- memory tiers ----------------------------------------------------------------------------


def moved(engine: list[int], medium: str) -> BlockStored:
    """An offloading connector's event: engine hashes only, no tokens, no parent."""
    return BlockStored(tuple(engine), None, (), BS, None, medium)


def test_blocks_offloaded_below_the_device_count_at_their_tier_weight() -> None:
    index = PreciseKVIndex(block_size=BS)
    ids = tokens(24)
    request = index.hash_tokens(ids)
    index.apply(W, batch(stored([1, 2, 3, 4, 5, 6], None, ids, medium="GPU")))
    index.apply(W, batch(moved([3, 4, 5, 6], "CPU"), BlockRemoved((3, 4, 5, 6), "GPU")))
    index.apply(W, batch(moved([5, 6], "DISK"), BlockRemoved((5, 6), "CPU")))
    found = index.overlap(W, request)
    assert found == TierOverlap(device=2, cpu=2, disk=2, shared=0,
                                weighted=2 + 2 * 0.75 + 2 * 0.25)
    assert index.matched_blocks(W, request) == found.weighted
    assert (index.block_count(W, DEVICE), index.block_count(W, CPU),
            index.block_count(W, DISK), index.block_count(W)) == (2, 2, 2, 6)
    index.apply(W, batch(BlockRemoved((1,), "GPU")))
    assert index.overlap(W, request).device == 0, "a device prefix starts at block 0"
    assert index.overlap(W, request).weighted == 0.0


def test_a_block_on_the_device_and_below_counts_once_at_the_device_weight() -> None:
    index = PreciseKVIndex(block_size=BS, weights=TierWeights(cpu=0.5, disk=0.1))
    ids = tokens(12)
    index.apply(W, batch(stored([1, 2, 3], None, ids), moved([1, 2, 3], "cpu")))
    assert index.overlap(W, index.hash_tokens(ids)) == TierOverlap(3, weighted=3.0)
    index.apply(W, batch(BlockRemoved((2, 3), "GPU")))
    assert index.overlap(W, index.hash_tokens(ids)) == TierOverlap(1, 2, weighted=2.0)
    index.apply(W, batch(BlockRemoved((2, 3), "CPU")))
    assert index.block_count(W) == 1, "gone from every tier, forgotten"


def test_cpu_events_need_the_device_to_have_reported_the_block_first() -> None:
    index = PreciseKVIndex(block_size=BS)
    ids = tokens(8)
    index.apply(W, batch(moved([1, 2], "CPU")))
    index.apply(W, batch(stored([1, 2], None, ids), BlockRemoved((1, 2), "GPU")))
    assert index.overlap(W, index.hash_tokens(ids)).cpu == 0
    index.apply(W, batch(stored([1, 2], None, ids), moved([1, 2], "CPU"),
                         BlockRemoved((1, 2), "GPU")))
    assert index.overlap(W, index.hash_tokens(ids)).cpu == 2


def test_listeners_hear_where_blocks_come_and_go() -> None:
    index = PreciseKVIndex(block_size=BS)
    heard: list[tuple[str, str, int, bool]] = []
    index.listeners.append(lambda w, tier, own, up: heard.append((w, tier, len(own), up)))
    ids = tokens(8)
    index.apply(W, batch(stored([1, 2], None, ids), moved([2], "CPU"),
                         BlockRemoved((2,), "GPU"), AllBlocksCleared()))
    assert heard == [(W, DEVICE, 2, True), (W, CPU, 1, True), (W, DEVICE, 1, False),
                     (W, DEVICE, 1, False), (W, CPU, 1, False)]


# -- the subscriber --------------------------------------------------------------------------


@pytest.fixture
async def zmq_context() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def eventually(check: Callable[[], bool], step: Callable[[], object] = lambda: None) -> None:
    """Poll ``check`` for up to five seconds, calling ``step`` between tries."""
    deadline = time.monotonic() + 5.0
    while not check():
        assert time.monotonic() < deadline, "timed out"
        step()
        await asyncio.sleep(0.01)


def rebind(socket: zmq.asyncio.Socket, endpoint: str) -> bool:
    try:
        socket.bind(endpoint)
    except zmq.ZMQError:
        return False
    return True


async def test_subscriber_feeds_the_index_and_survives_a_publisher_restart(
    zmq_context: zmq.asyncio.Context,
) -> None:
    publisher = zmq_context.socket(zmq.PUB)
    publisher.bind("tcp://127.0.0.1:*")
    endpoint = publisher.getsockopt_string(zmq.LAST_ENDPOINT)
    index = PreciseKVIndex(block_size=BS)
    subscriber = KVEventSubscriber(index, W, endpoint, topic="kv-events")
    subscriber.start()

    def publish(socket: zmq.asyncio.Socket, seq: int, *events: object, topic: str = "kv-events"
                ) -> None:
        socket.send_multipart(encode_frames(topic, seq, batch(*events)))

    try:
        # PUB/SUB joins asynchronously: clear until the subscriber hears one.
        seqs = iter(range(1_000_000))
        await eventually(lambda: index.last_seq(W) is not None,
                         lambda: publish(publisher, next(seqs), AllBlocksCleared()))
        assert not index.stale(W)
        ids = tokens(8)
        publish(publisher, next(seqs), stored([1, 2], None, ids))
        publisher.send_multipart([b"kv-events", b"garbage", b"!"])
        publish(publisher, next(seqs), AllBlocksCleared(), topic="kv-events-other")
        await eventually(lambda: subscriber.errors == 2)
        assert index.matched_blocks(W, index.hash_tokens(ids)) == 2

        publisher.close(linger=0)  # the server restarts on the same port, sequence from 0
        publisher = zmq_context.socket(zmq.PUB)
        await eventually(lambda: rebind(publisher, endpoint))  # the port is freed asynchronously
        await eventually(lambda: index.block_count(W) == 0, lambda: publish(publisher, 0))
        assert index.last_seq(W) == 0 and not index.stale(W) and index.gaps == 0
    finally:
        await subscriber.stop()
        publisher.close(linger=0)
    await subscriber.stop()  # idempotent


@pytest.mark.parametrize(("topic", "worker"), [
    ("10.0.0.1:8000", "10.0.0.1:8000"),
    ("kv@10.0.0.1:8000@m", "10.0.0.1:8000"),
    ("kv@10.0.0.2@m", "10.0.0.2:8000"),  # llm-d names the pod's IP: its one worker of m
    ("kv@10.0.0.1@n", "10.0.0.1:8001"),
    ("kv@10.0.0.1@m", None),  # two workers of m there: which one is not said
    ("kv@10.0.0.9@m", None),
    ("", None),
])
def test_a_listener_topic_names_its_worker(topic: str, worker: str | None) -> None:
    from extproc.scheduling.kv_events import KVEventDecodeError
    from extproc.scheduling.types import Worker
    from extproc.service.kv_subscriber import worker_of

    pool = [Worker("10.0.0.1:8000", "m"), Worker("10.0.0.1:8002", "m"),
            Worker("10.0.0.2:8000", "m"), Worker("10.0.0.1:8001", "n")]
    if worker is None:
        with pytest.raises(KVEventDecodeError):
            worker_of(topic, pool)
    else:
        assert worker_of(topic, pool) == worker
