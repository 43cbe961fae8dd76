"""This process's live sessions: one entry each, on which every component hangs its slot.

Admission's program, the active-sessions scorer's placement, the adapter affinity scorer's, the
prefill binding, the prompt memo's block hashes, the KV hint emitter's view, the session-prefix
index's branch, the session's figures and the router's streamed answers still to claim all live
on the session's one entry, so there is one bound (``memory.max_sessions``) and one eviction: a
session leaves when it has been idle for ``memory.session_ttl_seconds``, when the bound pushes
it out (the least recently active first), or when it ends (its final request); whoever keeps a
total over the slots is told (the assembly registers the leaving hooks) and lets it go.
Shorter notions a component has of a session (the scorer counts a placement only for a couple
of minutes) are its own, read from its slot.

The store's ``SessionRecord`` is not here: it is router state shared with other replicas and
kept across restarts; this table is what this process computes from traffic and may forget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..types import Clock

if TYPE_CHECKING:
    from ..observability.figures import Figured
    from ..scheduling.admission import Program
    from ..scheduling.kv_hints import Hinted
    from ..scheduling.lora import AdapterPlaced
    from ..scheduling.memo import Memo
    from ..scheduling.session_prefix import Branch
    from ..scheduling.sessions import Placed


@dataclass(slots=True)
class Entry:
    """One live session: when it was last active, and each component's slot (None: that
    component keeps nothing of it)."""

    seen: float
    program: Program | None = None
    placed: Placed | None = None
    memos: dict[str, Memo] | None = None
    """model → the prompt memo of the session's last prompt for that model."""
    hinted: Hinted | None = None
    branch: Branch | None = None
    figured: Figured | None = None
    adapter: AdapterPlaced | None = None
    """Where the session of a LoRA adapter was last placed (the adapter affinity scorer's)."""
    prefill: str | None = None
    """The prefill worker of the session's last split (the prefill phase's own binding)."""
    unclaimed: dict[str, float] | None = None
    """Streamed answers whose ids may not all be claimed here yet (replay id → when the
    routing stream ended; ``inf`` while it runs)."""
    orphans: frozenset[str] | None = None
    """The newest ids a settle hold last waited for in vain: no issuer appeared within its
    bound, so a request continuing them again (a retry, a client's own ids) routes at once."""


Hook = Callable[[str, Entry], None]


class SessionTable:
    def __init__(self, *, max_sessions: int = 100_000, ttl_seconds: float = 3600.0,
                 clock: Clock) -> None:
        if max_sessions < 1 or ttl_seconds <= 0:
            raise ValueError("max_sessions and ttl_seconds must be positive")
        self._max = max_sessions
        self._ttl = ttl_seconds
        self._clock = clock
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        """Least recently active first."""
        self._hooks: list[Hook] = []

    @property
    def clock(self) -> Clock:
        """The time every slot is stamped with."""
        return self._clock

    def leaving(self, hook: Hook) -> None:
        """Call ``hook(key, entry)`` for every session that leaves the table."""
        self._hooks.append(hook)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str | None) -> Entry | None:
        """The session's entry, if it is live (no change of order)."""
        return None if key is None else self._entries.get(key)

    def touch(self, key: str) -> Entry:
        """The session did something (it is routed, its answer ended): its entry, made if
        new, is now the most recently active; sessions idle too long or past the bound
        leave."""
        now = self._clock()
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = Entry(now)
        else:
            entry.seen = now
            self._entries.move_to_end(key)
        self.expire(now)
        return entry

    def forget(self, key: str) -> None:
        """The session ended: it leaves now."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._left(key, entry)

    def expire(self, now: float | None = None) -> None:
        """Sessions idle longer than the TTL, and the least recently active beyond the bound,
        leave (amortised O(1): they are at the front)."""
        now = self._clock() if now is None else now
        horizon = now - self._ttl
        entries = self._entries
        while entries:
            key, oldest = next(iter(entries.items()))
            if oldest.seen > horizon and len(entries) <= self._max:
                return
            del entries[key]
            self._left(key, oldest)

    def items(self) -> Iterator[tuple[str, Entry]]:
        """Every live session, least recently active first (a snapshot: safe to change the
        table while iterating)."""
        return iter(list(self._entries.items()))

    def oldest(self) -> Iterator[tuple[str, Entry]]:
        """The live sessions, least recently active first, as they stand: change slots while
        walking, never the table."""
        return iter(self._entries.items())

    def _left(self, key: str, entry: Entry) -> None:
        for hook in self._hooks:
            hook(key, entry)
