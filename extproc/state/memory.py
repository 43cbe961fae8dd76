"""The in-process store: router state in this process's memory, bounded in size and time.

It is the embedded default (``state.store: memory``: one process, nothing else to run) and,
behind the Redis store, every replica's local copy of what it has seen and written, which
serves while the shared store is unreachable. Everything is O(1) per request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cachetools import TTLCache

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
    session_of,
)
from .store import Applied, Facts, Query


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
        self._sessions: TTLCache[str, SessionRecord] = TTLCache(
            maxsize=max_sessions, ttl=session_ttl, timer=clock
        )
        self._owners: TTLCache[str, Owner] = TTLCache(
            maxsize=max_owned_ids, ttl=owner_ttl, timer=clock
        )

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
            self._owners.setdefault(key, owner)

    def everything(self) -> tuple[dict[str, SessionRecord], dict[str, Owner]]:
        """Every live record and owner (to seed a shared store that lost them)."""
        return ({k: r.copy() for k, r in list(self._sessions.items())},
                dict(list(self._owners.items())))

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # -- synchronous, for the evaluation and the simulators --------------------------------

    def load_now(self, query: Query) -> Facts:
        owners = {k: o for k in query.ids if (o := self._owners.get(k)) is not None}
        key = query.session
        if key is None and query.chain is not None:
            chained = owners.get(query.chain)
            key = chained.session if chained is not None else None
        record = None if key is None else self._sessions.get(key)
        return Facts(key, None if record is None else record.copy(), owners)

    def apply_now(self, writes: Sequence[Write], now: float) -> Applied:
        switches: list[tuple[str, str]] = []
        for write in writes:
            if isinstance(write, Claim):
                for key in write.keys:
                    self._owners[key] = write.owner
            elif isinstance(write, Forget):
                self._sessions.pop(write.session_key, None)
            elif isinstance(write, Commit | Finish):
                session = session_of(write)
                if session is None:
                    continue
                before = self._sessions.get(session)
                record, moved = apply(before, write, now)
                record.version += 1
                self._sessions[session] = record
                if moved and before is not None:
                    switches.append((before.model, record.model))
        return Applied(tuple(switches))

    def put(self, key: str, record: SessionRecord) -> None:
        """Keep a copy of a record the shared store returned (the local view follows it)."""
        self._sessions[key] = record.copy()

    def put_owners(self, owners: dict[str, Owner]) -> None:
        for key, owner in owners.items():
            self._owners[key] = owner

    def record(self, key: str) -> SessionRecord | None:
        found = self._sessions.get(key)
        return None if found is None else found.copy()
