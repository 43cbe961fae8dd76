"""Router state as the service uses it: the local store always, the shared store when there is
one, and what happens when the shared store is slow or gone.

* A call never waits longer than ``timeout`` on the shared store. A failure marks it down; from
  then on requests are served from the local store at once, and a background task reconnects
  with backoff.
* Every write lands in the local store first, so this replica never forgets what it learnt.
  Writes the shared store did not take wait in a bounded backlog, in order, and are replayed
  when it is back (they are deltas, idempotent per replay id: replaying is safe). Sessions with
  writes in the backlog are served from the local copy even once the store answers again, until
  the backlog has drained.
* A load from the shared store is merged with the local one: an id owner or a session record
  known here but missing there (the store restarted empty, an eviction) is kept, so a lock
  known locally is never dropped.

Writes that need not delay the request (what a streamed answer carried, a session's end) go
through ``send``: one writer task applies them in order, off the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TypeVar

from ..config import Config, ConfigError
from ..observability.metrics import Metrics
from ..types import Clock
from .memory import MemoryStore
from .records import Write, session_of
from .redis import RedisStore
from .store import Applied, Facts, Query, Store

log = logging.getLogger(__name__)

BACKOFF_START = 0.05
BACKOFF_MAX = 2.0

T = TypeVar("T")


class StateLayer:
    def __init__(
        self,
        local: MemoryStore,
        shared: Store | None = None,
        *,
        clock: Clock,
        metrics: Metrics,
        timeout: float = 0.05,
        max_backlog: int = 100_000,
    ) -> None:
        self.local = local
        self.shared = shared
        self._clock = clock
        self._metrics = metrics
        self._timeout = timeout
        self._backlog: deque[Sequence[Write]] = deque()
        self._max_backlog = max_backlog
        self._dirty: dict[str, int] = {}
        """Session key → writes of it waiting in the backlog."""
        self._up = shared is not None
        self._queue: asyncio.Queue[Sequence[Write]] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._recovery: asyncio.Task[None] | None = None
        metrics.store_up.set(1 if self._up else 0)

    @classmethod
    def from_config(cls, config: Config, *, clock: Clock, metrics: Metrics) -> StateLayer:
        """The layer ``config.state`` describes: local only, or local in front of Redis."""
        shared: Store | None = None
        if config.state.store == "redis":
            shared = RedisStore(
                config.state.redis_url,
                prefix=config.state.key_prefix,
                session_ttl=config.memory.session_ttl_seconds,
                owner_ttl=config.memory.owner_ttl_seconds,
                max_known=config.memory.max_sessions,
            )
        return cls(
            MemoryStore.from_config(config, clock), shared, clock=clock, metrics=metrics,
            timeout=config.state.timeout_ms / 1000, max_backlog=config.state.max_backlog,
        )

    async def tenant_secret(self, config: Config) -> bytes | None:
        """The key of the tenant hash: the configured file's, else the one the shared store
        keeps for every replica (None: the router draws its own)."""
        path = config.identity.tenant_secret_file
        if path:
            secret = Path(path).read_bytes().strip()
            if len(secret) < 16:
                raise ConfigError(f"identity.tenant_secret_file: {path} holds fewer than 16 "
                                  "bytes")
            return secret
        shared = self.shared
        if isinstance(shared, RedisStore):
            try:
                return await asyncio.wait_for(
                    shared.shared_secret(secrets.token_bytes(32)), self._timeout * 20)
            except Exception as exc:
                log.warning("no shared tenant secret (%s): tenants differ per replica until "
                            "the store answers at a restart", exc)
        return None

    @property
    def up(self) -> bool:
        """The shared store answers (always True without one: local state is the state)."""
        return self.shared is None or self._up

    def start(self) -> None:
        if self.shared is None or self._writer_task is not None:
            return
        self._queue = asyncio.Queue()
        self._writer_task = asyncio.create_task(self._writer(), name="state-writer")
        if not self._up:
            self._recovery = asyncio.create_task(self._recover(), name="state-recover")

    async def stop(self) -> None:
        """Drain what is queued (bounded by the timeout per batch), then stop."""
        if self._queue is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout=2.0)
        for task in (self._writer_task, self._recovery):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._writer_task = self._recovery = None
        if self.shared is not None:
            await self.shared.close()

    async def load(self, query: Query) -> Facts:
        local = self.local.load_now(query)
        if self.shared is None or not self._up:
            return local
        shared = await self._call("load", self.shared.load(query))
        if shared is None:
            return local
        return self._merge(query, shared, local)

    async def apply(self, writes: Sequence[Write]) -> Applied:
        """Write now: the request waits for this (at most ``timeout``)."""
        if not writes:
            return Applied()
        now = self._clock()
        applied = self.local.apply_now(writes, now)
        if self.shared is None:
            return applied
        if not self._up or self._backlog:
            self._defer(writes)
            return applied
        shared = await self._call("apply", self.shared.apply(writes, now))
        if shared is None:
            self._defer(writes)
            return applied
        return shared

    def send(self, writes: Sequence[Write]) -> None:
        """Write soon, in order, without holding the caller."""
        if not writes:
            return
        self.local.apply_now(writes, self._clock())
        if self.shared is None:
            return
        if self._queue is None:
            self._defer(writes)
        else:
            self._queue.put_nowait(writes)

    # -- internals -------------------------------------------------------------------------

    def _merge(self, query: Query, shared: Facts, local: Facts) -> Facts:
        owners = {**local.owners, **shared.owners}
        key = shared.session_key or local.session_key
        if key is not None and key != local.session_key:
            local = self.local.load_now(Query(key))
        record = shared.session
        if key is not None and (record is None or key in self._dirty):
            record = local.session if local.session is not None else record
        if key is not None and record is not None and key not in self._dirty:
            self.local.put(key, record)
        if shared.owners:
            self.local.put_owners(dict(shared.owners))
        return Facts(key, record, owners)

    async def _call(self, op: str, call: Awaitable[T]) -> T | None:
        """Await ``call`` within the timeout; None (and the store marked down) on failure."""
        started = time.perf_counter()
        try:
            result = await asyncio.wait_for(call, self._timeout)
        except Exception as exc:
            self._metrics.store_errors.labels(op, type(exc).__name__).inc()
            self._down(f"{op}: {type(exc).__name__}: {exc}")
            return None
        self._metrics.store_seconds.labels(op).observe(time.perf_counter() - started)
        return result

    def _defer(self, writes: Sequence[Write]) -> None:
        if len(self._backlog) >= self._max_backlog:
            dropped = self._backlog.popleft()
            self._undirty(dropped)
            self._metrics.store_dropped.inc()
        self._backlog.append(writes)
        for write in writes:
            key = session_of(write)
            if key is not None:
                self._dirty[key] = self._dirty.get(key, 0) + 1
        self._metrics.store_backlog.set(len(self._backlog))

    def _undirty(self, writes: Sequence[Write]) -> None:
        for write in writes:
            key = session_of(write)
            if key is not None and key in self._dirty:
                self._dirty[key] -= 1
                if not self._dirty[key]:
                    del self._dirty[key]

    def _down(self, why: str) -> None:
        if not self._up:
            return
        self._up = False
        self._metrics.store_up.set(0)
        log.warning("shared store unavailable (%s); serving from local state", why)
        if self._writer_task is not None:
            self._recovery = asyncio.create_task(self._recover(), name="state-recover")

    async def _recover(self) -> None:
        """Ping with backoff; once the store answers, seed it with the local records of the
        sessions written meanwhile (where it lost them: a restart without persistence), replay
        the backlog on top (idempotent: the seeds already hold those turns), then mark it up."""
        assert self.shared is not None
        delay = BACKOFF_START
        while True:
            await asyncio.sleep(delay)
            delay = min(BACKOFF_MAX, delay * 2)
            try:
                await asyncio.wait_for(self.shared.ping(), self._timeout * 4)
                seeds = {key: record for key in self._dirty
                         if (record := self.local.record(key)) is not None}
                await asyncio.wait_for(self.shared.seed(seeds), self._timeout * 4)
                while self._backlog:
                    batch = self._backlog[0]
                    await asyncio.wait_for(
                        self.shared.apply(batch, self._clock()), self._timeout * 4
                    )
                    self._backlog.popleft()
                    self._undirty(batch)
                    self._metrics.store_backlog.set(len(self._backlog))
            except Exception as exc:
                self._metrics.store_errors.labels("recover", type(exc).__name__).inc()
                continue
            self._up = True
            self._metrics.store_up.set(1)
            log.info("shared store back; backlog written")
            self._recovery = None
            return

    async def _writer(self) -> None:
        assert self._queue is not None and self.shared is not None
        while True:
            writes = await self._queue.get()
            try:
                sent = None
                if self._up and not self._backlog:
                    sent = await self._call("send", self.shared.apply(writes, self._clock()))
                if sent is None:
                    self._defer(writes)
            finally:
                self._queue.task_done()
