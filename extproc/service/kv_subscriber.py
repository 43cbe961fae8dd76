"""The one I/O piece of the precise prefix index: a ZMQ SUB socket per worker, read on the event
loop, feeding decoded KV-event batches into the (pure) ``PreciseKVIndex``."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import zmq
import zmq.asyncio

from ..scheduling.kv_events import KVEventDecodeError, PreciseKVIndex, decode_frames

log = logging.getLogger(__name__)

class KVEventSubscriber:
    """Feeds one worker's KV events into ``index``: a ZMQ SUB socket read on the event loop.

    ZMQ reconnects on its own when the publisher restarts; the restart shows as sequence 0,
    which the index handles. Batches that do not decode are logged and counted in ``errors``.
    """

    def __init__(
        self,
        index: PreciseKVIndex,
        worker_address: str,
        endpoint: str,
        topic: str = "kv-events",
    ) -> None:
        self.index = index
        self.worker_address = worker_address
        self.endpoint = endpoint
        self.topic = topic
        self.errors = 0
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Connect and start reading (call from the running event loop)."""
        if self._task is not None:
            return
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        self._socket.connect(self.endpoint)
        self._task = asyncio.get_running_loop().create_task(
            self._run(self._socket), name=f"kv-events {self.worker_address}"
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None

    async def _run(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            try:
                topic, seq, batch = decode_frames(frames)
                if topic != self.topic:
                    raise KVEventDecodeError(f"unexpected topic {topic!r}")
            except KVEventDecodeError as exc:
                self.errors += 1
                log.warning("KV events from %s: %s", self.worker_address, exc)
                continue
            self.index.apply(self.worker_address, batch, seq)

