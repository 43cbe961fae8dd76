"""The store protocol: what a request needs loaded, what comes back, and the two calls.

A request's facts are loaded in one round trip (``load``): the session's record, the owners of
the ids it carries and, for a request that names no session but continues a chain (a
``previous_response_id``), the record of the session that chain belongs to. The policy core
decides from those facts and returns writes; ``apply`` sends them in one round trip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .records import Owner, SessionRecord, Write


@dataclass(frozen=True, slots=True)
class Query:
    session: str | None
    """The session key the headers or the body name (None: they name none)."""
    ids: tuple[str, ...] = ()
    """Owner keys of the ids the request carries (tool results, provider state)."""
    chain: str | None = None
    """An owner key in ``ids`` whose session is this request's session when ``session`` is
    None: a Responses chain without a session header is one session."""


@dataclass(frozen=True, slots=True)
class Facts:
    session_key: str | None
    """``Query.session``, or the session the chain resolved to."""
    session: SessionRecord | None
    owners: Mapping[str, Owner] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Applied:
    switches: tuple[tuple[str, str], ...] = ()
    """(from model, to model) of every switch these writes made (each counted once)."""


class Store(Protocol):
    """A place router state lives. ``load`` and ``apply`` are one round trip each; the caller
    bounds how long it waits (``StateLayer``), so a store may simply raise on trouble."""

    async def load(self, query: Query) -> Facts: ...

    async def apply(self, writes: Sequence[Write], now: float) -> Applied: ...

    async def seed(
        self, records: Mapping[str, SessionRecord], owners: Mapping[str, Owner] | None = None
    ) -> None:
        """Write these records and owners where the store has none (after an outage that lost
        them); what the store holds stays."""
        ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...
