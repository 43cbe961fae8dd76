"""Publishes the simulator's prefix-cache changes as vLLM KV events on a ZMQ PUB socket.

Same wire format as vLLM's ``ZmqEventPublisher`` (see ``extproc.scheduling.kv_events``), one batch
per cache update, so the router's precise index can be tested against the simulator exactly as
it would run against vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import zmq

from ...scheduling.kv_events import (
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    encode_frames,
)


class KVEventPublisher:
    """Binds ``endpoint`` and sends each batch with the next sequence number. A PUB socket never
    blocks: a subscriber that falls behind loses batches and sees the sequence gap."""

    def __init__(self, endpoint: str, topic: str = "", *, block_size: int) -> None:
        self.topic = topic
        self.block_size = block_size
        self._seq = 0
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError:
            self.close()
            raise
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def changed(
        self,
        tokens: Sequence[int],
        hashes: Sequence[int],
        stored: Collection[int],
        evicted: Sequence[int],
    ) -> None:
        """``hashes`` are the blocks of ``tokens``; of those, ``stored`` are new in the cache.
        Each run of consecutive new blocks becomes one ``BlockStored`` whose parent is the block
        before the run, as vLLM reports a request's newly cached blocks."""
        events: list[KVEvent] = []
        size = self.block_size
        start = None
        for i, block_hash in enumerate([*hashes, None]):
            if block_hash is not None and block_hash in stored:
                start = i if start is None else start
                continue
            if start is not None:
                events.append(
                    BlockStored(
                        block_hashes=tuple(hashes[start:i]),
                        parent_block_hash=hashes[start - 1] if start else None,
                        token_ids=tuple(tokens[start * size : i * size]),
                        block_size=size,
                        medium=GPU,
                    )
                )
                start = None
        if evicted:
            events.append(BlockRemoved(tuple(evicted), medium=GPU))
        self.publish(events)

    def cleared(self) -> None:
        self.publish([AllBlocksCleared()])

    def publish(self, events: Sequence[KVEvent]) -> None:
        if not events:
            return
        frames = encode_frames(self.topic, self._seq, EventBatch(time.time(), tuple(events)))
        self._seq += 1
        self._socket.send_multipart(frames)

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()
