from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from extproc.config import Admission
from extproc.scheduling.admission import AdmissionController, AdmissionTick
from extproc.scheduling.types import Worker

if TYPE_CHECKING:
    from tests.conftest import FakeClock

W = Worker("w", "m", block_size=16, num_blocks=625)  # 10,000 tokens of KV
BUFFER = 100


def controller(clock: FakeClock, **overrides: float) -> AdmissionController:
    """ThunderAgent's published thresholds, which these tests were written against, with new
    sessions held too (off by default; its own tests turn it off)."""
    thresholds = {"pause_threshold": 0.95, "resume_target": 0.80, "demote_threshold": 0.80,
                  "new_session_tokens": 1000, "hold_new_sessions": True}
    config = Admission(enabled=True, **{**thresholds, **overrides})  # type: ignore[arg-type]
    return AdmissionController(config, clock=clock)


def acting(ac: AdmissionController, key: str, tokens: int, worker: str = "w") -> None:
    """A program between turns whose context weighs ``tokens`` (buffer included)."""
    ac.turn_started(key, worker, tokens - BUFFER)
    ac.turn_finished(key, worker, tokens - BUFFER - 50, 50)


def reasoning(ac: AdmissionController, key: str, tokens: int, worker: str = "w") -> None:
    ac.turn_started(key, worker, tokens - BUFFER)


def test_oversubscribed_worker_pauses_smallest_acting_down_to_the_target(
    clock: FakeClock,
) -> None:
    ac = controller(clock)
    acting(ac, "p3", 3000)
    acting(ac, "p1", 1000)
    acting(ac, "p2", 2000)
    reasoning(ac, "r", 3600)
    assert ac.utilization("w") == 0.0  # capacity unknown before the first tick
    tick = ac.tick([W])
    assert tick == AdmissionTick(paused=("p1", "p2"))  # 0.96 -> 0.86 -> 0.66 <= 0.80
    assert ac.utilization("w") == pytest.approx(0.66)
    assert [ac.is_paused(k) for k in ("p1", "p2", "p3", "r")] == [True, True, False, False]
    assert ac.paused_count() == 2


@pytest.mark.parametrize(
    ("load", "paused"),
    [(9400, ()), (9500, ("small",))],  # 0.94 is below the pause threshold, 0.95 is not
)
def test_pause_threshold_is_inclusive(
    clock: FakeClock, load: int, paused: tuple[str, ...]
) -> None:
    ac = controller(clock)
    acting(ac, "small", 2000)
    reasoning(ac, "big", load - 2000)
    assert ac.tick([W]).paused == paused


def test_reasoning_programs_are_never_paused_mid_turn(clock: FakeClock) -> None:
    ac = controller(clock)
    reasoning(ac, "r1", 6000)
    reasoning(ac, "r2", 4000)
    assert ac.tick([W]) == AdmissionTick()
    assert not ac.is_paused("r1") and not ac.is_paused("r2")
    ac.turn_finished("r1", "w", 5850, 50)  # r1 is not the smallest: stays active
    assert not ac.is_paused("r1")
    ac.turn_finished("r2", "w", 3850, 50)  # the smallest pauses at its tool boundary
    assert ac.is_paused("r2")


def paused_a_and_c(ac: AdmissionController) -> None:
    """a (1000) and c (2000) paused, 3000 of ACTING ``keep`` left on the worker."""
    acting(ac, "keep", 3000)
    acting(ac, "c", 2000)
    acting(ac, "a", 1000)
    reasoning(ac, "r", 3500)
    assert ac.tick([W]).paused == ("a", "c")  # 0.95 -> 0.85 -> 0.65 <= 0.80
    ac.release("r")


