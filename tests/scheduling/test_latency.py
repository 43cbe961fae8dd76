"""The online latency predictor: cold, then fitted; its errors are what it missed first."""

from __future__ import annotations

import random

import pytest

from extproc.scheduling.latency import WARM_OBSERVATIONS, Features, LatencyPredictor, SloScorer
from extproc.scheduling.types import SchedulingRequest, Worker


def ttft(f: Features) -> float:
    """A known truth: 0.05 s + 0.2 s per 1,000 uncached tokens + 0.3 s per waiting request."""
    return 0.05 + 0.2 * f.uncached_tokens / 1000 + 0.3 * f.waiting


def test_cold_pools_predict_nothing() -> None:
    predictor = LatencyPredictor()
    f = Features(1000, 1, 0, 0.2)
    for _ in range(WARM_OBSERVATIONS - 1):
        assert predictor.observed_ttft("m", f, 0.25) is None
    assert predictor.ttft("m", f) is None
    predictor.observed_ttft("m", f, 0.25)
    assert predictor.ttft("m", f) == pytest.approx(0.25, rel=0.05)
    assert predictor.ttft("other", f) is None


def test_it_learns_a_linear_relation_and_reports_its_misses() -> None:
    rng = random.Random(7)
    predictor = LatencyPredictor()
    for _ in range(300):
        f = Features(rng.randrange(100, 30_000), rng.randrange(0, 8), rng.randrange(0, 6),
                     rng.random())
        predictor.observed_ttft("m", f, ttft(f))
    for f in (Features(20_000, 2, 0, 0.5), Features(500, 4, 5, 0.9)):
        assert predictor.ttft("m", f) == pytest.approx(ttft(f), rel=0.02)
    error = predictor.median_error("ttft")
    assert error is not None and error < 0.02


@pytest.mark.parametrize(("running", "itl"), [(1, 0.012), (8, 0.026), (32, 0.074)])
def test_inter_token_latency_grows_with_the_batch(running: int, itl: float) -> None:
    predictor = LatencyPredictor()
    for r in range(1, 40):
        predictor.observed_itl("m", Features(0, r, 0, 0.5), 0.01 + 0.002 * r)
    assert predictor.itl("m", Features(0, running, 0, 0.5)) == pytest.approx(itl, rel=0.05)


def test_predictions_are_never_negative() -> None:
    predictor = LatencyPredictor()
    for n in range(20):
        predictor.observed_ttft("m", Features(1000 * n, 0, 0, 0.0), 0.1 * n)
    assert predictor.ttft("m", Features(0, 0, 0, 0.0)) == pytest.approx(0.0, abs=0.01)
    assert predictor.ttft("m", Features(-50_000, 0, 0, 0.0)) == 0.0


def test_the_prefill_queued_ahead_is_learnt() -> None:
    """A chunked-prefill engine shares its budget among the prompts it has not finished: the
    tokens sent ahead (``pending_tokens``) delay a request however few requests they are."""
    rng = random.Random(3)
    predictor = LatencyPredictor()

    def truth(f: Features) -> float:
        return 0.05 + 0.2 * f.uncached_tokens / 1000 + 0.06 * f.pending_tokens / 1000

    for _ in range(300):
        f = Features(rng.randrange(100, 30_000), rng.randrange(0, 8), rng.randrange(0, 2),
                     rng.random(), rng.randrange(0, 60_000))
        predictor.observed_ttft("m", f, truth(f))
    for f in (Features(1000, 4, 0, 0.5, 0), Features(1000, 4, 0, 0.5, 50_000)):
        assert predictor.ttft("m", f) == pytest.approx(truth(f), rel=0.02)


def fitted() -> LatencyPredictor:
    """TTFT = 1 s per 1,000 uncached tokens; ITL = 0.01 s per running request."""
    predictor = LatencyPredictor()
    for n in range(1, 30):
        predictor.observed_ttft("m", Features(1000.0 * (n % 6), 0, 0, 0.0), 1.0 * (n % 6))
        predictor.observed_itl("m", Features(0, n, 0, 0.0), 0.01 * n)
    return predictor


# Two workers: w0 holds half the prompt (2,000 of 4,000 tokens uncached) and runs 2 requests;
# w1 holds nothing (4,000 uncached) and runs 8.
SLO_ROWS = [
    pytest.param(None, None, {"w0": 1.0, "w1": 1.0}, id="no target: neutral"),
    pytest.param(3.0, None, {"w0": 1.0, "w1": 0.75}, id="TTFT: w1 is predicted 4 s for 3"),
    pytest.param(None, 0.04, {"w0": 1.0, "w1": 0.5}, id="TPOT: w1 is predicted 0.08 s for 0.04"),
    pytest.param(1.0, 0.04, {"w0": 0.5, "w1": 0.25}, id="both: the lower of the two"),
]


@pytest.mark.parametrize(("ttft", "tpot", "expected"), SLO_ROWS)
def test_the_slo_scorer_prefers_workers_predicted_within_target(
        ttft: float | None, tpot: float | None, expected: dict[str, float]) -> None:
    workers = [Worker("w0", "m", running=2), Worker("w1", "m", running=8)]
    request = SchedulingRequest("m", None, tuple(range(10)), 4000, matched={"w0": 5.0},
                                ttft=ttft, tpot=tpot)
    scores = SloScorer(fitted()).score(request, workers)
    assert scores == pytest.approx(expected, rel=0.02)


def test_the_slo_scorer_is_neutral_for_a_pool_not_learnt_yet() -> None:
    request = SchedulingRequest("other", None, (1,), 100, ttft=0.001, tpot=0.001)
    assert SloScorer(fitted()).score(request, [Worker("w0", "other")]) == {"w0": 1.0}
