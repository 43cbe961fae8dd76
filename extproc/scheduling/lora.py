"""LoRA affinity (llm-d's ``lora-affinity-scorer``): an adapter's request goes where the adapter
is already loaded, else where a slot is free, and last where it must wait for one, so a fleet
of adapters on one base model does not keep swapping them in and out of every worker. The
facts are vLLM's ``vllm:lora_requests_info`` gauge, scraped into each ``Worker``."""

from __future__ import annotations

from collections.abc import Sequence

from .types import SchedulingRequest, Worker

ACTIVE, FREE_SLOT, MUST_WAIT = 1.0, 0.8, 0.6
"""llm-d's scores: the adapter is running or queued there; a slot is free to load it; every
slot is taken (the request waits for one, then pays the load)."""


class LoraAffinityScorer:
    """Scores an adapter's request per worker; a base model's request scores 1.0 everywhere
    (nothing to load). A worker that does not report ``max_lora`` counts as having a slot."""

    name = "lora_affinity"

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        adapter = request.adapter
        if adapter is None:
            return {w.address: ACTIVE for w in workers}
        return {w.address: _score(adapter, w) for w in workers}


def _score(adapter: str, worker: Worker) -> float:
    loaded = worker.adapters_running | worker.adapters_waiting
    if adapter in loaded:
        return ACTIVE
    if worker.max_lora is None or len(loaded) < worker.max_lora:
        return FREE_SLOT
    return MUST_WAIT
