"""The state layer: what the router remembers (``records``), the store protocol (``store``), the
in-process store (``memory``), Redis / Valkey (``redis``) and the layer the service uses in front
of them (``layer``: timeouts, outages, write-back). Only the store implementations talk to a
store; this package's top level stays free of asyncio so the policy core can import it."""

from __future__ import annotations

from .memory import MemoryStore
from .records import Claim, Commit, Finish, Forget, Owner, SessionRecord, Turn, Write
from .store import Applied, Facts, Query, Store

__all__ = [
    "Applied",
    "Claim",
    "Commit",
    "Facts",
    "Finish",
    "Forget",
    "MemoryStore",
    "Owner",
    "Query",
    "SessionRecord",
    "Store",
    "Turn",
    "Write",
]
