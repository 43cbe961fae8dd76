"""Prefill/decode disaggregation: whether a request's prefill goes to a prefill worker, and to
which one.

The decode worker is picked first, as any worker is (a tool loop's pin and the session's
binding hold). Then the split is decided by what that worker would have to prefill — the
prompt's tokens it does not hold, not the prompt's length: an agent's first turn (a huge
prefill) goes to a prefill worker, while a tool-loop turn that adds a few hundred tokens to a
context warm on its decode worker stays local, where a hand-off would cost a second queue and
a KV transfer for nothing. The prefill worker is picked by its own scorers (prefix overlap and
load) and its own session binding, and travels to the decode worker's routing sidecar in
``x-prefiller-host-port`` (llm-d's name): the sidecar calls it first, vLLM's KV transfer
carries the KV over, then the decode worker answers.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..apis import CHARS_PER_TOKEN
from ..state.table import SessionTable
from .filters import HealthyFilter, PrefillFilter
from .picker import MaxScorePicker
from .plugins import SCORERS, Context
from .prefix_index import ApproximatePrefixIndex
from .scheduler import Scheduler
from .types import PrefixIndex, SchedulingRequest, Scorer, Worker

if TYPE_CHECKING:
    from ..config import Disaggregation, Scheduling

REASONS = ("no_prefill_worker", "prefill_busy", "never", "warm", "cold", "always")
"""Why a request of a pool with prefill workers was split or not (a bounded metric label): no
healthy prefill worker; every prefill worker already has ``max_prefill_requests``, or more
requests than the decode worker has waiting (a local prefill would start sooner); the mode
says never; below the threshold of uncached tokens on the decode worker (``warm``: stays
local); at or above it (``cold``: split); the mode says always."""


@dataclass(frozen=True, slots=True)
class Split:
    """The P/D decision for one request."""

    prefill: str | None
    """The prefill worker (``host:port``); None: the decode worker prefills itself."""
    reason: str
    uncached_tokens: int
    """What the decode worker would have prefilled: the prompt less its cached prefix."""
    scores: Mapping[str, float] = field(default_factory=dict)
    """The prefill candidates' totals, when a prefill worker was picked."""


class Disaggregator:
    """Decides the split and picks the prefill worker; remembers each session's prefill worker
    (the prefill phase's own binding, beside the decode binding in the session's record)."""

    def __init__(self, config: Disaggregation, scheduler: Scheduler, *, tokens_per_block: int,
                 table: SessionTable | None = None, max_sessions: int = 100_000) -> None:
        """Each session's prefill worker is its slot on ``table`` (the process's session
        table; one of its own, of ``max_sessions``, without)."""
        self.config = config
        self.scheduler = scheduler
        self.tokens_per_block = tokens_per_block
        self._table = table or SessionTable(max_sessions=max_sessions, clock=time.monotonic)
        self._held = ApproximatePrefixIndex(chars_per_block=tokens_per_block * CHARS_PER_TOKEN)
        """What each decode worker still holds, on its device or in host memory: the prompts
        sent there, least recently used out first (an engine offloads to host memory what
        leaves the device; the scheduler's index is sized by the device alone)."""

    @classmethod
    def from_config(cls, scheduling: Scheduling, *, index: PrefixIndex, rng: random.Random,
                    tokens_per_block: int, max_sessions: int = 100_000,
                    clock: Callable[[], float] = time.monotonic,
                    table: SessionTable | None = None) -> Disaggregator:
        """The prefill pick's scheduler: healthy prefill workers, the configured scorers."""
        context = Context(scheduling, index, clock, max_sessions)
        config = scheduling.disaggregation
        scorers: list[tuple[Scorer, float]] = [
            (SCORERS[name].make(context), weight) for name, weight in config.scorers.items()
            if weight]
        scheduler = Scheduler(scorers, MaxScorePicker(rng), [PrefillFilter(), HealthyFilter()],
                              index)
        return cls(config, scheduler, tokens_per_block=tokens_per_block, table=table,
                   max_sessions=max_sessions)

    def bound(self, session_key: str | None) -> str | None:
        entry = self._table.get(session_key)
        return None if entry is None else entry.prefill

    def decide(self, request: SchedulingRequest, decode: str, matched: Mapping[str, float],
               workers: Sequence[Worker]) -> Split | None:
        """``decode`` was picked from ``workers`` with ``matched`` prefix blocks per worker;
        None when the pool has no prefill worker at all (nothing to decide).

        What ``decode`` holds is the larger of the prefix index's match and what is still in
        its device or host memory of the prompts sent there (the engine offloads to host memory
        what the index, sized by the device, forgets; past both tiers a tool-loop turn's
        context is gone and it re-prefills: that is a cold turn). A prefill worker with
        requests is worth queueing at only while the decode worker has as many waiting: with
        fewer, a local prefill starts sooner than the prefill worker's queue drains."""
        if not any(w.prefills for w in workers):
            return None
        key = request.session_key
        for worker in workers:
            if worker.address == decode:
                self._held.resize(worker, host=True)
        blocks = max(matched.get(decode, 0.0),
                     self._held.matched_blocks(decode, request.prompt_blocks))
        self._held.routed(decode, request.prompt_blocks, request.reused)
        uncached = max(0, request.prompt_tokens - int(blocks * self.tokens_per_block))
        mode = self.config.mode
        if mode == "never":
            return Split(None, "never", uncached)
        if mode == "session_aware" and uncached < self.config.threshold_tokens:
            return Split(None, "warm", uncached)
        full = self.config.max_prefill_requests
        if mode == "session_aware":
            full = min(full, 1 + _waiting(decode, workers))
        room = [w for w in workers if not w.prefills or w.requests < full]
        if mode == "session_aware" and not any(w.prefills for w in room):
            return Split(None, "prefill_busy", uncached)
        result = self.scheduler.schedule(
            replace(request, subset=None, pinned=None, bound_worker=self.bound(key),
                    matched=None), room if mode == "session_aware" else workers)
        if not result.ordered:
            return Split(None, "no_prefill_worker", uncached)
        prefill = result.ordered[0]
        if key is not None:
            self._table.touch(key).prefill = prefill
        return Split(prefill, "always" if mode == "always" else "cold", uncached,
                     dict(result.total))


def _waiting(address: str, workers: Sequence[Worker]) -> int:
    """The requests waiting on the decode worker ``address``, as last scraped."""
    return next((w.waiting for w in workers if w.address == address), 0)

