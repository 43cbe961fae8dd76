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

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

from .types import SchedulingRequest, Worker

ACTIVE, FREE_SLOT, MUST_WAIT = 1.0, 0.8, 0.6
"""llm-d's scores: the adapter is in use there; a slot is free to load it; every slot is taken
(the request waits for one, then pays the load)."""


class LoraAffinityScorer:
    """Scores an adapter's request per worker; a base model's request scores 1.0 everywhere
    (nothing to load). A worker that does not report ``max_lora`` counts as having a slot."""

    name = "lora_affinity"

    def __init__(self, *, idle_seconds: float = 120.0,
                 clock: Callable[[], float] = time.monotonic, max_sessions: int = 100_000) -> None:
        self._idle = idle_seconds
        self._clock = clock
        self._max = max_sessions
        self._sessions: OrderedDict[str, tuple[str, str, float]] = OrderedDict()
        """session → (worker, adapter, last routed), least recently routed first."""
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
        self._drop(key)
        self._sessions[key] = (address, adapter, self._clock())
        self._placed.setdefault(address, Counter())[adapter] += 1
        while len(self._sessions) > self._max:
            self._drop(next(iter(self._sessions)))

    def _score(self, adapter: str, worker: Worker) -> float:
        placed = self._placed.get(worker.address, Counter())
        loaded = worker.adapters_running | worker.adapters_waiting | placed.keys()
        if adapter in loaded:
            return ACTIVE
        if worker.max_lora is None or len(loaded) < worker.max_lora:
            return FREE_SLOT
        return MUST_WAIT

    def _expire(self) -> None:
        cutoff = self._clock() - self._idle
        while self._sessions:
            key, (_, _, seen) = next(iter(self._sessions.items()))
            if seen >= cutoff:
                return
            self._drop(key)

    def _drop(self, key: str) -> None:
        found = self._sessions.pop(key, None)
        if found is None:
            return
        worker, adapter, _ = found
        placed = self._placed[worker]
        placed[adapter] -= 1
        if not placed[adapter]:
            del placed[adapter]