@pytest.mark.parametrize(
    ("other_load", "resumed"),
    [
        (4500, ("a",)),  # 3000 + 4500 + a = 8500: exactly 0.85, c would make 1.05
        (4501, ()),  # a would take U to 0.8501
        (0, ("a", "c")),  # 3000 + 1000 + 2000 = 0.60, smallest first
    ],
)
def test_resume_smallest_first_while_it_fits_under_the_hysteresis_line(
    clock: FakeClock, other_load: int, resumed: tuple[str, ...]
) -> None:
    ac = controller(clock)
    paused_a_and_c(ac)
    if other_load:
        reasoning(ac, "other", other_load)
    assert ac.tick([W]) == AdmissionTick(resumed=resumed)
    for key in ("a", "c"):
        assert ac.is_paused(key) is (key not in resumed)
        assert ac.priority(key) == (1.0 if key in resumed else 0.0)


def test_resumed_priority_lasts_until_the_next_turn(clock: FakeClock) -> None:
    ac = controller(clock)
    paused_a_and_c(ac)
    ac.tick([W])
    assert ac.priority("a") == 1.0
    ac.turn_started("a", "w", 1000)
    assert ac.priority("a") == 0.0


def test_soft_demotion_in_the_band_below_the_pause_threshold(clock: FakeClock) -> None:
    ac = controller(clock)
    acting(ac, "x", 3900)
    reasoning(ac, "y", 4000)
    acting(ac, "elsewhere", 100, worker="v")
    ac.tick([W])  # 0.79
    assert (ac.priority("x"), ac.priority("y"), ac.priority("elsewhere")) == (0.0, 0.0, 0.0)
    reasoning(ac, "z", 600)  # 0.85: demoted, not paused
    assert ac.tick([W]) == AdmissionTick()
    assert (ac.priority("x"), ac.priority("z"), ac.priority("elsewhere")) == (-2.0, -2.0, 0.0)
    ac.release("z")
    ac.tick([W])
    assert ac.priority("x") == 0.0


def test_forced_resume_after_the_cap_even_when_still_full(clock: FakeClock) -> None:
    ac = controller(clock)
    acting(ac, "small", 1000)
    reasoning(ac, "hog", 9000)
    assert ac.tick([W]).paused == ("small",)
    clock.advance(1799)
    reasoning(ac, "hog", 9000)  # the hog keeps working, keeps the worker full
    assert ac.tick([W]) == AdmissionTick()
    clock.advance(1)
    assert ac.tick([W]) == AdmissionTick(resumed=("small",))  # not paused again this tick
    assert not ac.is_paused("small")
    assert ac.priority("small") == 1.0


def test_acting_programs_weigh_acting_weight(clock: FakeClock) -> None:
    ac = controller(clock, acting_weight=0.5)
    acting(ac, "a", 4000)
    reasoning(ac, "r", 2000)
    ac.tick([W])
    assert ac.utilization("w") == pytest.approx(0.4)


def test_release_sessionless_and_idle_programs(clock: FakeClock) -> None:
    ac = controller(clock)
    acting(ac, "small", 1000)
    reasoning(ac, "hog", 9000)
    ac.tick([W])
    assert ac.is_paused("small")
    ac.release("small")  # x-dynamo-session-final
    assert ac.paused_count() == 0
    assert ac.is_paused("small")  # a new session again, and the worker has no room for it
    ac.release("small")  # the client gave up: it leaves the arrival queue too
    assert ac.paused_count() == 0
    ac.turn_started(None, "w", 99_999)
    ac.turn_finished(None, "w", 99_999, 1)
    ac.release(None)
    assert (len(ac), ac.is_paused(None), ac.priority(None)) == (1, False, 0.0)
    clock.advance(3601)
    ac.tick([W])
    assert len(ac) == 0


def test_a_worker_without_capacity_and_a_disabled_controller_do_nothing(
    clock: FakeClock,
) -> None:
    ac = controller(clock)
    acting(ac, "a", 1000)
    reasoning(ac, "r", 50_000)
    assert ac.tick([Worker("w", "m")]) == AdmissionTick()
    off = AdmissionController(Admission(enabled=False), clock=clock)
    acting(off, "a", 1000)
    reasoning(off, "r", 50_000)
    assert off.tick([W]) == AdmissionTick()
    assert not off.is_paused("a")
    assert len(off) == 0  # issue 9 item 7: disabled, it keeps no program at all


