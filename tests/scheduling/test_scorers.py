from __future__ import annotations

import pytest

from extproc.scheduling.affinity import SessionAffinityScorer
from extproc.scheduling.prefix_index import ApproximatePrefixIndex
from extproc.scheduling.scorers import KvUtilizationScorer, PrefixScorer, QueueScorer
from extproc.scheduling.types import SchedulingRequest, Worker


def request(
    blocks: tuple[int, ...] = (1, 2, 3, 4), session: str | None = "t/s"
) -> SchedulingRequest:
    return SchedulingRequest("m", session, blocks, prompt_tokens=64)


def test_prefix_scorer_is_the_matched_share_of_the_prompt() -> None:
    index = ApproximatePrefixIndex()
    index.routed("a", (1, 2, 3, 4))
    index.routed("b", (1, 2, 9))
    workers = [Worker("a", "m"), Worker("b", "m"), Worker("c", "m")]
    scorer = PrefixScorer(index)
    assert scorer.score(request(), workers) == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert scorer.score(request(blocks=()), workers) == {"a": 0.0, "b": 0.0, "c": 0.0}


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ([(0, 0, False), (5, 0, False), (10, 0, False)], [1.0, 0.5, 0.0]),
        ([(3, 0, False), (3, 0, False)], [1.0, 1.0]),
        ([(2, 9, False), (4, 0, False)], [1.0, 0.0]),  # fresh: in-flight not counted
        ([(2, 9, True), (4, 0, False)], [0.0, 1.0]),  # stale: 2 + 9 in flight
        ([(0, 0, False)], [1.0]),
    ],
)
def test_queue_scorer(queues: list[tuple[int, int, bool]], expected: list[float]) -> None:
    workers = [
        Worker(str(i), "m", waiting=waiting, in_flight=in_flight, stale=stale)
        for i, (waiting, in_flight, stale) in enumerate(queues)
    ]
    scores = QueueScorer().score(request(), workers)
    assert [scores[w.address] for w in workers] == expected


def test_queue_scorer_with_no_workers() -> None:
    assert QueueScorer().score(request(), []) == {}


def test_kv_utilization_scorer() -> None:
    workers = [Worker("a", "m", kv_usage=0.0), Worker("b", "m", kv_usage=0.75)]
    assert KvUtilizationScorer().score(request(), workers) == {"a": 1.0, "b": 0.25}


def test_session_affinity_follows_the_sessions_binding() -> None:
    """The binding is the session record's (the worker that served it last): the scorer reads
    it from the request and keeps nothing, so another replica's picks count too."""
    scorer = SessionAffinityScorer()
    workers = [Worker("a", "m"), Worker("b", "m")]
    assert scorer.score(request(), workers) == {"a": 0.0, "b": 0.0}
    bound = SchedulingRequest("m", "t/1", (1,), prompt_tokens=64, bound_worker="b")
    assert scorer.score(bound, workers) == {"a": 0.0, "b": 1.0}
    gone = SchedulingRequest("m", "t/1", (1,), prompt_tokens=64, bound_worker="c")
    assert scorer.score(gone, workers) == {"a": 0.0, "b": 0.0}
