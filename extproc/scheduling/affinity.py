"""Session affinity: prefer the worker that served the session's previous turn, whose cache
holds its context even when the prefix index has not learnt it (a restart, another replica's
picks, a precise index that lags its KV events). The binding is the session record's: the
scorer keeps nothing of its own."""

from __future__ import annotations

from collections.abc import Sequence

from .types import SchedulingRequest, Worker


class SessionAffinityScorer:
    """1.0 for the worker the session is bound to, 0.0 for the rest."""

    name = "session_affinity"

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        bound = request.bound_worker
        return {w.address: 1.0 if w.address == bound else 0.0 for w in workers}
