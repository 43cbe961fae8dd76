"""Predicted time to first token and inter-token latency per worker, fitted online.

A request's TTFT on a worker is mostly its own uncached prefill plus the work queued ahead of
it; its inter-token latency grows with the batch it joins. Both are fitted as linear models of
what the router measures at the pick — uncached prompt tokens, the worker's running and waiting
requests, its KV use, the uncached prompt tokens it sent there still without a first token —
by recursive least squares with a forgetting factor, one model per pool, so the fit follows a
pool whose hardware or traffic changes. Each observation is first checked against the
prediction made without it: that relative error is what ``errors`` reports (and the service
exports), the honest measure of how far to trust the SLO scorer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from .types import SchedulingRequest, Worker

WARM_OBSERVATIONS = 8
"""Below this many observations of a pool its predictions are None (the scorer is neutral)."""


@dataclass(frozen=True, slots=True)
class Features:
    """What the router knew of one worker when it picked it for one request."""

    uncached_tokens: float
    running: int
    waiting: int
    kv_usage: float
    pending_tokens: float = 0.0
    """Uncached prompt tokens of the requests the router sent this worker that have no first
    token yet: the prefill queued ahead of this one (a chunked-prefill engine shares its
    prefill budget among them, so it delays this request however few they are)."""

    @classmethod
    def of(cls, worker: Worker, uncached_tokens: float, pending_tokens: float = 0.0
           ) -> Features:
        return cls(uncached_tokens, worker.running, worker.waiting, worker.kv_usage,
                   pending_tokens)

    def ttft_row(self) -> tuple[float, ...]:
        tokens = self.uncached_tokens / 1000.0
        return (1.0, tokens, float(self.waiting), float(self.running), self.kv_usage,
                tokens * (self.waiting + 1), self.pending_tokens / 1000.0)

    def itl_row(self) -> tuple[float, ...]:
        return (1.0, float(self.running), self.kv_usage)


class _Fit:
    """Recursive least squares with forgetting: y ≈ θ·x, refitted one observation at a time."""

    def __init__(self, size: int, forgetting: float) -> None:
        self.theta = [0.0] * size
        self.p = [[1000.0 if i == j else 0.0 for j in range(size)] for i in range(size)]
        self.forgetting = forgetting
        self.seen = 0

    def predict(self, x: Sequence[float]) -> float:
        return sum(t * v for t, v in zip(self.theta, x, strict=True))

    def update(self, x: Sequence[float], y: float) -> None:
        p, lam = self.p, self.forgetting
        px = [sum(row[j] * x[j] for j in range(len(x))) for row in p]
        denominator = lam + sum(x[i] * px[i] for i in range(len(x)))
        gain = [v / denominator for v in px]
        residual = y - self.predict(x)
        self.theta = [t + g * residual for t, g in zip(self.theta, gain, strict=True)]
        self.p = [[(p[i][j] - gain[i] * px[j]) / lam for j in range(len(x))]
                  for i in range(len(x))]
        self.seen += 1


class LatencyPredictor:
    def __init__(self, *, forgetting: float = 0.995, window: int = 1000) -> None:
        """``forgetting``: the weight each older observation keeps per newer one (0.995: about
        the last 200 count); ``window``: relative errors kept per kind for ``errors``."""
        self._forgetting = forgetting
        self._ttft: dict[str, _Fit] = {}
        self._itl: dict[str, _Fit] = {}
        self._errors = {"ttft": deque[float](maxlen=window), "itl": deque[float](maxlen=window)}

    def ttft(self, pool: str, features: Features) -> float | None:
        """Predicted seconds to the first token (None: too few observations of this pool)."""
        return _predict(self._ttft.get(pool), features.ttft_row())

    def itl(self, pool: str, features: Features) -> float | None:
        """Predicted seconds between output tokens."""
        return _predict(self._itl.get(pool), features.itl_row())

    def observed_ttft(self, pool: str, features: Features, seconds: float) -> float | None:
        """Learn one TTFT; the relative error of the prediction made before it (None: cold)."""
        return self._learn("ttft", self._ttft, pool, features.ttft_row(), seconds)

    def observed_itl(self, pool: str, features: Features, seconds: float) -> float | None:
        return self._learn("itl", self._itl, pool, features.itl_row(), seconds)

    def median_error(self, kind: str) -> float | None:
        """Median relative error of the recent predictions of ``kind`` (``ttft``, ``itl``)."""
        errors = self._errors[kind]
        return median(errors) if errors else None

    def _learn(self, kind: str, fits: dict[str, _Fit], pool: str, row: tuple[float, ...],
               seconds: float) -> float | None:
        fit = fits.get(pool)
        if fit is None:
            fit = fits[pool] = _Fit(len(row), self._forgetting)
        predicted = _predict(fit, row)
        error = None
        if predicted is not None and seconds > 0:
            error = abs(predicted - seconds) / seconds
            self._errors[kind].append(error)
        fit.update(row, seconds)
        return error


def _predict(fit: _Fit | None, row: tuple[float, ...]) -> float | None:
    if fit is None or fit.seen < WARM_OBSERVATIONS:
        return None
    return max(0.0, fit.predict(row))


class SloScorer:
    """Prefers the workers predicted to meet the request's targets: for each of TTFT and the
    time per output token, 1 within it, then target / predicted (a worker twice too slow
    scores 0.5); a worker scores the lower of the two. Neutral (1) for a target it lacks or a
    pool the predictor has not learnt yet."""

    name = "slo"

    def __init__(self, predictor: LatencyPredictor | None) -> None:
        self.predictor = predictor

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        predictor, ttft, tpot = self.predictor, request.ttft, request.tpot
        if predictor is None or (ttft is None and tpot is None):
            return dict.fromkeys((w.address for w in workers), 1.0)
        scores = {}
        for worker in workers:
            features = Features.of(worker, uncached_tokens(request, worker.address))
            scores[worker.address] = min(
                _within(ttft, predictor.ttft(request.model, features)),
                _within(tpot, predictor.itl(request.model, features)))
        return scores


def _within(target: float | None, predicted: float | None) -> float:
    if target is None or predicted is None or predicted <= target:
        return 1.0
    return target / predicted


def uncached_tokens(request: SchedulingRequest, address: str) -> float:
    """The prompt tokens ``address`` would prefill: the share of its blocks not matched there
    (what the scheduler measured, when it did)."""
    blocks = len(request.prompt_blocks)
    matched = request.matched.get(address, 0.0) if request.matched else 0.0
    return request.prompt_tokens * (1.0 - min(matched, blocks) / blocks) if blocks else float(
        request.prompt_tokens)
