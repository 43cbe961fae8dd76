"""Replay records in the shared store (``state.store: redis``), so the ``x-replay-id`` a client
got from one replica resolves on every other.

Writing never touches the request path: ``SharedReplay`` is a ``RecordListener`` that only
marks a record pending (a dict insert); one background task writes the pending records every
``flush_seconds`` in one pipelined round trip, each record once however often its outcome grew
meanwhile. The queue is bounded (``max_pending``: beyond, the oldest wait is dropped and
counted), and so is the store: every key expires after ``ttl_seconds``, and a session's id list
keeps its newest ``session_records``. Keys sit beside the state layer's, on its server
(``{prefix}:v1:r:{id}`` the record as JSON, ``…:rs:{tenant}/{session}`` the session's ids,
``…:rt:{session}`` the tenants that used that session id, for the admin's lookup).

``ReplayLookup`` reads the local store first, then the shared one; a session's records are the
union of both (its turns may have been routed by several replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import orjson

from ..state.cluster import ClusterUrl, is_cluster_url
from .metrics import Metrics
from .replay import Record, ReplayStore, SessionKey, session_key

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

log = logging.getLogger(__name__)

SCHEMA = "v1"
TIMEOUT_SECONDS = 2.0
"""Per round trip: off the request path, so it can wait longer than the state layer does."""
BATCH = 500


def connect(url: str) -> Redis | RedisCluster:
    """redis-py's client of the state store at ``url`` (a cluster's for ``redis+cluster://``,
    its seeds the nodes the URL names)."""
    if is_cluster_url(url):
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        parsed = ClusterUrl.parse(url)
        return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in parsed.seeds],
                            username=parsed.username, password=parsed.password, ssl=parsed.tls)
    from redis.asyncio import Redis

    return Redis.from_url(url, decode_responses=False)


class SharedReplay:
    def __init__(
        self,
        redis: Redis | RedisCluster,
        metrics: Metrics,
        *,
        prefix: str,
        ttl_seconds: float,
        session_records: int,
        flush_seconds: float,
        max_pending: int,
    ) -> None:
        self._redis = redis
        self._metrics = metrics
        self._prefix = f"{prefix}:{SCHEMA}:"
        self._ttl_ms = int(ttl_seconds * 1000)
        self._session_records = session_records
        self._flush_seconds = flush_seconds
        self._max_pending = max_pending
        self._pending: OrderedDict[str, tuple[Record, bool]] = OrderedDict()
        """replay id → (the record, still to be added to its session's list)."""
        self._task: asyncio.Task[None] | None = None

    # -- RecordListener ----------------------------------------------------------------------

    def recorded(self, record: Record) -> None:
        self._mark(record, new=True)

    def completed(self, record: Record) -> None:
        self._mark(record, new=False)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="replay-shared-writer")

    async def stop(self) -> None:
        """Write what is pending (one bounded try), then close the connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while self._pending and await self.flush():
            pass
        await self._redis.aclose()

    async def flush(self) -> bool:
        """Write up to ``BATCH`` pending records; False when the store did not take them."""
        batch = [self._pending.popitem(last=False) for _ in range(min(BATCH, len(self._pending)))]
        if not batch:
            return True
        pipe = self._redis.pipeline(transaction=False)
        for replay_id, (record, new) in batch:
            pipe.set(self._key("r", replay_id), orjson.dumps(record), px=self._ttl_ms)
            key = session_key(record)
            if new and key is not None:
                ids = self._session_list(key)
                pipe.rpush(ids, replay_id)
                pipe.ltrim(ids, -self._session_records, -1)
                pipe.pexpire(ids, self._ttl_ms)
                tenants = self._key("rt", key[1])
                pipe.sadd(tenants, key[0])
                pipe.pexpire(tenants, self._ttl_ms)
        started = time.perf_counter()
        try:
            await asyncio.wait_for(pipe.execute(), TIMEOUT_SECONDS)
        except Exception as exc:
            self._metrics.store_errors.labels("replay_write", type(exc).__name__).inc()
            for replay_id, (record, new) in reversed(batch):
                self._requeue(replay_id, record, new)
            return False
        self._metrics.store_seconds.labels("replay_write").observe(time.perf_counter() - started)
        return True

    # -- reads -------------------------------------------------------------------------------

    async def get(self, replay_id: str) -> Record | None:
        data = await asyncio.wait_for(self._redis.get(self._key("r", replay_id)),
                                      TIMEOUT_SECONDS)
        return None if data is None else orjson.loads(data)

    async def for_session(self, session_id: str, tenant: str | None) -> list[Record]:
        """``tenant``'s records of the session (every tenant's when None), in time order."""
        tenants: list[str]
        if tenant is not None:
            tenants = [tenant]
        else:
            members = await asyncio.wait_for(
                self._redis.smembers(self._key("rt", session_id)), TIMEOUT_SECONDS)
            tenants = sorted(m.decode() if isinstance(m, bytes) else m for m in members)
        pipe = self._redis.pipeline(transaction=False)
        for name in tenants:
            pipe.lrange(self._session_list((name, session_id)), 0, -1)
        lists = await asyncio.wait_for(pipe.execute(), TIMEOUT_SECONDS) if tenants else []
        ids = [i.decode() for found in lists for i in found]
        if not ids:
            return []
        pipe = self._redis.pipeline(transaction=False)  # a cluster's keys sit in many slots
        for i in ids:
            pipe.get(self._key("r", i))
        values = await asyncio.wait_for(pipe.execute(), TIMEOUT_SECONDS)
        records = [orjson.loads(v) for v in values if v is not None]
        return sorted(records, key=lambda r: r["time"])

    # -- internals ---------------------------------------------------------------------------

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}{kind}:{name}"

    def _session_list(self, key: SessionKey) -> str:
        return self._key("rs", f"{key[0]}/{key[1]}")

    def _mark(self, record: Record, *, new: bool) -> None:
        replay_id = record["replay_id"]
        queued = self._pending.get(replay_id)
        if queued is not None:
            self._pending[replay_id] = (record, queued[1] or new)
            return
        self._pending[replay_id] = (record, new)
        if len(self._pending) > self._max_pending:
            self._pending.popitem(last=False)
            self._metrics.replay_dropped.inc()

    def _requeue(self, replay_id: str, record: Record, new: bool) -> None:
        """Put a batch that failed back at the head of the queue, while there is room."""
        queued = self._pending.get(replay_id)
        if queued is not None:  # marked again meanwhile: that write carries the newest record
            self._pending[replay_id] = (record, queued[1] or new)
            return
        if len(self._pending) >= self._max_pending:
            self._metrics.replay_dropped.inc()
            return
        self._pending[replay_id] = (record, new)
        self._pending.move_to_end(replay_id, last=False)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._flush_seconds)
            try:
                while self._pending and await self.flush():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("writing replay records to the shared store failed; retrying")


class ReplayLookup:
    """Replay records where they are: this replica's store first, then the shared one."""

    def __init__(self, local: ReplayStore, shared: SharedReplay | None = None) -> None:
        self.local = local
        self.shared = shared

    async def get(self, replay_id: str) -> Record | None:
        found = self.local.get(replay_id)
        if found is not None or self.shared is None:
            return found
        try:
            return await self.shared.get(replay_id)
        except Exception as exc:
            log.warning("replay lookup in the shared store failed: %s", exc)
            return None

    async def for_session(self, session_id: str, tenant: str | None) -> list[Record]:
        local = self.local.for_session(session_id, tenant)
        if self.shared is None:
            return local
        try:
            shared = await self.shared.for_session(session_id, tenant)
        except Exception as exc:
            log.warning("replay lookup in the shared store failed: %s", exc)
            return local
        merged = {r["replay_id"]: r for r in shared}
        merged.update((r["replay_id"], r) for r in local)
        return sorted(merged.values(), key=lambda r: r["time"])
