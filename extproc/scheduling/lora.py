"""LoRA affinity (llm-d's ``lora-affinity-scorer``, made session-aware): an adapter's request goes
where the adapter is already loaded, else where a slot is free, and last where it must wait for
one, so a fleet of adapters on one base model does not keep swapping them in and out of every
worker's GPU slots.

vLLM's ``vllm:lora_requests_info`` gauge (scraped into each ``Worker``) names the adapters of
the running and the waiting requests only. Between the turns of an agent's tool loop its
adapter is idle there — still in its slot, about to be used again — so the gauge alone calls the
slot free and invites another adapter to evict it. The scorer therefore also counts the adapters
of the live sessions the router has placed on each worker (routed within ``idle_seconds``).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..state.table import Entry, SessionTable
from .types import SchedulingRequest, Worker

ACTIVE, FREE_SLOT, MUST_WAIT = 1.0, 0.8, 0.6
"""llm-d's scores: the adapter is in use there; a slot is free to load it; every slot is taken
(the request waits for one, then pays the load)."""


@dataclass(slots=True)
class AdapterPlaced:
    """Where a session of an adapter was last placed: its slot on the session table."""

    worker: str
    adapter: str
    seen: float
    queued: float = -math.inf
    """When it last joined the lapse line (at most once per tenth of the idle time)."""


class LoraAffinityScorer:
    """Scores an adapter's request per worker; a base model's request scores 1.0 everywhere
    (nothing to load). A worker that does not report ``max_lora`` counts as having a slot."""

    name = "lora_affinity"

    def __init__(self, *, idle_seconds: float = 120.0, table: SessionTable | None = None,
                 clock: Callable[[], float] = time.monotonic, max_sessions: int = 100_000) -> None:
        """``table``: the process's session table (its assembler calls ``left`` when a
        session leaves it); a table of its own, of ``max_sessions`` on ``clock``, without."""
        self._idle = idle_seconds
        if table is None:
            table = SessionTable(max_sessions=max_sessions, clock=clock)
            table.leaving(self.left)
        self._table = table
        self._clock = table.clock
        self._lapse: deque[tuple[float, str]] = deque()
        self._placed: dict[str, Counter[str]] = {}
        """worker → adapter → live sessions of it placed there."""

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        adapter = request.adapter
        if adapter is None:
            return {w.address: ACTIVE for w in workers}
        self._expire()
        return {w.address: self._score(adapter, w) for w in workers}

    def picked(self, request: SchedulingRequest, address: str) -> None:
        key, adapter = request.session_key, request.adapter
        if key is None or adapter is None:
            return
        entry = self._table.touch(key)
        queued = entry.adapter.queued if entry.adapter is not None else -math.inf
        self._drop(entry)
        placed = entry.adapter = AdapterPlaced(address, adapter, self._clock(), queued)
        self._placed.setdefault(address, Counter())[adapter] += 1
        if placed.seen - placed.queued >= self._idle / 10:
            placed.queued = placed.seen
            self._lapse.append((placed.seen, key))

    def left(self, key: str, entry: Entry) -> None:
        """The session left the table (a table's leaving hook)."""
        self._drop(entry)

    def loaded(self, worker: Worker) -> frozenset[str]:
        """The adapters in ``worker``'s slots as far as the router knows: those its gauge
        names running or waiting, and those of the live sessions placed there."""
        self._expire()
        placed = self._placed.get(worker.address)
        found = worker.adapters_running | worker.adapters_waiting
        return found | placed.keys() if placed else found

    def _score(self, adapter: str, worker: Worker) -> float:
        placed = self._placed.get(worker.address, Counter())
        loaded = worker.adapters_running | worker.adapters_waiting | placed.keys()
        if adapter in loaded:
            return ACTIVE
        if worker.max_lora is None or len(loaded) < worker.max_lora:
            return FREE_SLOT
        return MUST_WAIT

    def _expire(self) -> None:
        horizon = self._clock() - self._idle
        lapse = self._lapse
        while lapse and lapse[0][0] <= horizon:
            queued, key = lapse.popleft()
            entry = self._table.get(key)
            placed = None if entry is None else entry.adapter
            if entry is None or placed is None or placed.queued != queued:
                continue  # gone, or in the line again later
            if placed.seen <= horizon:
                self._drop(entry)
            else:
                placed.queued = placed.seen
                lapse.append((placed.seen, key))

    def _drop(self, entry: Entry) -> None:
        found, entry.adapter = entry.adapter, None
        if found is None:
            return
        placed = self._placed[found.worker]
        placed[found.adapter] -= 1
        if not placed[found.adapter]:
            del placed[found.adapter]
