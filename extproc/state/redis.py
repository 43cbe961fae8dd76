"""The shared store: router state in Redis or Valkey, for several replicas and restarts.

Keys are namespaced and versioned (``{prefix}:v1:…``) and every one expires: a session record
is a hash ``{v: version, d: record}`` that lives ``session_ttl`` after its last write; each owned
id is its own string key (tenant-scoped) that lives ``owner_ttl``. On one server, two Lua
scripts make each call one round trip:

* ``load`` reads the session's record and the owners of the request's ids, and resolves a
  chain (a ``previous_response_id`` with no session header) to its session's record;
* ``apply`` writes session records by compare-and-set on their version, claims ids and forgets
  sessions. A record whose version moved (another replica wrote) comes back in the reply, the
  writes are re-applied on it (``records.apply``: deltas, idempotent per replay id) and sent
  again, so racing replicas never undo a lock or count a switch twice.

In a Redis / Valkey Cluster (``redis+cluster://``) a script may touch one slot only, so keys
carry hash tags — ``…:s:{tenant/session}``, ``…:o:{tenant/id}``: a session's record is found
from the session, an owner from its id alone — and each call is split by slot, every primary
asked at once (``cluster``): a load reads the record and the owners in one round trip (a chain
takes two: its owner, then its session's record); an apply runs the same compare-and-set
script once per slot it writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from .cluster import ClusterClient, connect, key_slot
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
from .resp import Arg, Command, Script, checked
from .store import Applied, Facts, Query

SCHEMA = "v1"
MAX_CAS_ATTEMPTS = 16
"""Rounds of compare-and-set before giving up (the layer then keeps the writes for later):
this replica's own writes to a session are serialised, so only other replicas race."""

_LOAD = Script("""
local out = {}
for i = 2, #KEYS do out[#out + 1] = redis.call('GET', KEYS[i]) or '' end
local key, chained = KEYS[1], ''
local chain = tonumber(ARGV[2])
if key == '' and chain > 0 and out[chain] ~= '' then
  local owner = out[chain]
  local stop = string.find(owner, '\\0', 1, true)
  if stop and stop > 1 then
    chained = string.sub(owner, 1, stop - 1)
    key = ARGV[1] .. chained
  end
end
local record = {'0', ''}
if key ~= '' then
  local found = redis.call('HMGET', key, 'v', 'd')
  if found[1] then record = {found[1], found[2]} end
end
return {chained, record[1], record[2], unpack(out)}
""")
"""One server only: a chain's session key is read from its owner, inside the script."""

_APPLY = Script("""
local sttl, ottl = ARGV[1], ARGV[2]
local n, m, k = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local a = 6
local conflicts = {}
for i = 1, n do
  local key = KEYS[i]
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
  redis.call('SET', KEYS[n + j], ARGV[a], 'PX', ottl)
  a = a + 1
end
for j = 1, k do redis.call('DEL', KEYS[n + m + j]) end
return conflicts
""")


_SEED = Script("""
local sttl, ottl = ARGV[1], ARGV[2]
local n = tonumber(ARGV[3])
for i = 1, #KEYS do
  if i <= n then
    if redis.call('EXISTS', KEYS[i]) == 0 then
      redis.call('HSET', KEYS[i], 'v', '1', 'd', ARGV[3 + i])
      redis.call('PEXPIRE', KEYS[i], sttl)
    end
  else
    redis.call('SET', KEYS[i], ARGV[3 + i], 'NX', 'PX', ottl)
  end
end
return #KEYS
""")
SEED_BATCH = 500
"""Keys per seeding script: a long script would hold up every other client of the store."""


@dataclass(slots=True)
class _Group:
    """The writes of one script: all of them on one server, or those of one slot."""

    sessions: list[tuple[str, str, list[Arg]]] = field(default_factory=list)
    """(session key, its store key, [base version, version, packed record])."""
    claims: list[tuple[str, bytes]] = field(default_factory=list)
    forgets: list[str] = field(default_factory=list)

    def command(self, ttls: tuple[str, str]) -> tuple[str, Command]:
        keys = [*(key for _, key, _ in self.sessions), *(key for key, _ in self.claims),
                *self.forgets]
        args: list[Arg] = [*ttls, len(self.sessions), len(self.claims), len(self.forgets)]
        for _, _, cas in self.sessions:
            args += cas
        args += [owner for _, owner in self.claims]
        return keys[0], _APPLY.command(keys, args)


