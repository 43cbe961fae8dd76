"""Router state as the service uses it: the local store always, the shared store when there is
one, and what happens when the shared store is slow or gone.

* A load on the request path never waits longer than ``timeout`` on the shared store; a write
  an answer waits for (``apply``: the owners of the ids it carries, which another replica may
  be asked for next) waits ``OFF_PATH`` times longer. A *slow* call (a timeout) is served
  from local state, but the store stays in use: other replicas read
  what this one writes, so one slow answer must not stop its lock-critical writes (a write that
  timed out was already sent and lands in order; it is also kept to be sent again). The store
  is marked *down* — every request served from local state at once, a background task
  reconnecting with backoff — when a connection fails, or after ``TRIP_TIMEOUTS`` slow calls
  in a row.
* Every write lands in the local store first, so this replica never forgets what it learnt.
  Writes the shared store did not take wait in a bounded backlog, in order, and are sent again
  (they are deltas, idempotent per replay id, and a turn older than the record's newest never
  overwrites it: sending again is safe). Sessions with writes that never reached the store are
  served from the local copy even once it answers again, until the backlog has drained.
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
from .records import Forget, Write, session_of
from .redis import RedisStore
from .store import Applied, Facts, Query, Store

log = logging.getLogger(__name__)

BACKOFF_START = 0.05
BACKOFF_MAX = 2.0
TRIP_TIMEOUTS = 3
"""Slow calls in a row that mark the store down (one connection failure does at once)."""
OFF_PATH = 20
"""Writes off the request path (the writer, the backlog) wait this many times ``timeout``."""
STOP_SECONDS = 2.0
"""At a stop, the longest wait for the queued sends, then for the backlog."""
MAX_SEND_BATCH = 64
"""Sends the writer joins into one call at most (a call's script stays short)."""

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
        self._backlog: deque[tuple[Sequence[Write], bool]] = deque()
        """(writes, never reached the store) to send again, oldest first."""
        self._max_backlog = max_backlog
        self._dirty: dict[str, int] = {}
        """Session key → writes of it waiting in the backlog."""
        self._up = shared is not None
        self._slow = 0
        """Slow calls in a row."""
        self._queue: asyncio.Queue[Sequence[Write]] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._pending = asyncio.Event()
        """Set while the backlog holds writes to send again."""
        self._secret: bytes | None = None
        """The tenant-hash key this replica uses, when the store keeps it for every replica:
        put back if the store comes back without it, so a replica started later agrees."""
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
                self._secret, _ = await asyncio.wait_for(
                    shared.shared_secret(secrets.token_bytes(32)), self._timeout * OFF_PATH)
                return self._secret
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
        self._recovery = asyncio.create_task(self._recover(), name="state-backlog")

    async def stop(self) -> None:
        """Drain what is queued, then what waits in the backlog (a write that timed out), each
        bounded, then stop: a replica that stops takes no lock with it while the store
        answers."""
        if self._queue is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout=STOP_SECONDS)
        for task in (self._writer_task, self._recovery):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._writer_task = self._recovery = None
        if self.shared is not None:
            if self._backlog and self._up:
                try:
                    await asyncio.wait_for(self._send_backlog(), timeout=STOP_SECONDS)
                except Exception as exc:
                    log.warning("stopping with %d write batches the store did not take (%s)",
                                len(self._backlog), type(exc).__name__)
            await self.shared.close()

    def prefetch(self, query: Query) -> asyncio.Task[Facts] | None:
        """Start loading ``query``'s facts now (the request headers named the session), so
        the round trip overlaps Envoy buffering the body; None without a shared store, where
        a load is immediate anyway."""
        if self.shared is None or not self._up:
            return None
        return asyncio.create_task(self.load(query), name="state-prefetch")

    async def load(self, query: Query) -> Facts:
        local = self.local.load_now(query)
        if self.shared is None or not self._up:
            return local
        shared = await self._call("load", self.shared.load(query), self._timeout)
        if shared is None:
            return local
        return self._merge(query, shared, local)

    async def apply(self, writes: Sequence[Write]) -> Applied:
        """Write now: an answer waits for this (the owners of the ids it carries), at most
        ``OFF_PATH`` times ``timeout``: a lock outweighs the answer's milliseconds, and a
        store that slow three times in a row is marked down."""
        if not writes:
            return Applied()
        now = self._clock()
        applied = self.local.apply_now(writes, now)
        if self.shared is None:
            return applied
        if not self._up:
            self._defer(writes, lost=True)
            return applied
        shared = await self._call("apply", self.shared.apply(writes, now),
                                  self._timeout * OFF_PATH)
        if shared is None:
            self._defer(writes, lost=not self._up)
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
            self._defer(writes, lost=True)
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

    async def _call(self, op: str, call: Awaitable[T], timeout: float) -> T | None:
        """Await ``call`` within ``timeout``; None on failure (the store marked down on a
        connection failure, or on too many slow calls in a row)."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):  # in this task: no task made per call
                result = await call
        except TimeoutError:
            self._metrics.store_errors.labels(op, "TimeoutError").inc()
            self._slow += 1
            if self._slow >= TRIP_TIMEOUTS:
                self._down(f"{op}: {self._slow} slow calls in a row")
            return None
        except Exception as exc:
            self._metrics.store_errors.labels(op, type(exc).__name__).inc()
            self._down(f"{op}: {type(exc).__name__}: {exc}")
            return None
        self._slow = 0
        self._metrics.store_seconds.labels(op).observe(time.perf_counter() - started)
        return result

    def _defer(self, writes: Sequence[Write], *, lost: bool) -> None:
        """Keep ``writes`` to send again; ``lost`` ones never reached the store, so their
        sessions are served from the local copy until they have."""
        if len(self._backlog) >= self._max_backlog:
            dropped, _ = self._backlog.popleft()
            self._undirty(dropped)
            self._metrics.store_dropped.inc()
        self._backlog.append((writes, lost))
        if lost:
            for write in writes:
                key = session_of(write)
                if key is not None:
                    self._dirty[key] = self._dirty.get(key, 0) + 1
        self._pending.set()
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
        self._pending.set()

    async def _recover(self) -> None:
        """Whenever the backlog holds writes: if the store is down, ping it with backoff and,
        once it answers, seed it with the local records of the sessions written meanwhile
        (where it lost them: a restart without persistence); then send the backlog again in
        order (idempotent: the seeds already hold those turns) and mark the store up."""
        assert self.shared is not None
        delay = BACKOFF_START
        while True:
            await self._pending.wait()
            try:
                if not self._up:
                    await asyncio.wait_for(self.shared.ping(), self._timeout * 4)
                    await self._reseed()
                await self._send_backlog()
            except Exception as exc:
                self._metrics.store_errors.labels("recover", type(exc).__name__).inc()
                await asyncio.sleep(delay)
                delay = min(BACKOFF_MAX, delay * 2)
                continue
            delay = BACKOFF_START
            self._pending.clear()
            if not self._up:
                self._up, self._slow = True, 0
                self._metrics.store_up.set(1)
                log.info("shared store back; backlog written")

    async def _send_backlog(self) -> None:
        """The backlog to the store, oldest first, each batch removed once it landed."""
        assert self.shared is not None
        while self._backlog:
            batch, _ = self._backlog[0]
            await asyncio.wait_for(self.shared.apply(batch, self._clock()),
                                   self._timeout * OFF_PATH)
            self._backlog.popleft()
            self._undirty(batch)
            self._metrics.store_backlog.set(len(self._backlog))

    async def _reseed(self) -> None:
        """Seed the store that came back: with the records of the sessions written while it
        was away, or — when it lost everything (its tenant secret is gone: a restart without
        persistence) — with every record and owner this replica knows, and the secret, so a
        replica started later finds the locks and agrees on tenants."""
        assert self.shared is not None
        wiped = False
        if self._secret is not None and isinstance(self.shared, RedisStore):
            _, wiped = await asyncio.wait_for(self.shared.shared_secret(self._secret),
                                              self._timeout * OFF_PATH)
        if wiped:
            records, owners = self.local.everything()
            log.warning("shared store came back empty: seeding %d sessions and %d owners",
                        len(records), len(owners))
        else:
            records = {key: record for key in self._dirty
                       if (record := self.local.record(key)) is not None}
            owners = {}
        batches = 1 + (len(records) + len(owners)) // 500
        await asyncio.wait_for(self.shared.seed(records, owners),
                               self._timeout * OFF_PATH * batches)

    async def _writer(self) -> None:
        """Sends what ``send`` queued, in order; off the request path, so it waits longer.
        What queued while a call was out goes in the next one, whole (up to
        ``MAX_SEND_BATCH`` sends): a busy session's turns share one compare-and-set."""
        assert self._queue is not None and self.shared is not None
        while True:
            batch = await self._queue.get()
            writes, taken = list(batch), 1
            # A store's call writes records before it forgets: a send after a Forget waits.
            while (taken < MAX_SEND_BATCH and not self._queue.empty()
                   and not any(isinstance(w, Forget) for w in batch)):
                batch = self._queue.get_nowait()
                writes += batch
                taken += 1
            try:
                sent = None
                if self._up:
                    sent = await self._call("send", self.shared.apply(writes, self._clock()),
                                            self._timeout * OFF_PATH)
                if sent is None:
                    self._defer(writes, lost=not self._up)
            finally:
                for _ in range(taken):
                    self._queue.task_done()
