"""Filters run before scoring: they narrow the candidates and never raise. An empty result is
the router's 503 (no worker may serve this request)."""

from __future__ import annotations

from collections.abc import Sequence

from .types import SchedulingRequest, Worker


class SubsetFilter:
    """Only the addresses of the proxy's subset hint; no hint keeps all, an empty hint none."""

    name = "subset"

    def filter(self, request: SchedulingRequest, workers: Sequence[Worker]) -> list[Worker]:
        if request.subset is None:
            return list(workers)
        return [w for w in workers if w.address in request.subset]


class HealthyFilter:
    """Drop workers the router has marked unhealthy."""

    name = "healthy"

    def filter(self, request: SchedulingRequest, workers: Sequence[Worker]) -> list[Worker]:
        return [w for w in workers if w.healthy]


class DecodeFilter:
    """Only workers that serve requests: a prefill-only worker (role ``prefill``) takes only
    its decode workers' sidecars' calls."""

    name = "decode_role"

    def filter(self, request: SchedulingRequest, workers: Sequence[Worker]) -> list[Worker]:
        return [w for w in workers if w.decodes]


class PrefillFilter:
    """Only prefill workers: the candidates of a split request's prefill pick."""

    name = "prefill_role"

    def filter(self, request: SchedulingRequest, workers: Sequence[Worker]) -> list[Worker]:
        return [w for w in workers if w.prefills]
