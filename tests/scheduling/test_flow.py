"""Flow control as tables: saturation, the dispatch order, shedding, expiry, service."""

from __future__ import annotations

import pytest

from extproc.config import FlowControl
from extproc.scheduling.flow import Arrival, FlowController
from extproc.scheduling.latency import Features, LatencyPredictor
from extproc.scheduling.types import Worker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def workers(*waiting: int, kv: float = 0.1) -> list[Worker]:
    return [Worker(f"w{i}:8000", "m", waiting=n, kv_usage=kv, scraped_at=1.0)
            for i, n in enumerate(waiting)]


def arrival(tenant: str = "t", program: str = "p", klass: str = "interactive",
            phase: str = "turn", tokens: int = 1000, **kw: object) -> Arrival:
    return Arrival("m", tenant, program, klass, phase, tokens, **kw)  # type: ignore[arg-type]


def controller(**kw: object) -> tuple[FlowController, Clock]:
    clock = Clock()
    config = FlowControl(enabled=True, **kw)  # type: ignore[arg-type]
    return FlowController(config, clock=clock), clock


@pytest.mark.parametrize(("waiting", "kv", "room"), [
    ((0, 0), 0.1, 10),          # two idle workers, threshold 5 each
    ((4, 5), 0.1, 1),           # one has room for one more
    ((5, 7), 0.1, 0),           # both at or past the threshold: saturated
    ((0, 0), 0.8, 0),           # KV at the threshold: saturated whatever the queue
    ((0, 0), 0.79, 10),
])
def test_room_reads_waiting_and_kv(waiting: tuple[int, ...], kv: float, room: int) -> None:
    flow, _ = controller()
    assert flow.room("m", workers(*waiting, kv=kv)) == room


@pytest.mark.parametrize(("waiting", "kv", "healthy", "unsaturated"), [
    ((0, 4, 5), (0.1, 0.1, 0.1), (True, True, True), {"w0:8000", "w1:8000"}),
    ((0, 0), (0.8, 0.5), (True, True), {"w1:8000"}),       # w0's KV at the threshold
    ((0, 0), (0.1, 0.1), (False, True), {"w1:8000"}),      # w0 down
    ((5, 6), (0.1, 0.1), (True, True), set()),             # a saturated pool: none
])
def test_unsaturated_names_the_workers_with_room(waiting: tuple[int, ...],
                                                 kv: tuple[float, ...],
                                                 healthy: tuple[bool, ...],
                                                 unsaturated: set[str]) -> None:
    flow, _ = controller()
    pool = [Worker(f"w{i}:8000", "m", waiting=n, kv_usage=k, healthy=h, scraped_at=1.0)
            for i, (n, k, h) in enumerate(zip(waiting, kv, healthy, strict=True))]
    assert flow.unsaturated(pool) == unsaturated


def test_requests_sent_since_the_scrape_count_as_waiting() -> None:
    flow, _ = controller(queue_depth_threshold=2)
    pool = workers(0)
    assert flow.room("m", pool) == 2
    pool[0].in_flight = 2          # two routed since the scrape
    assert flow.room("m", pool) == 0
    pool[0].scraped_at = 2.0       # the next scrape knows them
    assert flow.room("m", pool) == 2


def test_an_unsaturated_pool_with_an_empty_queue_admits_at_once() -> None:
    flow, _ = controller()
    entered = flow.enter(arrival(), workers(0))
    assert (entered.ticket, entered.shed) == (None, None)


def test_disabled_never_queues() -> None:
    flow = FlowController(FlowControl(), clock=Clock())
    assert flow.enter(arrival(), workers(9, 9)).ticket is None


def queue_all(flow: FlowController, pool: list[Worker], *arrivals: Arrival) -> list[str]:
    tickets = []
    for a in arrivals:
        entered = flow.enter(a, pool)
        assert entered.ticket is not None and entered.shed is None
        tickets.append(entered.ticket)
    return tickets


