"""Replay records in the shared store (``state.store: redis``), so the ``x-replay-id`` a client
got from one replica resolves on every other.

Writing never touches the request path: ``SharedReplay`` is a ``RecordListener`` that only
marks a record pending (a dict insert); one background task writes the pending records every
``flush_seconds`` in one pipelined round trip, each record once however often its outcome grew
meanwhile. The queue is bounded (``max_pending``: beyond, the oldest wait is dropped and
counted), and so is the store: every key expires after ``ttl_seconds``, and a session's id list
keeps its newest ``session_records``. Keys sit beside the state layer's, on its server
(``{prefix}:v1:r:{id}`` the record as JSON, ``…:rs:{tenant}/{session}`` the session's ids,
``…:rt:{session}`` the tenants that used that session id, for the admin's lookup;
``…:sl:{tenant}/{session}`` each record's ``LINE_FIELDS`` by id, what a session's summary
reads; ``…:ss`` and ``…:st:{tenant}`` the sessions by their last record's time, newest kept:
the web view's list).

``ReplayLookup`` reads the local store first, then the shared one; a session's records are the
union of both (its turns may have been routed by several replicas), and so is the list of
recent sessions (each replica lists every replica's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

import orjson

from ..state.cluster import ClusterClient
from ..state.resp import Arg, Command, RespClient, checked
from .metrics import Metrics
from .replay import Record, ReplayStore, SessionKey, session_key

log = logging.getLogger(__name__)

SCHEMA = "v1"
TIMEOUT_SECONDS = 2.0
"""Per round trip: off the request path, so it can wait longer than the state layer does."""
BATCH = 500
RECENT_SESSIONS = 10_000
"""Sessions the recent-sessions index keeps (the newest), besides its TTL."""
LINE_FIELDS = ("replay_id", "time", "session", "model", "decision", "phase", "action", "lock",
               "reset")
"""What a session's summary needs of a record (``observability.sessions.summarize``), kept
per record beside it: listing sessions reads these, never whole records."""
OUTCOME_FIELDS = ("status", "aborted", "usage")


def line(record: Record) -> Record:
    """The part of a record a session's summary reads."""
    out = {k: record.get(k) for k in LINE_FIELDS}
    outcome = record.get("outcome") or {}
    out["outcome"] = {k: outcome[k] for k in OUTCOME_FIELDS if k in outcome}
    return out