def test_programs_are_bounded_least_recent_first(clock: FakeClock) -> None:
    ac = AdmissionController(Admission(enabled=True), clock=clock, max_programs=3)
    for key in ("a", "b", "c"):
        reasoning(ac, key, 100)
    acting(ac, "a", 100)  # a is the most recent now
    reasoning(ac, "d", 100)
    assert len(ac) == 3
    assert ("a" in ac, "b" in ac, "c" in ac, "d" in ac) == (True, False, True, True)


TWO = [W, Worker("v", "m", block_size=16, num_blocks=625)]


def test_new_sessions_wait_behind_paused_programs_then_go_where_there_is_room(
    clock: FakeClock,
) -> None:
    ac = controller(clock)
    acting(ac, "small", 1000)
    reasoning(ac, "hog", 9000)
    ac.tick(TWO)
    assert ac.is_paused("small")
    assert ac.is_paused("new")  # held although worker v is empty: "small" comes first
    assert ac.paused_count() == 2
    ac.turn_finished("hog", "w", 1000, 0)  # paused at its boundary; its context shrank
    tick = ac.tick(TWO)
    assert tick.resumed == ("small", "hog", "new")  # the paused ones, then the new one
    assert (ac.preferred_worker("small"), ac.preferred_worker("new")) == ("w", "v")
    assert not ac.is_paused("new")
    ac.turn_started("new", "v", 700)
    assert ac.preferred_worker("new") is None
    assert ac.utilization("v") == pytest.approx(0.08)  # the estimate gave way to the turn


def test_a_new_session_waits_while_no_worker_has_room_under_the_admit_line(
    clock: FakeClock,
) -> None:
    ac = controller(clock, admit_threshold=0.5)
    assert not ac.is_paused("first")  # capacity unknown: nothing to hold against
    reasoning(ac, "first", 4500)
    ac.tick([W])
    assert ac.is_paused("second")  # 0.45 + 0.11 > 0.5, although nothing is paused
    assert ac.is_paused("third")
    ac.release("first")
    assert ac.tick([W]).resumed == ("second", "third")  # oldest first, each fits


def test_an_admitted_new_session_that_never_comes_lapses(clock: FakeClock) -> None:
    ac = controller(clock, admit_threshold=0.5, hold_timeout_seconds=30.0)
    reasoning(ac, "first", 4500)
    ac.tick([W])
    assert ac.is_paused("gone")
    ac.release("first")
    ac.tick([W])
    assert len(ac) == 1  # its reservation
    clock.advance(31)
    ac.tick([W])
    assert len(ac) == 0


def test_new_sessions_are_not_held_when_told_not_to(clock: FakeClock) -> None:
    ac = controller(clock, hold_new_sessions=False)
    reasoning(ac, "hog", 9900)
    ac.tick([W])
    assert not ac.is_paused("new")


def test_a_tick_reports_boundary_pauses_and_forgotten_programs(clock: FakeClock) -> None:
    ac = controller(clock)
    reasoning(ac, "hog", 12_000)
    assert ac.tick([W]).paused == ()  # a turn in flight: paused at its boundary instead
    ac.turn_finished("hog", "w", 12_000, 0)
    assert ac.is_paused("hog")
    assert ac.tick([W]).paused == ("hog",)
    assert ac.tick([W]).paused == (), "reported once"
    clock.advance(4000)
    assert ac.tick([W]).forgotten == ("hog",)


def test_a_resumed_program_goes_back_to_its_worker_until_its_next_turn(clock: FakeClock) -> None:
    ac = controller(clock)
    acting(ac, "a", 6000)
    acting(ac, "b", 6000)
    assert ac.tick([W]).paused == ("a",)
    ac.turn_finished("b", "w", 100, 0)
    assert ac.tick([W]).resumed == ("a",)
    assert ac.preferred_worker("a") == "w"
    ac.turn_started("a", "w", 6000)
    assert ac.preferred_worker("a") is None
