"""The shared store: router state in Redis or Valkey, for several replicas and restarts.

Keys are namespaced and versioned (``{prefix}:v1:…``) and every one expires: a session record
is a hash ``{v: version, d: record}`` that lives ``session_ttl`` after its last write; each owned
id is its own string key (tenant-scoped) that lives ``owner_ttl``. Two Lua scripts make each call
one round trip:

* ``load`` reads the session's record and the owners of the request's ids, and resolves a
  chain (a ``previous_response_id`` with no session header) to its session's record;
* ``apply`` writes session records by compare-and-set on their version, claims ids and forgets
  sessions. A record whose version moved (another replica wrote) comes back in the reply, the
  writes are re-applied on it (``records.apply``: deltas, idempotent per replay id) and sent
  again, so racing replicas never undo a lock or count a switch twice.

Redis Cluster is not supported (the scripts touch keys they derive); a primary with replicas
behind Sentinel or a managed endpoint is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from .records import (
    Claim,
    Commit,
    Finish,
    Forget,
    Owner,
    SessionRecord,
    Write,
    apply,
    pack_owner,
    pack_record,
    unpack_owner,
    unpack_record,
)
from .resp import RespClient
from .store import Applied, Facts, Query

SCHEMA = "v1"
MAX_CAS_ATTEMPTS = 16
"""Rounds of compare-and-set before giving up (the layer then keeps the writes for later):
this replica's own writes to a session are serialised, so only other replicas race."""

_LOAD = """
local sp, op = ARGV[1], ARGV[2]
local chain = tonumber(ARGV[3])
local out = {}
for i = 2, #KEYS do out[#out + 1] = redis.call('GET', op .. KEYS[i]) or '' end
local key = KEYS[1]
if key == '' and chain > 0 and out[chain] ~= '' then
  local owner = out[chain]
  local stop = string.find(owner, '\\0', 1, true)
  if stop and stop > 1 then key = string.sub(owner, 1, stop - 1) end
end
local record = {'0', ''}
if key ~= '' then
  local found = redis.call('HMGET', sp .. key, 'v', 'd')
  if found[1] then record = {found[1], found[2]} end
end
return {key, record[1], record[2], unpack(out)}
"""

_APPLY = """
local sp, op = ARGV[1], ARGV[2]
local sttl, ottl = ARGV[3], ARGV[4]
local n, m, k = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local a = 8
local conflicts = {}
for i = 1, n do
  local key = sp .. KEYS[i]
  local current = redis.call('HGET', key, 'v') or '0'
  if current == ARGV[a] then
    redis.call('HSET', key, 'v', ARGV[a + 1], 'd', ARGV[a + 2])
    redis.call('PEXPIRE', key, sttl)
  else
    conflicts[#conflicts + 1] = tostring(i)
    conflicts[#conflicts + 1] = current
    conflicts[#conflicts + 1] = redis.call('HGET', key, 'd') or ''
  end
  a = a + 3
end
for j = 1, m do
  redis.call('SET', op .. KEYS[n + j], ARGV[a], 'PX', ottl)
  a = a + 1
end
for j = 1, k do redis.call('DEL', sp .. KEYS[n + m + j]) end
return conflicts
"""


_SEED = """
local sp, op, sttl, ottl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = tonumber(ARGV[5])
for i = 1, #KEYS do
  if i <= n then
    local key = sp .. KEYS[i]
    if redis.call('EXISTS', key) == 0 then
      redis.call('HSET', key, 'v', '1', 'd', ARGV[5 + i])
      redis.call('PEXPIRE', key, sttl)
    end
  else
    redis.call('SET', op .. KEYS[i], ARGV[5 + i], 'NX', 'PX', ottl)
  end
end
return #KEYS
"""
SEED_BATCH = 500
"""Keys per seeding script: a long script would hold up every other client of the store."""


