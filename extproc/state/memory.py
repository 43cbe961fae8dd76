"""The in-process store: router state in this process's memory, bounded in size and time.

It is the embedded default (``state.store: memory``: one process, nothing else to run) and,
behind the Redis store, every replica's local copy of what it has seen and written, which
serves while the shared store is unreachable. Everything is O(1) per request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

from ..config import Config
from ..types import Clock
from .records import (
    Claim,
    Commit,
    Finish,
    Forget,
    Owner,
    SessionRecord,
    Write,
    apply,
    pack_record,
    session_of,
    unpack_record,
)
from .store import Applied, Facts, Query

_Plain = tuple[str, str | None, str | None]
_Packed = tuple[int, bytes]
"""A session record as the store keeps it: its version and ``pack_record``'s bytes. A tuple of
an int and bytes, which the garbage collector stops tracking, where a record is an object of
twenty fields for every full collection (they stop the event loop) to scan; a pack costs
about 1 µs and an unpack 2 µs, about one of each a request."""


def _pack(record: SessionRecord) -> _Packed:
    return (record.version, pack_record(record))


def _unpack(packed: _Packed | None) -> SessionRecord | None:
    return None if packed is None else unpack_record(packed[1], packed[0])


def _plain(owner: Owner) -> _Plain:
    return (owner.model, owner.worker, owner.session)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Expiring(Generic[K, V]):
    """A bounded map whose entries expire ``ttl`` after their last write; when full, the oldest
    write leaves first. One TTL for all keeps the order of writes the order of expiry, so
    expiring and evicting both take from the front (O(1) amortised). Unlike a cachetools
    ``TTLCache`` it allocates no link object per entry: the garbage collector, whose full
    collections stop the event loop, sees only the values."""

    def __init__(self, maxsize: int, ttl: float, clock: Clock) -> None:
        self._max, self._ttl, self._clock = maxsize, ttl, clock
        self._values: OrderedDict[K, V] = OrderedDict()
        self._expires: dict[K, float] = {}

    def get(self, key: K) -> V | None:
        expires = self._expires.get(key)
        if expires is None:
            return None
        if expires <= self._clock():
            self.pop(key)
            return None
        return self._values[key]

    def __setitem__(self, key: K, value: V) -> None:
        now = self._clock()
        self._values[key] = value
        self._values.move_to_end(key)
        self._expires[key] = now + self._ttl
        self._expire(now)

    def __contains__(self, key: K) -> bool:
        return self.get(key) is not None

    def setdefault(self, key: K, value: V) -> None:
        if key not in self:
            self[key] = value

    def pop(self, key: K) -> None:
        if self._values.pop(key, None) is not None:
            del self._expires[key]

    def items(self) -> Iterator[tuple[K, V]]:
        self._expire(self._clock())
        return iter(list(self._values.items()))

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._values)

    def _expire(self, now: float) -> None:
        values, expires = self._values, self._expires
        while values:
            oldest = next(iter(values))
            if expires[oldest] > now and len(values) <= self._max:
                return
            del values[oldest], expires[oldest]


class MemoryStore:
    def __init__(
        self,
        *,
        clock: Clock,
        max_sessions: int,
        session_ttl: float,
        max_owned_ids: int,
        owner_ttl: float,
    ) -> None:
        self._clock = clock
        self._sessions: Expiring[str, _Packed] = Expiring(max_sessions, session_ttl, clock)
        self._owners: Expiring[str, _Plain] = Expiring(max_owned_ids, owner_ttl, clock)
        """Kept as plain tuples of strings, which the garbage collector stops tracking: a store
        may keep a million, and its full collections stop the event loop."""

    @classmethod
    def from_config(cls, config: Config, clock: Clock) -> MemoryStore:
        memory = config.memory
        return cls(
            clock=clock,
            max_sessions=memory.max_sessions,
            session_ttl=memory.session_ttl_seconds,
            max_owned_ids=memory.max_owned_ids,
            owner_ttl=memory.owner_ttl_seconds,
        )

    def __len__(self) -> int:
        return len(self._sessions)

    def owners(self) -> int:
        return len(self._owners)

    # -- the Store protocol ----------------------------------------------------------------

    async def load(self, query: Query) -> Facts:
        return self.load_now(query)

    async def apply(self, writes: Sequence[Write], now: float) -> Applied:
        return self.apply_now(writes, now)

    async def seed(
        self, records: Mapping[str, SessionRecord], owners: Mapping[str, Owner] | None = None
    ) -> None:
        for key, record in records.items():
            if key not in self._sessions:
                self.put(key, record)
        for key, owner in (owners or {}).items():
            self._owners.setdefault(key, _plain(owner))

    def everything(self) -> tuple[dict[str, SessionRecord], dict[str, Owner]]:
        """Every live record and owner (to seed a shared store that lost them)."""
        return ({k: record for k, packed in self._sessions.items()
                 if (record := _unpack(packed)) is not None},
                {k: Owner(*o) for k, o in self._owners.items()})

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # -- synchronous, for the evaluation and the simulators --------------------------------

    def load_now(self, query: Query) -> Facts:
        owners = {k: Owner(*o) for k in query.ids if (o := self._owners.get(k)) is not None}
        key = query.session
        if key is None and query.chain is not None:
            chained = owners.get(query.chain)
            key = chained.session if chained is not None else None
        return Facts(key, None if key is None else _unpack(self._sessions.get(key)), owners)

    def apply_now(self, writes: Sequence[Write], now: float) -> Applied:
        """``writes`` in order; each session they write is unpacked once and packed once."""
        switches: list[tuple[str, str]] = []
        written: dict[str, SessionRecord] = {}
        for write in writes:
            if isinstance(write, Claim):
                owner = _plain(write.owner)
                for key in write.keys:
                    self._owners[key] = owner
            elif isinstance(write, Forget):
                written.pop(write.session_key, None)
                self._sessions.pop(write.session_key)
            elif isinstance(write, Commit | Finish):
                session = session_of(write)
                if session is None:
                    continue
                before = written.get(session) or _unpack(self._sessions.get(session))
                record, moved = apply(before, write, now)
                record.version += 1
                written[session] = record
                if moved and before is not None:
                    switches.append((before.model, record.model))
        for session, record in written.items():
            self._sessions[session] = _pack(record)
        return Applied(tuple(switches))

    def put(self, key: str, record: SessionRecord) -> None:
        """Keep a copy of a record the shared store returned (the local view follows it)."""
        self._sessions[key] = _pack(record)

    def put_owners(self, owners: dict[str, Owner]) -> None:
        for key, owner in owners.items():
            self._owners[key] = _plain(owner)

    def record(self, key: str) -> SessionRecord | None:
        return _unpack(self._sessions.get(key))
