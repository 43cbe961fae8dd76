"""What one router did on one workload in one round (``Measure``), and the figures the report
gives for it over the rounds (``figures``): the keys of ``--json``'s router entries."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FIGURES = ("prefix_hit", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "throughput_tok_s",
           "added_p50_ms_c1", "cpu_ms_per_req_c16", "rss_mib")
"""The keys of a measured router's entry, in order."""


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The ``pct``-th percentile, interpolated linearly between the closest ranks (numpy's
    default); None of nothing."""
    if not values:
        return None
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile out of range: {pct}")
    ordered = sorted(values)
    rank = pct / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(slots=True)
class Overhead:
    """A router's cost measured on a tiny streamed request, once a round."""

    added_p50_ms_c1: float
    """At concurrency 1, the median over pairs of its latency less the same request's sent
    straight to a worker just before."""
    rps_c16: float
    cpu_ms_per_req_c16: float
    """Its processes' user + system CPU over the requests at concurrency 16."""
    requests_c16: int = 0
    errors: int = 0


@dataclass(frozen=True, slots=True)
class PreciseCount:
    """saar's precise index against the engine (``precise``): requests compared, and those
    whose predicted cached tokens were within one block of what the engine reported."""

    requests: int = 0
    within_one_block: int = 0

    def __add__(self, other: PreciseCount) -> PreciseCount:
        return PreciseCount(self.requests + other.requests,
                            self.within_one_block + other.within_one_block)

    def figure(self) -> dict[str, int]:
        """The ``precise_index`` entry of ``--json``."""
        return {"requests": self.requests, "within_one_block": self.within_one_block}


@dataclass(slots=True)
class Measure:
    """One router on one workload in one round."""

    round: int
    hit_tokens: float = 0.0
    query_tokens: float = 0.0
    """The workers' own prefix-cache counters over the workload, summed."""
    ttfts_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    wall_s: float = 0.0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    """Failed requests by kind (``http 429``, ``TimeoutError``...)."""
    rss_mib: float = 0.0
    """The router's processes' peak RSS, summed, by the end of the workload."""
    overhead: Overhead | None = None
    precise: PreciseCount | None = None
    """saar's precise index on this workload (a backend whose engines report cached tokens
    and publish KV events: real vLLM)."""

    @property
    def throughput_tok_s(self) -> float:
        """Output tokens per second of the workload's wall time."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def figures(measures: Sequence[Measure]) -> dict[str, float | None]:
    """The router's entry over its rounds: the hit rate of all their tokens together, TTFT
    percentiles of all their requests together, the median round's throughput, added latency
    and CPU, and the largest RSS."""
    hits = sum(m.hit_tokens for m in measures)
    queries = sum(m.query_tokens for m in measures)
    ttfts = [t for m in measures for t in m.ttfts_s]
    overheads = [m.overhead for m in measures if m.overhead is not None]
    return {
        "prefix_hit": _round(hits / queries, 4) if queries else None,
        "ttft_p50_s": _round(percentile(ttfts, 50), 4),
        "ttft_p90_s": _round(percentile(ttfts, 90), 4),
        "ttft_p99_s": _round(percentile(ttfts, 99), 4),
        "throughput_tok_s": _round(_median([m.throughput_tok_s for m in measures]), 1),
        "added_p50_ms_c1": _round(_median([o.added_p50_ms_c1 for o in overheads]), 3),
        "cpu_ms_per_req_c16": _round(_median([o.cpu_ms_per_req_c16 for o in overheads]), 3),
        "rss_mib": _round(max((m.rss_mib for m in measures), default=0.0), 1),
    }


def details(measures: Sequence[Measure]) -> dict[str, Any]:
    """What the table shows beside the figures: the workload's requests and failures (by
    kind), req/s at c=16 (median round), rounds."""
    overheads = [m.overhead for m in measures if m.overhead is not None]
    kinds: dict[str, int] = {}
    for m in measures:
        for kind, count in m.errors.items():
            kinds[kind] = kinds.get(kind, 0) + count
    return {
        "requests": sum(m.requests for m in measures),
        "errors": sum(kinds.values()),
        "error_kinds": kinds,
        "overhead_errors": sum(o.errors for o in overheads),
        "rps_c16": _round(_median([o.rps_c16 for o in overheads]), 1),
        "rounds": len(measures),
    }
