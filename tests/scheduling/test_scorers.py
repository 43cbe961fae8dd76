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


def test_session_affinity_follows_the_last_pick_and_is_bounded() -> None:
    scorer = SessionAffinityScorer(max_sessions=2)
    workers = [Worker("a", "m"), Worker("b", "m")]
    assert scorer.score(request(), workers) == {"a": 0.0, "b": 0.0}
    scorer.picked(request(session="t/1"), "b")
    assert scorer.score(request(session="t/1"), workers) == {"a": 0.0, "b": 1.0}
    scorer.picked(request(session="t/1"), "a")
    assert scorer.score(request(session="t/1"), workers) == {"a": 1.0, "b": 0.0}
    scorer.picked(request(session="t/2"), "a")
    scorer.picked(request(session="t/3"), "a")  # evicts t/1, the least recent
    assert len(scorer) == 2
    assert scorer.score(request(session="t/1"), workers) == {"a": 0.0, "b": 0.0}


def test_session_affinity_ignores_sessionless_requests() -> None:
    scorer = SessionAffinityScorer()
    scorer.picked(request(session=None), "a")
    assert len(scorer) == 0
    assert scorer.score(request(session=None), [Worker("a", "m")]) == {"a": 0.0}