class RedisStore:
    """``Store`` over Redis / Valkey (``redis://`` or ``rediss://`` URL)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        session_ttl: float,
        owner_ttl: float,
        max_known: int = 100_000,
    ) -> None:
        self._redis = RespClient(url)
        self._session_prefix = f"{prefix}:{SCHEMA}:s:"
        self._owner_prefix = f"{prefix}:{SCHEMA}:o:"
        self._ttls = (str(int(session_ttl * 1000)), str(int(owner_ttl * 1000)))
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        """Session key → its lock and how many writers hold or wait for it."""
        self._known: OrderedDict[str, SessionRecord | None] = OrderedDict()
        """What this store last read or wrote of each session: the base of the next
        compare-and-set, so the usual write needs no read first."""
        self._max_known = max_known

    async def load(self, query: Query) -> Facts:
        keys = [query.session or "", *query.ids]
        chain = query.ids.index(query.chain) + 1 if query.chain in query.ids else 0
        reply = await self._redis.script(
            _LOAD, keys, [self._session_prefix, self._owner_prefix, chain]
        )
        key = reply[0].decode() or None
        record = _record(reply[1], reply[2])
        owners = {k: unpack_owner(v) for k, v in zip(query.ids, reply[3:], strict=True) if v}
        if key is not None:
            self._remember(key, record)
        return Facts(key, None if record is None else record.copy(), owners)

    async def apply(self, writes: Sequence[Write], now: float) -> Applied:
        keys = sorted({w.turn.session_key for w in writes
                       if isinstance(w, Commit | Finish) and w.turn.session_key is not None})
        async with self._serialised(keys):
            return await self._apply_all(writes, now)

    @contextlib.asynccontextmanager
    async def _serialised(self, keys: list[str]) -> AsyncIterator[None]:
        """Hold this replica's lock of every session in ``keys`` (in order: no deadlock)."""
        taken: list[str] = []
        acquired: set[str] = set()
        try:
            for key in keys:
                lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
                users[0] += 1
                taken.append(key)
                await lock.acquire()
                acquired.add(key)
            yield
        finally:
            for key in reversed(taken):
                lock, users = self._locks[key]
                if key in acquired:
                    lock.release()
                users[0] -= 1
                if not users[0]:
                    del self._locks[key]

    async def _apply_all(self, writes: Sequence[Write], now: float) -> Applied:
        sessions: OrderedDict[str, list[Commit | Finish]] = OrderedDict()
        claims: list[tuple[str, bytes]] = []
        forgets: list[str] = []
        for write in writes:
            if isinstance(write, Commit | Finish):
                if write.turn.session_key is not None:
                    sessions.setdefault(write.turn.session_key, []).append(write)
            elif isinstance(write, Claim):
                owner = pack_owner(write.owner)
                claims.extend((key, owner) for key in write.keys)
            elif isinstance(write, Forget):
                forgets.append(write.session_key)
        bases = {key: self._known.get(key) for key in sessions}
        switches: list[tuple[str, str]] = []
        for _ in range(MAX_CAS_ATTEMPTS):
            planned = {key: _planned(bases[key], batch, now) for key, batch in sessions.items()}
            args: list[Any] = [self._session_prefix, self._owner_prefix, *self._ttls,
                               len(planned), len(claims), len(forgets)]
            for key, (record, _) in planned.items():
                base = bases[key]
                args += [str(base.version if base else 0), str(record.version),
                         pack_record(record)]
            args += [owner for _, owner in claims]
            keys = [*planned, *(key for key, _ in claims), *forgets]
            conflicts = await self._redis.script(_APPLY, keys, args)
            names = list(planned)
            lost = {names[int(conflicts[i]) - 1]: _record(conflicts[i + 1], conflicts[i + 2])
                    for i in range(0, len(conflicts), 3)}
            for key, (record, moved) in planned.items():
                if key not in lost:
                    self._remember(key, record)
                    switches += moved
            for key in forgets:
                self._remember(key, None)
            if not lost:
                return Applied(tuple(switches))
            # Another replica wrote first: re-apply just the losing sessions on what it wrote.
            sessions = OrderedDict((key, sessions[key]) for key in lost)
            bases = lost
            claims, forgets = [], []
        raise RuntimeError(f"compare-and-set kept losing on {list(sessions)}")

    async def seed(
        self, records: Mapping[str, SessionRecord], owners: Mapping[str, Owner] | None = None
    ) -> None:
        sessions = list(records.items())
        claims = list((owners or {}).items())
        while sessions or claims:
            batch, sessions = sessions[:SEED_BATCH], sessions[SEED_BATCH:]
            room = SEED_BATCH - len(batch)
            more, claims = claims[:room], claims[room:]
            args: list[Any] = [self._session_prefix, self._owner_prefix, *self._ttls, len(batch),
                               *(pack_record(r) for _, r in batch),
                               *(pack_owner(o) for _, o in more)]
            await self._redis.script(_SEED, [k for k, _ in batch] + [k for k, _ in more], args)
            for key, _ in batch:
                self._known.pop(key, None)  # the next write reads what is there now

    async def shared_secret(self, fresh: bytes) -> tuple[bytes, bool]:
        """The secret every replica keys tenant hashes with (``fresh`` if none is kept yet),
        and whether it was missing: a store without it lost everything it held."""
        key = f"{self._session_prefix[: -len('s:')]}secret"
        created = await self._redis.call("SET", key, fresh, "NX")
        kept = await self._redis.call("GET", key)
        return (kept if isinstance(kept, bytes) and kept else fresh), created is not None

    async def ping(self) -> None:
        await self._redis.call("PING")

    async def close(self) -> None:
        await self._redis.close()

    def _remember(self, key: str, record: SessionRecord | None) -> None:
        self._known[key] = record
        self._known.move_to_end(key)
        while len(self._known) > self._max_known:
            self._known.popitem(last=False)


def _record(version: bytes, data: bytes) -> SessionRecord | None:
    return unpack_record(data, int(version)) if data else None


def _planned(
    base: SessionRecord | None, batch: list[Commit | Finish], now: float
) -> tuple[SessionRecord, list[tuple[str, str]]]:
    """``base`` with ``batch`` applied, one version up, and the switches the batch made."""
    record = base
    switches: list[tuple[str, str]] = []
    for write in batch:
        before = record.model if record is not None else None
        record, moved = apply(record, write, now)
        if moved and before is not None:
            switches.append((before, record.model))
    assert record is not None
    record.version = (base.version if base else 0) + 1
    return record, switches