# Each row: the queued arrivals (in arrival order), service already attained (tenant, program,
# tokens), and the order dispatch must wake them in.
ORDER = [
    pytest.param([arrival("a", "p1"), arrival("a", "p1"), arrival("a", "p1")], [], [0, 1, 2],
                 id="first come first served when all else is equal"),
    pytest.param([arrival("noisy", "n1"), arrival("noisy", "n2"), arrival("quiet", "q1")],
                 [("noisy", "n0", 50_000)], [2, 0, 1],
                 id="the tenant with less attained service goes first"),
    pytest.param([arrival("a", "big"), arrival("a", "small")], [("a", "big", 30_000)], [1, 0],
                 id="within a tenant the program with less attained service goes first"),
    pytest.param([arrival(klass="batch"), arrival(klass="interactive")], [], [1, 0],
                 id="within a program the higher class goes first"),
    pytest.param([arrival(phase="first"), arrival(phase="turn"), arrival(phase="continuation")],
                 [], [2, 1, 0], id="an open tool loop's continuation before a first prefill"),
    pytest.param([arrival("a", "new", phase="first"), arrival("a", "old", phase="continuation")],
                 [("a", "old", 40_000)], [1, 0],
                 id="a continuation goes before a new program's first turn despite its service"),
    pytest.param([arrival("a", "old", klass="batch", phase="continuation"),
                  arrival("a", "new", phase="first")], [], [1, 0],
                 id="the class ranks above the phase"),
    pytest.param([arrival("a", "x", phase="continuation"), arrival("a", "y", phase="continuation")],
                 [("a", "x", 10_000)], [1, 0],
                 id="among continuations the program with less service goes first"),
]


