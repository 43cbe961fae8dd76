from __future__ import annotations

import pytest

from extproc.scheduling.sessions import ActiveSessionsScorer
from extproc.scheduling.types import SchedulingRequest, Worker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def turn(session: str | None, tokens: int = 1000) -> SchedulingRequest:
    return SchedulingRequest("m", session, (1, 2), prompt_tokens=tokens)


WORKERS = [Worker("a", "m"), Worker("b", "m"), Worker("c", "m")]


def test_new_sessions_go_where_the_live_sessions_hold_least_kv() -> None:
    scorer = ActiveSessionsScorer(clock=Clock())
    assert scorer.score(turn("new"), WORKERS) == {"a": 1.0, "b": 1.0, "c": 1.0}
    scorer.picked(turn("s1", 4000), "a")
    scorer.picked(turn("s2", 2000), "b")
    assert scorer.score(turn("new"), WORKERS) == {"a": 0.0, "b": 0.5, "c": 1.0}
    assert scorer.score(turn(None), WORKERS) == {"a": 0.0, "b": 0.5, "c": 1.0}


def test_a_placed_session_is_left_to_the_cache_scorers() -> None:
    scorer = ActiveSessionsScorer(clock=Clock())
    scorer.picked(turn("s1", 4000), "a")
    assert scorer.score(turn("s1"), WORKERS) == {"a": 1.0, "b": 1.0, "c": 1.0}
    # its worker left the candidates: it is placed afresh, by load
    assert scorer.score(turn("s1"), WORKERS[1:]) == {"b": 1.0, "c": 1.0}


def test_a_session_weighs_its_latest_turn_and_moves_with_it() -> None:
    scorer = ActiveSessionsScorer(clock=Clock())
    scorer.picked(turn("s1", 4000), "a")
    scorer.picked(turn("s1", 6000), "a")
    assert scorer.load("a") == 6000
    scorer.picked(turn("s1", 7000), "b")
    assert (scorer.load("a"), scorer.load("b")) == (0, 7000)
    scorer.picked(turn(None, 9000), "c")  # no session: nothing to remember
    assert scorer.load("c") == 0 and len(scorer) == 1


def test_idle_sessions_expire_and_memory_is_bounded() -> None:
    clock = Clock()
    scorer = ActiveSessionsScorer(idle_seconds=60.0, clock=clock, max_sessions=2)
    scorer.picked(turn("s1"), "a")
    clock.now = 30.0
    scorer.picked(turn("s2"), "b")
    clock.now = 61.0
    assert (scorer.load("a"), scorer.load("b")) == (0, 1000)
    scorer.picked(turn("s3"), "c")
    scorer.picked(turn("s4"), "c")
    assert len(scorer) == 2 and scorer.load("b") == 0 and scorer.load("c") == 2000


def test_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        ActiveSessionsScorer(idle_seconds=0)
    with pytest.raises(ValueError):
        ActiveSessionsScorer(max_sessions=0)


def test_config_rejects_a_non_positive_idle_window() -> None:
    from extproc.config import ConfigError, parse_config

    data = {"models": {"m": {"cluster": "c"}},
            "scheduling": {"session_idle_seconds": 0}}
    with pytest.raises(ConfigError, match="session_idle_seconds"):
        parse_config(data)
