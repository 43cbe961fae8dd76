"""KV hints from the router's decisions: what admission and routing know that the engine does not.

Dynamo's proposed KvHint interface (REFERENCE section 10, item 5): the router states intent for
a session's KV and the engine resolves it against its own cache state, free to ignore any hint.
Every hint names a session (by the id the engine sees on its requests) and the worker it is for;
none carries engine block hashes (the router's prompt blocks need not match the engine's): the
engine resolves the session's blocks, and ``share`` / ``release`` only say how much of its
context, from its start, they concern.

* ``share``: a session's first turn on a worker matched a prefix other sessions put there (the
  system prompt, a parent's context a sub-agent inherits): keep it resident while it lives;
* ``demote``: admission paused the session: move its own blocks to host memory now rather than
  letting them be evicted while it waits;
* ``prefetch``: admission resumed it: bring them back before its next turn is scheduled;
* ``release``: the session ended: its own blocks can go first, on every worker it used.

``KvHintEmitter`` is sans-IO: decisions in, hints out; the caller delivers them (the service in
batches over HTTP, ``encode_hints``; the cluster simulator straight to its engines). What it
knows of a session is that session's slot on the session table: it lives as long as the session.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import orjson

from ..state.table import Entry, SessionTable
from .admission import AdmissionTick

HintKind = Literal["share", "prefetch", "demote", "release"]
HINT_KINDS: tuple[str, ...] = get_args(HintKind)
HINTS_PATH = "/v1/kv/hints"
"""Where a worker takes hints: ``POST`` of ``encode_hints``' JSON."""


@dataclass(frozen=True, slots=True)
class KvHint:
    kind: HintKind
    session: str
    """The session's id as its requests name it (the agent's session header)."""
    worker: str
    prefix_tokens: int = 0
    """``share``: the leading tokens of the session's context that others reuse; ``release``:
    the leading tokens to keep (a sub-agent's first prompt, mostly the parent's context, which
    the parent resends when it resumes)."""


@dataclass(slots=True)
class Hinted:
    """What the emitter knows of a session: its slot on the session table."""

    name: str
    worker: str
    seen: float
    used: set[str] = field(default_factory=set)
    inherited: int = 0
    """A sub-agent's first prompt tokens: what it started from, that its parent owns."""
    demoted: bool = False
    """A demote went out since the session was last routed (one per pause)."""


class KvHintEmitter:
    """Follows where each session runs and turns admission's decisions into hints for its
    worker. Sessions are keyed as admission keys them; hints carry each session's ``name``."""

    def __init__(self, *, min_share_tokens: int = 1024, max_sessions: int = 100_000,
                 ttl_seconds: float = 3600.0, table: SessionTable | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``table``: the process's session table, whose assembler calls ``left`` when a
        session leaves it (``ended`` first, for its releases); without one, a table of its
        own, of ``max_sessions`` sessions living ``ttl_seconds``, forgets them silently."""
        self.min_share_tokens = min_share_tokens
        self._count = 0
        if table is None:
            table = SessionTable(max_sessions=max_sessions, ttl_seconds=ttl_seconds, clock=clock)
            table.leaving(self.left)
        self._table = table

    def __len__(self) -> int:
        return self._count

    def routed(self, session: str | None, worker: str, *, matched_tokens: int,
               prompt_tokens: int, parent: str | None = None,
               name: str | None = None) -> list[KvHint]:
        """A turn of ``session`` (a sub-agent of ``parent``; ``name``: its id on the wire,
        default the key) went to ``worker``, where the prefix index matched
        ``matched_tokens`` of its ``prompt_tokens``. On the session's first turn there, that
        match is context other sessions put on the worker: ``share`` it."""
        if session is None:
            return []
        entry = self._table.touch(session)
        state = entry.hinted
        if state is None:
            state = entry.hinted = Hinted(name or session, worker, entry.seen,
                                          inherited=prompt_tokens if parent is not None else 0)
            self._count += 1
        state.worker, state.seen, state.demoted = worker, entry.seen, False
        first = worker not in state.used
        state.used.add(worker)
        if first and matched_tokens >= self.min_share_tokens:
            return [KvHint("share", state.name, worker, matched_tokens)]
        return []

    def turn_finished(self, session: str | None, *, paused: bool) -> list[KvHint]:
        """The turn ended; ``paused``: admission paused the session at this tool boundary."""
        return self._demote(session) if paused else []

    def ticked(self, tick: AdmissionTick) -> list[KvHint]:
        """Admission's tick: demote what it paused (once per pause), prefetch what it resumed
        (a held new session it admitted has no worker yet and gets nothing), release what it
        forgot."""
        hints = [h for key in tick.paused for h in self._demote(key)]
        for key in tick.resumed:
            state = self._state(key)
            if state is not None:
                state.demoted = False
                hints.append(KvHint("prefetch", state.name, state.worker))
        return hints + [h for key in tick.forgotten for h in self.ended(key)]

    def ended(self, session: str | None) -> list[KvHint]:
        """The session is over: ``release`` on every worker it used (a sub-agent keeps the
        prompt it started from), then forget it."""
        entry = self._table.get(session)
        state = None if entry is None else entry.hinted
        if entry is None or state is None:
            return []
        entry.hinted = None
        self._count -= 1
        return [KvHint("release", state.name, w, state.inherited) for w in sorted(state.used)]

    def _state(self, session: str | None) -> Hinted | None:
        entry = self._table.get(session)
        return None if entry is None else entry.hinted

    def left(self, key: str, entry: Entry) -> None:
        """The session left the table: keep nothing of it (a table's leaving hook)."""
        if entry.hinted is not None:
            entry.hinted = None
            self._count -= 1

    def _demote(self, session: str | None) -> list[KvHint]:
        state = self._state(session)
        if state is None or state.demoted:
            return []
        state.demoted = True
        return [KvHint("demote", state.name, state.worker)]

# -- the wire form ---------------------------------------------------------------------------


def encode_hints(hints: Sequence[KvHint]) -> bytes:
    """One worker's batch: ``{"hints": [{"kind", "session", "prefix_tokens"}]}``."""
    return orjson.dumps({"hints": [
        {"kind": h.kind, "session": h.session, "prefix_tokens": h.prefix_tokens} for h in hints
    ]})


def decode_hints(body: bytes, worker: str) -> list[KvHint]:
    """A batch as a worker receives it; raises ``ValueError`` on anything else (a kind this
    version does not know is skipped: an engine may ignore any hint)."""
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    entries = doc.get("hints") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ValueError('expected {"hints": [...]}')
    return [_hint(entry, worker) for entry in entries if _known(entry)]


def _known(entry: Any) -> bool:
    if not isinstance(entry, dict):
        raise ValueError(f"a hint is not an object: {entry!r:.80}")
    return entry.get("kind") in HINT_KINDS


def _hint(entry: dict[str, Any], worker: str) -> KvHint:
    session, prefix = entry.get("session"), entry.get("prefix_tokens", 0)
    if not isinstance(session, str) or not session:
        raise ValueError("a hint's session must be a non-empty string")
    if type(prefix) is not int or prefix < 0:
        raise ValueError("a hint's prefix_tokens must be a non-negative integer")
    return KvHint(entry["kind"], session, worker, prefix)


def by_worker(hints: Iterable[KvHint]) -> dict[str, list[KvHint]]:
    """Hints grouped for delivery, in their order."""
    grouped: dict[str, list[KvHint]] = {}
    for hint in hints:
        grouped.setdefault(hint.worker, []).append(hint)
    return grouped