class RedisStore:
    """``Store`` over Redis / Valkey: one server (``redis://``, ``rediss://``, ``unix://``) or
    a cluster (``redis+cluster://``, ``rediss+cluster://``)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        session_ttl: float,
        owner_ttl: float,
        max_known: int = 100_000,
    ) -> None:
        self._server = connect(url)
        self._cluster = self._server if isinstance(self._server, ClusterClient) else None
        self._session_prefix = f"{prefix}:{SCHEMA}:s:"
        self._owner_prefix = f"{prefix}:{SCHEMA}:o:"
        self._secret_key = f"{prefix}:{SCHEMA}:secret"
        self._ttls = (str(int(session_ttl * 1000)), str(int(owner_ttl * 1000)))
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        """Session key → its lock and how many writers hold or wait for it."""
        self._known: OrderedDict[str, SessionRecord | None] = OrderedDict()
        """What this store last read or wrote of each session: the base of the next
        compare-and-set, so the usual write needs no read first."""
        self._max_known = max_known

    @property
    def cluster(self) -> ClusterClient | None:
        """The cluster client, when the store is a cluster."""
        return self._cluster

    # -- keys ------------------------------------------------------------------------------

    def record_key(self, key: str) -> str:
        """Where a session's record is kept; in a cluster the session is the hash tag."""
        if self._cluster is None:
            return self._session_prefix + key
        return hash_tagged(self._session_prefix, key)

    def owner_record_key(self, key: str) -> str:
        """Where an id's owner is kept: found from the id alone (in a cluster, its slot)."""
        if self._cluster is None:
            return self._owner_prefix + key
        return hash_tagged(self._owner_prefix, key)

    def _slot(self, key: str) -> int:
        return 0 if self._cluster is None else key_slot(key)

    async def _run(self, commands: list[tuple[str, Command]]) -> list[Any]:
        """Each ``(key, command)`` on the server holding ``key``, in one round trip; an error
        reply raises."""
        return checked(await self._server.execute(commands))

    # -- Store -----------------------------------------------------------------------------

    async def load(self, query: Query) -> Facts:
        if self._cluster is not None:
            return await self._load_slots(query)
        keys = [self.record_key(query.session) if query.session else "",
                *(self.owner_record_key(k) for k in query.ids)]
        chain = query.ids.index(query.chain) + 1 if query.chain in query.ids else 0
        ((chained, version, data, *owners),) = await self._run(
            [(keys[0], _LOAD.command(keys, [self._session_prefix, chain]))])
        return self._facts(query, chained.decode() or query.session, version, data, owners)

    async def _load_slots(self, query: Query) -> Facts:
        """A cluster's load: the record and the owners read at once from the primaries that
        hold them; a chain, its owner first, then its session's record."""
        commands: list[tuple[str, Command]] = []
        if query.session:
            key = self.record_key(query.session)
            commands.append((key, ("HMGET", key, "v", "d")))
        for id_key in query.ids:
            key = self.owner_record_key(id_key)
            commands.append((key, ("GET", key)))
        replies = await self._run(commands) if commands else []
        found, owners = (replies[0], replies[1:]) if query.session else ([None, None], replies)
        session = query.session
        if session is None and query.chain in query.ids:
            owner = owners[query.ids.index(query.chain)]
            session = unpack_owner(owner).session if owner else None
            if session is not None:
                key = self.record_key(session)
                (found,) = await self._run([(key, ("HMGET", key, "v", "d"))])
        return self._facts(query, session, found[0] or b"0", found[1] or b"",
                           [owner or b"" for owner in owners])

    def _facts(self, query: Query, key: str | None, version: bytes, data: bytes,
               owners: Sequence[bytes]) -> Facts:
        record = _record(version, data)
        found = {k: unpack_owner(v) for k, v in zip(query.ids, owners, strict=True) if v}
        if key is not None:
            self._remember(key, record)
        return Facts(key, None if record is None else record.copy(), found)

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
        """Compare-and-set rounds: one script per server (per slot in a cluster, sent to
        every primary at once). In a cluster a session's record and the ids its answer
        claimed land apart, an instant from each other; either order is safe, as the record
        names the ids its last answer issued (``issued``) and a reader takes an owner from
        either."""
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
                # Its turns so far are forgotten with it: written, then deleted, a conflict's
                # retry would write them again after the delete.
                sessions.pop(write.session_key, None)
                forgets.append(write.session_key)
        bases = {key: self._known.get(key) for key in sessions}
        switches: list[tuple[str, str]] = []
        for _ in range(MAX_CAS_ATTEMPTS):
            planned = {key: _planned(bases[key], batch, now) for key, batch in sessions.items()}
            groups = self._grouped(planned, bases, claims, forgets)
            replies = await self._run([g.command(self._ttls) for g in groups.values()])
            lost: dict[str, SessionRecord | None] = {}
            for batch, conflicts in zip(groups.values(), replies, strict=True):
                for i in range(0, len(conflicts), 3):
                    name = batch.sessions[int(conflicts[i]) - 1][0]
                    lost[name] = _record(conflicts[i + 1], conflicts[i + 2])
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

    def _grouped(
        self, planned: Mapping[str, tuple[SessionRecord, object]],
        bases: Mapping[str, SessionRecord | None], claims: list[tuple[str, bytes]],
        forgets: list[str],
    ) -> dict[int, _Group]:
        """The writes of one round by script: every write in one on one server, the writes
        of each slot in one in a cluster."""
        groups: dict[int, _Group] = {}
        for key, (record, _) in planned.items():
            base, stored = bases[key], self.record_key(key)
            groups.setdefault(self._slot(stored), _Group()).sessions.append((key, stored, [
                str(base.version if base else 0), str(record.version), pack_record(record)]))
        for key, owner in claims:
            stored = self.owner_record_key(key)
            groups.setdefault(self._slot(stored), _Group()).claims.append((stored, owner))
        for key in forgets:
            stored = self.record_key(key)
            groups.setdefault(self._slot(stored), _Group()).forgets.append(stored)
        return groups

    async def seed(
        self, records: Mapping[str, SessionRecord], owners: Mapping[str, Owner] | None = None
    ) -> None:
        groups: dict[int, tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]] = {}
        for key, record in records.items():
            stored = self.record_key(key)
            groups.setdefault(self._slot(stored), ([], []))[0].append(
                (stored, pack_record(record)))
        for key, owner in (owners or {}).items():
            stored = self.owner_record_key(key)
            groups.setdefault(self._slot(stored), ([], []))[1].append(
                (stored, pack_owner(owner)))
        trip: list[tuple[str, Command]] = []
        size = 0
        for kept, claimed in groups.values():
            while kept or claimed:
                batch, kept = kept[:SEED_BATCH], kept[SEED_BATCH:]
                room = SEED_BATCH - len(batch)
                more, claimed = claimed[:room], claimed[room:]
                keys = [k for k, _ in batch] + [k for k, _ in more]
                args: list[Arg] = [*self._ttls, len(batch), *(v for _, v in batch),
                                   *(v for _, v in more)]
                trip.append((keys[0], _SEED.command(keys, args)))
                size += len(keys)
                if size >= SEED_BATCH:  # a round trip carries about SEED_BATCH keys
                    await self._run(trip)
                    trip, size = [], 0
        if trip:
            await self._run(trip)
        for key in records:
            self._known.pop(key, None)  # the next write reads what is there now

    async def shared_secret(self, fresh: bytes) -> tuple[bytes, bool]:
        """The secret every replica keys tenant hashes with (``fresh`` if none is kept yet),
        and whether it was missing: a store without it lost everything it held."""
        key = self._secret_key
        created, kept = await self._run([(key, ("SET", key, fresh, "NX")), (key, ("GET", key))])
        return (kept if isinstance(kept, bytes) and kept else fresh), created is not None

    async def ping(self) -> None:
        await self._server.ping()

    async def close(self) -> None:
        await self._server.close()

    def _remember(self, key: str, record: SessionRecord | None) -> None:
        self._known[key] = record
        self._known.move_to_end(key)
        while len(self._known) > self._max_known:
            self._known.popitem(last=False)


def hash_tagged(prefix: str, name: str) -> str:
    """``prefix{name}``: the key's slot is ``name``'s. A name holding a brace would end the tag
    early (and let a client pick its slots), so its tag is its hash, followed by the name."""
    if "{" in name or "}" in name:
        return f"{prefix}{{h-{xxhash.xxh3_64_hexdigest(name.encode())}}}{name}"
    return f"{prefix}{{{name}}}"


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