@pytest.mark.parametrize(("arrivals", "served", "order"), ORDER)
def test_dispatch_order(arrivals: list[Arrival], served: list[tuple[str, str, int]],
                        order: list[int]) -> None:
    flow, _ = controller(output_weight=2.0)
    for tenant, program, tokens in served:
        flow.finished(tenant, program, tokens // 2)
    pool = workers(5)
    tickets = queue_all(flow, pool, *arrivals)
    woken = []
    for _ in arrivals:  # one place frees at a time
        pool[0].waiting -= 1
        woken += flow.dispatch("m", pool)
        for t in woken[-1:]:
            assert flow.claim(t, late=False) == "go"
        pool[0].waiting += 1
    assert woken == [tickets[i] for i in order]


def test_tenant_weights_share_the_service() -> None:
    flow, _ = controller(tenant_weights={"gold": 4.0})
    flow.finished("gold", "g", 15_000)   # 30,000 tokens of service, /4
    flow.finished("free", "f", 5_000)    # 10,000 tokens of service, /1
    pool = workers(5)
    tickets = queue_all(flow, pool, arrival("free", "f"), arrival("gold", "g"))
    pool[0].waiting = 4
    assert flow.dispatch("m", pool) == [tickets[1]]


def test_service_decays_with_its_half_life() -> None:
    flow, clock = controller(half_life_seconds=60.0, output_weight=2.0)
    flow.finished("t", "p", 500)
    assert flow.service("t") == pytest.approx(1000.0)
    clock.now += 60.0
    assert flow.service("t") == pytest.approx(500.0)
    assert flow.service("t", "p") == pytest.approx(500.0)


def test_a_burst_of_one_program_does_not_delay_another_programs_turn() -> None:
    flow, _ = controller()
    pool = workers(5)
    burst = queue_all(flow, pool, *(arrival("t", "parent", phase="first") for _ in range(20)))
    turn = queue_all(flow, pool, arrival("t", "other"))
    pool[0].waiting = 3
    woken = flow.dispatch("m", pool)
    assert woken[0] == turn[0] and woken[1] == burst[0]


@pytest.mark.parametrize(("klass", "saturated", "shed"), [
    ("sheddable", True, "saturated"),
    ("sheddable", False, None),
    ("interactive", True, None),
])
def test_sheddable_is_refused_while_saturated(klass: str, saturated: bool,
                                              shed: str | None) -> None:
    flow, _ = controller()
    entered = flow.enter(arrival(klass=klass), workers(5 if saturated else 0))
    assert entered.shed == shed


def test_a_full_queue_evicts_its_lowest_class_first() -> None:
    flow, _ = controller(max_queued=3)
    pool = workers(5)
    tickets = queue_all(flow, pool, arrival(klass="interactive"), arrival(klass="batch"),
                        arrival(klass="batch"))
    entered = flow.enter(arrival(klass="interactive"), pool)
    assert entered.ticket is not None and entered.evicted == (tickets[2],)  # the newest batch
    assert flow.claim(tickets[2], late=False) == "evicted"
    # A batch request finds only its own class or better: it is refused, nobody is evicted.
    assert flow.enter(arrival(klass="batch"), pool).shed == "queue_full"
    assert flow.queued() == {("m", "interactive"): 2, ("m", "batch"): 1}


@pytest.mark.parametrize(("deadline_in", "timeout", "expiry"), [
    (None, 60.0, "ttl"),       # the class's TTL
    (5.0, 5.0, "deadline"),    # the client's deadline is sooner
    (600.0, 60.0, "ttl"),
])
def test_a_wait_is_bounded_by_ttl_and_deadline(deadline_in: float | None, timeout: float,
                                               expiry: str) -> None:
    flow, clock = controller()
    deadline = None if deadline_in is None else clock.now + deadline_in
    entered = flow.enter(arrival(deadline=deadline), workers(5))
    assert entered.ticket is not None
    assert (entered.timeout, entered.expiry) == (pytest.approx(timeout), expiry)
    assert flow.claim(entered.ticket, late=False) == "wait"
    assert flow.claim(entered.ticket, late=True) == "expired"
    assert flow.queued() == {}


def test_a_past_deadline_is_shed_at_once() -> None:
    flow, clock = controller()
    assert flow.enter(arrival(deadline=clock.now - 1), workers(5)).shed == "deadline"


def test_cancel_frees_a_dispatched_place() -> None:
    flow, _ = controller(queue_depth_threshold=1)
    pool = workers(1)
    (ticket,) = queue_all(flow, pool, arrival())
    pool[0].waiting = 0
    assert flow.dispatch("m", pool) == [ticket]
    assert flow.room("m", pool) == 0    # the dispatched request will take the place
    flow.cancel(ticket)
    assert flow.room("m", pool) == 1


def test_queued_reports_depth_by_class() -> None:
    flow, _ = controller()
    queue_all(flow, workers(5), arrival(), arrival(klass="batch"), arrival())
    assert flow.queued() == {("m", "interactive"): 2, ("m", "batch"): 1}


def test_a_sheddable_request_no_worker_can_serve_in_time_is_shed() -> None:
    predictor = LatencyPredictor()
    for n in range(20):  # TTFT = 1 s per 1,000 uncached tokens
        predictor.observed_ttft("m", Features(1000.0 * (n % 5 + 1), 0, 0, 0.1),
                                1.0 * (n % 5 + 1))
    flow = FlowController(FlowControl(enabled=True), clock=Clock(), predictor=predictor)
    pool = workers(0)  # not saturated
    cases = [("sheddable", 4000, 2.0, "slo"), ("sheddable", 1000, 2.0, None),
             ("sheddable", 4000, None, None), ("interactive", 4000, 2.0, None)]
    for klass, tokens, ttft, shed in cases:
        entered = flow.enter(arrival(klass=klass, tokens=tokens, ttft=ttft), pool)
        assert (entered.shed, entered.ticket) == (shed, None), (klass, tokens, ttft)


@pytest.mark.parametrize(("headers", "klass", "deadline", "ttft"), [
    ({}, "interactive", None, 2.0),
    ({"x-saar-class": "batch"}, "batch", None, None),
    ({"x-saar-class": "nonsense"}, "interactive", None, 2.0),
    ({"x-saar-deadline-ms": "1500", "x-saar-slo-ttft-ms": "250"}, "interactive", 1.5, 0.25),
    ({"x-saar-deadline-ms": "-3", "x-saar-slo-ttft-ms": "abc"}, "interactive", None, 2.0),
])
def test_headers_name_class_and_targets(headers: dict[str, str], klass: str,
                                        deadline: float | None, ttft: float | None) -> None:
    flow, _ = controller()
    assert flow.klass(headers) == klass
    assert flow.targets(headers, klass) == (deadline, ttft)


@pytest.mark.parametrize(("ttft", "pinned", "waiting", "placeable"), [
    (2.0, None, (5, 0), frozenset({"w1:8000"})),   # a target: only the worker with room
    (None, None, (5, 0), None),                    # no target: the scorers decide
    (2.0, "w0:8000", (5, 0), None),                # a hard lock: its issuer, whatever its load
    (2.0, None, (5, 5), None),                     # nobody has room: no limit
])
def test_a_targeted_request_is_placed_where_there_is_room(
        ttft: float | None, pinned: str | None, waiting: tuple[int, ...],
        placeable: frozenset[str] | None) -> None:
    flow, _ = controller()
    assert flow.placeable(arrival(ttft=ttft), workers(*waiting), pinned) == placeable
