"""Dynamo KvRouter's cost form: ``overlap_weight x uncached prefill + active decode``, lowest
wins. Costed in tokens rather than Dynamo's blocks so that servers with different block sizes
(vLLM 16, SGLang 1) compare; with one block size the order is the same."""

from __future__ import annotations

from .types import SchedulingRequest, Worker

_SMOOTHING = 0.1


class DynamoCost:
    """Keeps a moving average of prompt sizes to price a request whose KV footprint the worker
    has not reported (no scrape yet, or a stale one)."""

    def __init__(self, overlap_weight: float = 1.0) -> None:
        self.overlap_weight = overlap_weight
        self.average_tokens: float | None = None

    def observe(self, request: SchedulingRequest) -> None:
        """Fold ``request``'s prompt size into the average (once per scheduled request)."""
        tokens = float(request.prompt_tokens)
        previous = self.average_tokens
        self.average_tokens = tokens if previous is None else previous + _SMOOTHING * (
            tokens - previous
        )

    def cost(self, request: SchedulingRequest, worker: Worker, matched_blocks: float) -> float:
        blocks = len(request.prompt_blocks)
        cached = matched_blocks / blocks if blocks else 0.0
        prefill = request.prompt_tokens * (1.0 - cached)
        return self.overlap_weight * prefill + self.active_tokens(worker)

    def active_tokens(self, worker: Worker) -> float:
        """KV held by the worker's running requests: its own report when fresh, else requests
        times the average prompt (a stale ``running`` is dropped, the router's in-flight
        count is current)."""
        capacity = worker.capacity_tokens
        if not worker.stale and capacity:
            return worker.kv_usage * capacity
        requests = worker.in_flight + (0 if worker.stale else worker.running)
        return requests * (self.average_tokens or 0.0)