class SharedReplay:
    def __init__(
        self,
        server: RespClient | ClusterClient,
        metrics: Metrics,
        *,
        prefix: str,
        ttl_seconds: float,
        session_records: int,
        flush_seconds: float,
        max_pending: int,
    ) -> None:
        """``server``: the store's lean client (``state.cluster.connect``), a connection of
        its own, so a batch of records never queues ahead of the state layer's calls."""
        self._server = server
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
            self._task = asyncio.create_task(self._run_writer(), name="replay-shared-writer")

    async def stop(self) -> None:
        """Write what is pending (one bounded try), then close the connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while self._pending and await self.flush():
            pass
        await self._server.close()

    async def flush(self) -> bool:
        """Write up to ``BATCH`` pending records in one round trip; False when the store did
        not take them. A session's several records in a batch share its commands (one
        ``HSET`` of their lines, one ``RPUSH`` of their ids, one expiry each)."""
        batch = [self._pending.popitem(last=False) for _ in range(min(BATCH, len(self._pending)))]
        if not batch:
            return True
        ttl = self._ttl_ms
        commands: list[tuple[str, Command]] = []
        lines: dict[str, list[Arg]] = {}
        ids: dict[str, list[Arg]] = {}
        tenants: dict[str, dict[str, None]] = {}
        recent: dict[str, dict[bytes, float]] = {}
        for replay_id, (record, new) in batch:
            stored = self._key("r", replay_id)
            commands.append((stored, ("SET", stored, orjson.dumps(record), "PX", ttl)))
            key = session_key(record)
            if key is None:
                continue
            lines.setdefault(self._key("sl", f"{key[0]}/{key[1]}"), []).extend(
                (replay_id, orjson.dumps(line(record))))
            if new:
                ids.setdefault(self._session_list(key), []).append(replay_id)
                tenants.setdefault(self._key("rt", key[1]), {})[key[0]] = None
                member = orjson.dumps(list(key))
                for index in (self._key("ss", ""), self._key("st", key[0])):
                    stamps = recent.setdefault(index, {})
                    stamps[member] = max(stamps.get(member, 0.0), float(record["time"]))
        for name, fields in lines.items():
            commands += [(name, ("HSET", name, *fields)), (name, ("PEXPIRE", name, ttl))]
        for name, added in ids.items():
            commands += [(name, ("RPUSH", name, *added)),
                         (name, ("LTRIM", name, -self._session_records, -1)),
                         (name, ("PEXPIRE", name, ttl))]
        for name, members in tenants.items():
            commands += [(name, ("SADD", name, *members)), (name, ("PEXPIRE", name, ttl))]
        oldest = time.time() - ttl / 1000
        for index, stamps in recent.items():
            scored = [arg for member, stamp in stamps.items() for arg in (stamp, member)]
            commands += [
                (index, ("ZADD", index, "GT", *scored)),  # another replica's newer turn stays
                (index, ("ZREMRANGEBYSCORE", index, "-inf", oldest)),
                (index, ("ZREMRANGEBYRANK", index, 0, -RECENT_SESSIONS - 1)),
                (index, ("PEXPIRE", index, ttl)),
            ]
        started = time.perf_counter()
        try:
            await self._run(commands)
        except Exception as exc:
            self._metrics.store_errors.labels("replay_write", type(exc).__name__).inc()
            for replay_id, (record, new) in reversed(batch):
                self._requeue(replay_id, record, new)
            return False
        self._metrics.store_seconds.labels("replay_write").observe(time.perf_counter() - started)
        return True

    # -- reads -------------------------------------------------------------------------------

    async def get(self, replay_id: str) -> Record | None:
        key = self._key("r", replay_id)
        (data,) = await self._run([(key, ("GET", key))])
        return None if data is None else orjson.loads(data)

    async def for_session(self, session_id: str, tenant: str | None) -> list[Record]:
        """``tenant``'s records of the session (every tenant's when None), in time order."""
        tenants: list[str]
        if tenant is not None:
            tenants = [tenant]
        else:
            key = self._key("rt", session_id)
            (members,) = await self._run([(key, ("SMEMBERS", key))])
            tenants = sorted(m.decode() for m in members)
        if not tenants:
            return []
        lists = await self._run([(key, ("LRANGE", key, 0, -1)) for key in
                                 (self._session_list((name, session_id)) for name in tenants)])
        keys = [self._key("r", i.decode()) for found in lists for i in found]
        if not keys:
            return []
        values = await self._run([(key, ("GET", key)) for key in keys])
        records = [orjson.loads(v) for v in values if v is not None]
        return sorted(records, key=lambda r: r["time"])

    async def recent_sessions(self, tenant: str | None, limit: int) -> list[
            tuple[SessionKey, float]]:
        """The most recently active sessions first, with their last record's time
        (``tenant``'s only unless None)."""
        index = self._key("ss", "") if tenant is None else self._key("st", tenant)
        (found,) = await self._run([(index, ("ZREVRANGE", index, 0, limit - 1, "WITHSCORES"))])
        out: list[tuple[SessionKey, float]] = []
        for member, score in zip(found[::2], found[1::2], strict=True):
            tenant_id, session_id = orjson.loads(member)
            out.append(((str(tenant_id), str(session_id)), float(score)))
        return out

    async def session_lines(self, keys: list[SessionKey]) -> dict[SessionKey, list[Record]]:
        """Each session's record lines (``line``), in time order, in one round trip."""
        if not keys:
            return {}
        names = [self._key("sl", f"{key[0]}/{key[1]}") for key in keys]
        found = await self._run([(name, ("HGETALL", name)) for name in names])
        return {key: sorted((orjson.loads(v) for v in fields[1::2]), key=lambda r: r["time"])
                for key, fields in zip(keys, found, strict=True)}

    # -- internals ---------------------------------------------------------------------------

    async def _run(self, commands: list[tuple[str, Command]]) -> list[Any]:
        """The replies of ``commands`` (one round trip per server), within the time-out; an
        error reply raises."""
        return checked(await asyncio.wait_for(self._server.execute(commands), TIMEOUT_SECONDS))

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

    async def _run_writer(self) -> None:
        """Every ``flush_seconds``, what is pending then (in batches of ``BATCH``): records
        marked while a batch is out wait for the next period, or under load the writer would
        flush without pause, a few records a round trip."""
        while True:
            await asyncio.sleep(self._flush_seconds)
            try:
                due = len(self._pending)
                while due > 0 and await self.flush():
                    due -= BATCH
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
        return _merged(shared, local)

    async def sessions(self, tenant: str | None, limit: int) -> list[list[Record]]:
        """The most recently active sessions first (``tenant``'s only unless None), each as
        its records in time order: every replica's through the shared store (a summary's
        lines there), this replica's whole. Without a shared store: this replica's."""
        local = {key: self.local.for_session(key[1], key[0])
                 for key in self.local.sessions(tenant, limit)}
        if self.shared is None:
            return [records for records in local.values() if records]
        try:
            recent = await self.shared.recent_sessions(tenant, limit)
            keys = [key for key, _ in recent]
            lines = await self.shared.session_lines(keys)
        except Exception as exc:
            log.warning("listing sessions from the shared store failed: %s", exc)
            return [records for records in local.values() if records]
        merged = [_merged(lines.get(key, []), local.get(key, []))
                  for key in dict.fromkeys([*keys, *local])]
        merged = [records for records in merged if records]
        merged.sort(key=lambda records: records[-1]["time"], reverse=True)
        return merged[:limit]


def _merged(shared: list[Record], local: list[Record]) -> list[Record]:
    """Both lists' records by id (this replica's copy wins: it is the freshest), in time
    order."""
    merged = {r["replay_id"]: r for r in shared}
    merged.update((r["replay_id"], r) for r in local)
    return sorted(merged.values(), key=lambda r: r["time"])
