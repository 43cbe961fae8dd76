"""The scrape pacer: busy workers read at the busy pace, idle ones at the idle pace, a routing
decision read soon after (never faster than the busy pace), with an injected clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from extproc.config import Model
from extproc.scheduling.pacing import Pace, ScrapePacer
from extproc.scheduling.types import Worker
from extproc.scheduling.workers import WorkerRegistry

if TYPE_CHECKING:
    from tests.conftest import FakeClock

PACE = Pace(busy_seconds=0.5, idle_seconds=1.0)


@pytest.mark.parametrize(("busy", "idle", "staleness", "expected"), [
    (0.5, 1.0, 2.0, Pace(0.5, 1.0)),
    (0.5, 5.0, 2.0, Pace(0.5, 1.0)),    # an idle worker is read twice a staleness window
    (0.5, 5.0, 12.0, Pace(0.5, 5.0)),
    (2.0, 1.0, 2.0, Pace(2.0, 2.0)),    # never faster than the busy pace (an old slow config)
    (0.05, 0.05, 2.0, Pace(0.05, 0.05)),  # today's fixed 50 ms, asked for
])
def test_the_configured_pace(busy, idle, staleness, expected):
    assert Pace.of(busy, idle, staleness) == expected


def idle(worker: Worker) -> None:
    pass


def in_flight(worker: Worker) -> None:
    worker.in_flight = 1


def loaded(worker: Worker) -> None:
    worker.waiting = 2


def running(worker: Worker) -> None:
    worker.running = 1


def routed(worker: Worker) -> None:
    worker.routed += 2  # a request started and finished since the last read


def down(worker: Worker) -> None:
    worker.healthy = False


def stale(worker: Worker) -> None:
    worker.stale = True


@pytest.mark.parametrize(("state", "after", "due"), [
    (idle, 0.4, False),
    (idle, 0.9, False),
    (idle, 1.0, True),
    (in_flight, 0.4, False),   # the floor: a busy engine is not hammered
    (in_flight, 0.5, True),
    (loaded, 0.5, True),       # load the router did not send (another replica's)
    (running, 0.5, True),
    (routed, 0.1, False),
    (routed, 0.5, True),       # the answer to a routing decision changes its queue
    (down, 0.5, True),         # its return is noticed at the busy pace
    (stale, 0.5, True),
])
def test_a_worker_is_due_at_its_pace(
    clock: FakeClock, state: Callable[[Worker], None], after: float, due: bool
) -> None:
    pacer = ScrapePacer(PACE, clock=clock)
    worker = Worker("10.0.0.1:8000", "m")
    assert pacer.due([worker]) == [worker]  # never read: at once
    state(worker)
    clock.advance(after)
    assert pacer.due([worker]) == ([worker] if due else [])


def test_an_idle_pool_is_read_once_a_second(clock: FakeClock) -> None:
    pacer = ScrapePacer(PACE, clock=clock)
    workers = [Worker(f"10.0.0.{i}:8000", "m") for i in range(4)]
    reads = 0
    for _ in range(1000):  # ten seconds in 10 ms steps
        reads += len(pacer.due(workers))
        clock.advance(0.01)
    assert reads == 4 * 10


def test_wait_says_when_the_next_read_is_due(clock: FakeClock) -> None:
    pacer = ScrapePacer(PACE, clock=clock)
    quiet, busy = Worker("a:1", "m"), Worker("b:1", "m")
    assert pacer.wait([]) == float("inf")
    assert pacer.wait([quiet, busy]) == 0.0
    pacer.due([quiet, busy])
    assert pacer.wait([quiet, busy]) == pytest.approx(1.0)
    busy.in_flight = 1
    clock.advance(0.2)
    assert pacer.wait([quiet, busy]) == pytest.approx(0.3)
    assert pacer.due([quiet, busy]) == []  # asking does not read


def test_a_worker_in_two_pools_is_read_once(clock: FakeClock) -> None:
    pacer = ScrapePacer(PACE, clock=clock)
    base, adapter = Worker("a:1", "base"), Worker("a:1", "other")
    assert pacer.due([base, adapter]) == [base]
    adapter.routed = 1  # a request on the other model's pool
    clock.advance(0.5)
    assert pacer.due([base, adapter]) == [base]


def test_a_worker_that_leaves_is_forgotten_and_read_at_once_when_back(clock: FakeClock) -> None:
    pacer = ScrapePacer(PACE, clock=clock)
    worker = Worker("a:1", "m")
    pacer.due([worker])
    assert pacer.due([]) == []
    assert pacer.due([worker]) == [worker]


def test_the_registry_counts_what_the_router_did_and_says_when_it_starts(
    clock: FakeClock,
) -> None:
    registry = WorkerRegistry({"m": Model(cluster="m", endpoints=("a:1", "b:1"))}, clock=clock)
    woken: list[None] = []
    registry.on_started(lambda: woken.append(None))
    pacer = ScrapePacer(PACE, clock=clock)
    assert len(pacer.due(registry.pool("m"))) == 2
    for worker in registry.pool("m"):
        registry.apply_scrape(worker.address, "", clock())
    registry.started("a:1")
    registry.finished("a:1")
    assert len(woken) == 1
    [a, b] = registry.pool("m")
    assert (a.routed, b.routed, a.in_flight) == (2, 0, 0)
    clock.advance(0.5)
    assert pacer.due(registry.pool("m")) == [a]  # read soon after, its idle neighbour not
    clock.advance(0.5)
    assert pacer.due(registry.pool("m")) == [b]
