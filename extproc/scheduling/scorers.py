"""The load and cache scorers of the Gateway API Inference Extension, each ``score(request,
workers) -> {address: score}`` with 1.0 the best; the ``Scheduler`` weights, clamps and times
them. Their names are the keys of ``scheduling.scorers`` in the configuration."""

from __future__ import annotations

from collections.abc import Sequence

from .types import PrefixIndex, SchedulingRequest, Worker


class PrefixScorer:
    """Share of the prompt's blocks the worker already caches (longest held prefix), as the
    scheduler measured it once for the request (the index answers for anything it did not)."""

    name = "prefix"

    def __init__(self, index: PrefixIndex) -> None:
        self._index = index

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        blocks = request.prompt_blocks
        if not blocks:
            return {w.address: 0.0 for w in workers}
        known = request.matched or {}
        return {w.address: (known[w.address] if w.address in known
                            else self._index.matched_blocks(w.address, blocks)) / len(blocks)
                for w in workers}


class QueueScorer:
    """Shortest queue best: ``(maxQ - q) / (maxQ - minQ)`` over the candidates, where ``q`` is
    the scraped waiting count, plus the router's in-flight count when the scrape is stale (the
    queue may have grown since). Equal queues all score 1."""

    name = "queue"

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        queues = {w.address: w.waiting + (w.in_flight if w.stale else 0) for w in workers}
        if not queues:
            return {}
        low, high = min(queues.values()), max(queues.values())
        if high == low:
            return dict.fromkeys(queues, 1.0)
        return {address: (high - q) / (high - low) for address, q in queues.items()}


class KvUtilizationScorer:
    """Emptiest KV cache best: ``1 - kv_usage``."""

    name = "kv_utilization"

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        return {w.address: 1.0 - w.kv_usage for w in workers}
