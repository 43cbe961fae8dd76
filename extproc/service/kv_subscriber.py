"""The I/O of the precise prefix index: a ZMQ SUB socket per publisher (or one the router binds
for engines that connect to it), read on the event loop, feeding decoded batches into the (pure)
indexes: each worker's KV events into ``PreciseKVIndex``, a shared store's (Mooncake Store) into
``SharedKVPool``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

import zmq
import zmq.asyncio

from ..scheduling.kv_events import KVEventDecodeError, PreciseKVIndex, decode_frames
from ..scheduling.shared_pool import SharedKVPool, decode_store_frames
from ..scheduling.types import Worker

log = logging.getLogger(__name__)

class ZmqFeed:
    """One publisher's messages, each handed to ``_handle``: a ZMQ SUB socket read on the event
    loop. ZMQ reconnects on its own when the publisher restarts (the sequence numbers tell the
    indexes). Messages that do not decode are logged and counted in ``errors``."""

    bind = False
    """Bind the endpoint (publishers connect to it) instead of connecting to it."""

    def __init__(self, name: str, endpoint: str, topic: str) -> None:
        self.name = name
        self.endpoint = endpoint
        self.topic = topic
        self.errors = 0
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Connect (or bind) and start reading (call from the running event loop)."""
        if self._task is not None:
            return
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        if self.bind:
            self._socket.bind(self.endpoint)
        else:
            self._socket.connect(self.endpoint)
        self._task = asyncio.get_running_loop().create_task(
            self._run(self._socket), name=self.name
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
                self._handle(frames)
            except KVEventDecodeError as exc:
                self.errors += 1
                log.warning("%s: %s", self.name, exc)

    def _handle(self, frames: list[bytes]) -> None:
        raise NotImplementedError


class KVEventSubscriber(ZmqFeed):
    """Feeds one worker's vLLM KV events into ``index``."""

    def __init__(
        self,
        index: PreciseKVIndex,
        worker_address: str,
        endpoint: str,
        topic: str = "",
    ) -> None:
        """``topic`` empty (vLLM's default publishes on the empty topic): every message on
        this worker's socket is its own."""
        super().__init__(f"kv-events {worker_address}", endpoint, topic)
        self.index = index
        self.worker_address = worker_address

    def _handle(self, frames: list[bytes]) -> None:
        topic, seq, batch = decode_frames(frames)
        if self.topic and topic != self.topic:
            raise KVEventDecodeError(f"unexpected topic {topic!r}")
        self.index.apply(self.worker_address, batch, seq)


class KVEventListener(ZmqFeed):
    """Feeds the KV events of every engine that connects to the router's own endpoint
    (``scheduling.prefix.kv_events_listen``; vLLM connects to a ``tcp://`` endpoint that names
    a host) into ``index``, each message's topic naming its worker: ``HOST:PORT``, or llm-d's
    ``kv@HOST:PORT@MODEL`` / ``kv@HOST@MODEL`` (the one worker of that model on that host)."""

    bind = True

    def __init__(self, index: PreciseKVIndex, endpoint: str,
                 workers: Callable[[], Iterable[Worker]]) -> None:
        super().__init__("kv-events listener", endpoint, "")
        self.index = index
        self._workers = workers

    def _handle(self, frames: list[bytes]) -> None:
        topic, seq, batch = decode_frames(frames)
        self.index.apply(worker_of(topic, self._workers()), batch, seq)


def worker_of(topic: str, workers: Iterable[Worker]) -> str:
    """The address of the worker a KV-event topic names; ``KVEventDecodeError`` when it names
    none, or several."""
    name, _, rest = topic.removeprefix("kv@").partition("@")
    model = rest or None
    candidates = [w.address for w in workers if (model is None or w.model == model)
                  and (w.address == name or w.address.rpartition(":")[0] == name)]
    exact = [a for a in candidates if a == name]
    if len(exact) == 1 or len(set(candidates)) == 1:
        return (exact or candidates)[0]
    raise KVEventDecodeError(f"topic {topic!r} names {'no' if not candidates else 'several'} "
                             "worker of the pools")


class SharedPoolSubscriber(ZmqFeed):
    """Feeds a shared store's KV events (Mooncake master's publisher) into ``pool``."""

    def __init__(self, pool: SharedKVPool, endpoint: str, topic: str = "") -> None:
        super().__init__("kv-events shared-pool", endpoint, topic)
        self.pool = pool

    def _handle(self, frames: list[bytes]) -> None:
        seq, events = decode_store_frames(frames)
        self.pool.apply(events, seq)
