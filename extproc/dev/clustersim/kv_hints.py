"""KV hints from the router's decisions: what admission and routing know that the engine does not.

Dynamo's proposed KvHint interface (REFERENCE section 10, item 5): the router states intent for
a session's KV and the engine resolves it against its own cache state, free to ignore any hint.
Every hint names a session and the worker it is for; none carries engine block hashes (the
router's prompt blocks need not match the engine's): the engine resolves the session's blocks,
and ``share`` / ``release`` only say how much of its context, from its start, they concern.

* ``share``: a session's first turn on a worker matched a prefix other sessions put there (the
  system prompt, a parent's context a sub-agent inherits): keep it resident while it lives;
* ``demote``: admission paused the session: move its own blocks to host memory now rather than
  letting them be evicted while it waits;
* ``prefetch``: admission resumed it: bring them back before its next turn is scheduled;
* ``release``: the session ended: its own blocks can go first, on every worker it used.

``KvHintEmitter`` is sans-IO: decisions in, hints out; the caller delivers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...scheduling.admission import AdmissionTick

HintKind = Literal["share", "prefetch", "demote", "release"]


@dataclass(frozen=True, slots=True)
class KvHint:
    kind: HintKind
    session: str
    worker: str
    prefix_tokens: int = 0
    """``share``: the leading tokens of the session's context that others reuse; ``release``:
    the leading tokens to keep (a sub-agent's first prompt, mostly the parent's context, which
    the parent resends when it resumes)."""


class KvHintEmitter:
    """Follows where each session runs and turns admission's ticks into hints for its worker."""

    def __init__(self, *, min_share_tokens: int = 1024) -> None:
        self.min_share_tokens = min_share_tokens
        self._worker: dict[str, str] = {}
        """The worker each live session was last routed to."""
        self._used: dict[str, set[str]] = {}
        """Every worker each live session was routed to: release goes to all of them."""
        self._prefetched: dict[str, str] = {}
        """Sessions prefetched and not routed since: where their KV is being brought back."""
        self._inherited: dict[str, int] = {}
        """Sub-agents' first prompt tokens: what they started from, that their parent owns."""

    def prefetched_to(self, session: str | None) -> str | None:
        """The worker a resumed session's KV was prefetched to, until its next turn is routed:
        the scheduler's ``prefer`` hook, so that turn follows its KV (admission resumed it
        because that worker has room; the approximate index may have forgotten it is there)."""
        return None if session is None else self._prefetched.get(session)

    def routed(self, session: str | None, worker: str, *, matched_tokens: int,
               prompt_tokens: int, parent: str | None = None) -> list[KvHint]:
        """A turn of ``session`` (a sub-agent of ``parent``) went to ``worker``, where the
        prefix index matched ``matched_tokens`` of its ``prompt_tokens``. On the session's
        first turn there, that match is context other sessions put on the worker: ``share``
        it."""
        if session is None:
            return []
        if parent is not None and session not in self._used:
            self._inherited[session] = prompt_tokens
        self._worker[session] = worker
        self._prefetched.pop(session, None)
        used = self._used.setdefault(session, set())
        first = worker not in used
        used.add(worker)
        if first and matched_tokens >= self.min_share_tokens:
            return [KvHint("share", session, worker, matched_tokens)]
        return []

    def turn_finished(self, session: str | None, *, paused: bool) -> list[KvHint]:
        """The turn ended; ``paused``: admission paused the session at this tool boundary
        (a REASONING program it chose to pause, which ``AdmissionTick`` does not list)."""
        return self._for(session, "demote") if paused else []

    def ticked(self, tick: AdmissionTick) -> list[KvHint]:
        """Admission's tick: demote what it paused, prefetch what it resumed (a held new session
        it admitted has no worker yet and gets nothing)."""
        hints = [h for key in tick.paused for h in self._for(key, "demote")]
        prefetches = [h for key in tick.resumed for h in self._for(key, "prefetch")]
        self._prefetched.update((h.session, h.worker) for h in prefetches)
        return hints + prefetches

    def ended(self, session: str | None) -> list[KvHint]:
        """The session is over: ``release`` on every worker it used (a sub-agent keeps the
        prompt it started from), then forget it."""
        if session is None:
            return []
        self._worker.pop(session, None)
        self._prefetched.pop(session, None)
        keep = self._inherited.pop(session, 0)
        return [KvHint("release", session, w, keep) for w in sorted(self._used.pop(session, ()))]

    def _for(self, session: str | None, kind: HintKind) -> list[KvHint]:
        worker = None if session is None else self._worker.get(session)
        return [] if session is None or worker is None else [KvHint(kind, session, worker)]
