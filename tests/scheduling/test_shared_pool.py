"""The shared KV pool fed by Mooncake Store's events: decoded from a recorded stream in
``mooncake_master``'s wire format, credited beyond each worker's device prefix only."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.asyncio

from extproc.scheduling.kv_events import (
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventDecodeError,
    PreciseKVIndex,
    TierOverlap,
)
from extproc.scheduling.shared_pool import (
    SharedKVPool,
    StoreEvent,
    decode_store_frames,
    parse_seq_hash,
)
from extproc.service.kv_subscriber import SharedPoolSubscriber

BS = 4
ENGINE = [1001, 1002, 1003, 1004, 1005]
RECORDING = Path(__file__).parent / "recordings" / "mooncake_master_kv_events.msgpack"
"""Five batches written field for field as ``KvEventPublisher::PublishBatch`` packs them (the
RFC #1527 map with the legacy aliases and the object key; batch 4 missing), not captured from a
running master."""


def recorded() -> list[list[bytes]]:
    return [list(frames) for frames in msgpack.Unpacker(RECORDING.open("rb"), raw=True)]


def indexed(*device: tuple[str, int]) -> tuple[PreciseKVIndex, tuple[int, ...]]:
    """An index where worker ``X`` computed the five blocks (so their engine hashes are known)
    and each named worker holds the first ``n`` on its device."""
    index = PreciseKVIndex(block_size=BS)
    ids = list(range(20))
    for worker, n in (("X", 5), *device):
        index.apply(worker, EventBatch(0.0, (BlockStored(tuple(ENGINE[:n]), None,
                                                         tuple(ids[: n * BS]), BS),)))
    index.apply("X", EventBatch(0.0, (BlockStored((9999,), None, tuple(range(50, 54)), BS),)))
    return index, index.hash_tokens(ids)


def test_the_recorded_stream_decodes_as_the_master_publishes_it() -> None:
    decoded = [decode_store_frames(frames) for frames in recorded()]
    assert [seq for seq, _ in decoded] == [1, 2, 3, 5, 6]
    first = decoded[0][1]
    assert [(e.kind, e.seq_hashes, e.medium) for e in first] == [
        ("stored", (h,), "cpu") for h in ENGINE[:4]]
    assert first[1].object_key == "1002" and first[0].object_key == hex(ENGINE[0])
    assert decoded[1][1][1] == StoreEvent("removed", (ENGINE[3],), hex(ENGINE[3]), "cpu")
    assert len(decoded[2][1]) == 1, "an event type this version does not know is skipped"


def test_pool_hits_count_beyond_the_device_prefix_only() -> None:
    index, request = indexed(("W", 2))
    pool = SharedKVPool(index)
    for frames in recorded()[:3]:
        pool.apply(*reversed(decode_store_frames(frames)))
    assert len(pool) == 4
    assert index.overlap("W", request) == TierOverlap(device=2, shared=2, weighted=2 + 2 * 0.5)
    assert index.overlap("cold", request) == TierOverlap(shared=4, weighted=4 * 0.5)
    assert index.overlap("X", request) == TierOverlap(device=5, weighted=5.0), "never twice"


def test_a_block_below_and_in_the_pool_counts_once_at_the_better_weight() -> None:
    index, request = indexed(("W", 2))
    index.apply("W", EventBatch(0.0, (BlockStored((ENGINE[1],), None, (), BS, None, "CPU"),
                                      BlockRemoved((ENGINE[1],), "GPU"))))
    pool = SharedKVPool(index)
    pool.apply(decode_store_frames(recorded()[0])[1], seq=1)
    found = index.overlap("W", request)
    assert (found.device, found.cpu, found.shared) == (1, 1, 3)
    assert found.weighted == 1 + 0.75 + 2 * 0.5


def test_a_lost_batch_clears_the_pool_and_late_blocks_resolve_when_a_worker_reports_them() -> None:
    index, request = indexed()
    pool = SharedKVPool(index)
    frames = recorded()
    for message in frames[:2]:
        pool.apply(*reversed(decode_store_frames(message)))
    assert len(pool) == 3, "1004 removed; 4242 waits for a worker to report it"
    index.apply("X", EventBatch(0.0, (BlockStored((4242,), 9999, tuple(range(54, 58)), BS),)))
    pool.apply([], seq=3)
    assert len(pool) == 4
    pool.apply(*reversed(decode_store_frames(frames[3])))  # sequence 5 after 3
    assert pool.resets == 1 and len(pool) == 1
    pool.apply(*reversed(decode_store_frames(frames[4])))
    assert index.overlap("cold", request).shared == 3, "hits in [D, n): blocks 0, 1 and 4"


def test_a_block_counts_once_every_physical_object_is_in() -> None:
    index, request = indexed()
    pool = SharedKVPool(index, objects_per_block=2)
    rank = [StoreEvent("stored", (ENGINE[0],), f"{ENGINE[0]}_{r}_k") for r in (0, 1)]
    pool.apply(rank[:1])
    assert len(pool) == 0
    pool.apply(rank[1:])
    assert len(pool) == 1
    pool.apply([StoreEvent("removed", (ENGINE[0],), f"{ENGINE[0]}_0_k")])
    assert len(pool) == 0
    pool.apply([StoreEvent("cleared")])
    assert index.overlap("cold", request).shared == 0


def test_the_subscriber_guide_array_form_and_bad_payloads() -> None:
    legacy = msgpack.packb([1.5, [
        ["BlockStoreEvent", "0x3e9", [["memory", "tcp://10.0.0.9:6000"]], "m", 4, "", "", []],
        ["BlockUpdateEvent", "0x3ea", []],
        ["RemoveAllEvent"],
    ]])
    _, events = decode_store_frames([b"mooncake", (7).to_bytes(8, "big"), legacy])
    assert events == [StoreEvent("stored", (1001,), "0x3e9"), StoreEvent("removed", (1002,),
                      "0x3ea"), StoreEvent("cleared")]
    assert parse_seq_hash("not-a-hash") is None
    for payload in (b"\xc1", msgpack.packb({"ts": 1}), msgpack.packb([1, [42]]),
                    msgpack.packb([1, [{"event_type": "stored", "seq_hashes": ["x"]}]])):
        with pytest.raises(KVEventDecodeError):
            decode_store_frames([b"", bytes(8), payload])


async def test_the_feed_replays_the_recording_over_zmq_into_the_pool() -> None:
    index, request = indexed()
    pool = SharedKVPool(index)
    context = zmq.asyncio.Context()
    publisher = context.socket(zmq.PUB)
    publisher.bind("tcp://127.0.0.1:*")
    feed = SharedPoolSubscriber(pool, publisher.getsockopt_string(zmq.LAST_ENDPOINT))
    feed.start()
    try:
        first, *rest = recorded()
        deadline = time.monotonic() + 5.0
        while pool.last_seq is None:  # PUB/SUB joins asynchronously: repeat the first batch
            assert time.monotonic() < deadline, "the feed heard nothing"
            await publisher.send_multipart(first)
            await asyncio.sleep(0.02)
        pool.last_seq = 1  # the repeats of batch 1 were the join, not a restart
        for frames in rest[:2]:
            await publisher.send_multipart(frames)
        await publisher.send_multipart([b"", bytes(8), b"\xc1"])
        while feed.errors == 0:
            assert time.monotonic() < deadline, "the bad message never came"
            await asyncio.sleep(0.01)
        assert (pool.last_seq, len(pool), pool.resets) == (3, 4, 0), "1004 removed, back"
        assert index.overlap("cold", request).shared == 4
    finally:
        await feed.stop()
        context.destroy(linger=0)
