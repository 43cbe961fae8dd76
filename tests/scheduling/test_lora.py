"""LoRA affinity as a table: the gauge's adapters, the router's own live placements, slots."""

from __future__ import annotations

import pytest

from extproc.scheduling.lora import LoraAffinityScorer
from extproc.scheduling.types import SchedulingRequest, Worker


def request(adapter: str | None, session: str = "t/s") -> SchedulingRequest:
    return SchedulingRequest(adapter or "base", session, (), 100, adapter=adapter)


@pytest.mark.parametrize(("running", "waiting", "max_lora", "adapter", "expected"), [
    ({"a"}, set(), 4, "a", 1.0),          # active
    (set(), {"a"}, 4, "a", 1.0),          # queued there: as good as active
    ({"b", "c"}, set(), 4, "a", 0.8),     # a slot is free
    ({"b", "c"}, {"d", "e"}, 4, "a", 0.6),  # every slot taken: it must wait
    ({"b", "c"}, set(), None, "a", 0.8),  # max_lora unreported: a slot assumed
    ({"b", "c"}, {"d", "e"}, 4, None, 1.0),  # the base model: nothing to load
])
def test_the_gauge_scores(running: set[str], waiting: set[str], max_lora: int | None,
                          adapter: str | None, expected: float) -> None:
    worker = Worker("w", "base", adapters_running=frozenset(running),
                    adapters_waiting=frozenset(waiting), max_lora=max_lora)
    assert LoraAffinityScorer().score(request(adapter), [worker]) == {"w": expected}


def test_an_idle_sessions_adapter_still_holds_its_slot_until_the_session_is_idle() -> None:
    now = [0.0]
    scorer = LoraAffinityScorer(idle_seconds=60, clock=lambda: now[0])
    workers = [Worker("w1", "base", max_lora=1), Worker("w2", "base", max_lora=1)]
    scorer.picked(request("a", "t/1"), "w1")  # its session runs tools now: the gauge is empty
    assert scorer.score(request("a", "t/2"), workers) == {"w1": 1.0, "w2": 0.8}
    assert scorer.score(request("b", "t/3"), workers) == {"w1": 0.6, "w2": 0.8}
    now[0] = 61.0  # the session went idle: its slot is free again
    assert scorer.score(request("b", "t/3"), workers) == {"w1": 0.8, "w2": 0.8}


def test_a_session_that_moves_counts_once_and_memory_is_bounded() -> None:
    scorer = LoraAffinityScorer(max_sessions=2)
    workers = [Worker("w1", "base", max_lora=1), Worker("w2", "base", max_lora=1)]
    scorer.picked(request("a", "t/1"), "w1")
    scorer.picked(request("a", "t/1"), "w2")
    assert scorer.score(request("b"), workers) == {"w1": 0.8, "w2": 0.6}
    scorer.picked(request("c", "t/2"), "w1")
    scorer.picked(request("d", "t/3"), "w1")  # t/1 forgotten (the oldest)
    assert scorer.score(request("b"), workers) == {"w1": 0.6, "w2": 0.8}
