"""Flow control as tables: saturation, the dispatch order, shedding, expiry, service."""

from __future__ import annotations

from dataclasses import replace

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


CAPACITY = 100_000
"""The KV tokens of a worker that reports its cache (``sized``)."""


def sized(address: str = "w0:8000", *, waiting: int = 0, kv: float = 0.0,
          healthy: bool = True, role: str = "both") -> Worker:
    """A worker that reports its KV capacity: CAPACITY tokens."""
    return Worker(address, "m", waiting=waiting, kv_usage=kv, block_size=16,
                  num_blocks=CAPACITY // 16, scraped_at=1.0, healthy=healthy, role=role)


def arrival(tenant: str = "t", program: str = "p", klass: str = "interactive",
            phase: str = "turn", tokens: int = 1000, **kw: object) -> Arrival:
    return Arrival("m", tenant, program, klass, phase, tokens, **kw)  # type: ignore[arg-type]


def controller(**kw: object) -> tuple[FlowController, Clock]:
    clock = Clock()
    config = FlowControl(enabled=True, **kw)  # type: ignore[arg-type]
    return FlowController(config, clock=clock), clock


def by_rank_alone(**kw: object) -> tuple[FlowController, Clock]:
    """A controller whose classes share one queue depth and no prefill cap: only the rank
    orders dispatch."""
    classes = {name: replace(c, queue_depth=None, prefill_tokens=None)
               for name, c in FlowControl().classes.items()}
    return controller(classes=classes, **kw)


# Each row: the worker (waiting, KV in use, reports its capacity?, healthy, role), the
# request (class, prompt tokens), the places it finds. Interactive: depth 5, the whole KV;
# batch: depth 1, its prompt under 97% of the KV, 8,192 tokens of pending prefill at most.
ROOM = [
    pytest.param(0, 0.1, False, True, "both", "interactive", 1000, 5, id="an idle worker"),
    pytest.param(4, 0.1, False, True, "both", "interactive", 1000, 1, id="one place left"),
    pytest.param(5, 0.1, False, True, "both", "interactive", 1000, 0, id="at the depth"),
    pytest.param(0, 0.1, False, True, "both", "batch", 1000, 1, id="batch: depth 1"),
    pytest.param(1, 0.1, False, True, "both", "batch", 1000, 0,
                 id="batch: one waiting is enough"),
    pytest.param(0, 0.97, False, True, "both", "batch", 1000, 0,
                 id="no capacity reported: KV use at the threshold"),
    pytest.param(0, 0.96, False, True, "both", "batch", 1000, 1,
                 id="no capacity reported: under it"),
    pytest.param(0, 0.99, False, True, "both", "interactive", 1000, 5,
                 id="interactive: its own threshold, the whole cache"),
    pytest.param(0, 0.5, True, True, "both", "batch", 47_000, 1, id="the prompt fits (97%)"),
    pytest.param(0, 0.5, True, True, "both", "batch", 48_000, 0, id="the prompt does not fit"),
    pytest.param(0, 0.5, True, True, "both", "interactive", 50_000, 5,
                 id="interactive: it fits the whole cache"),
    pytest.param(0, 0.5, True, True, "both", "interactive", 50_001, 0,
                 id="interactive: it does not"),
    pytest.param(0, 0.0, True, True, "both", "batch", 500_000, 1,
                 id="an idle worker takes a prompt larger than its cache"),
    pytest.param(0, 0.1, True, False, "both", "interactive", 1000, 0, id="down"),
    pytest.param(0, 0.1, True, True, "prefill", "interactive", 1000, 0,
                 id="a prefill worker does not decode"),
]


@pytest.mark.parametrize(("waiting", "kv", "reports", "healthy", "role", "klass", "tokens",
                          "places"), ROOM)
def test_room_by_class_reads_waiting_and_kv(waiting: int, kv: float, reports: bool,
                                            healthy: bool, role: str, klass: str,
                                            tokens: int, places: int) -> None:
    flow, _ = controller()
    worker = (sized(waiting=waiting, kv=kv, healthy=healthy, role=role) if reports
              else Worker("w0:8000", "m", waiting=waiting, kv_usage=kv, scraped_at=1.0,
                          healthy=healthy, role=role))
    assert flow.room(worker, arrival(klass=klass, tokens=tokens)) == places


def test_requests_sent_since_the_scrape_count_as_waiting_and_in_the_kv() -> None:
    flow, _ = controller(queue_depth_threshold=2)
    worker = sized(kv=0.5)
    big = arrival(tokens=30_000)
    assert flow.room(worker, big) == 2
    worker.in_flight = 1               # one routed since the scrape ...
    flow.started(big, worker.address, 30_000, dispatched=False)  # ... with a 30k prompt
    assert flow.room(worker, arrival(tokens=1000)) == 1
    assert flow.room(worker, big) == 0  # 0.5 + 0.3 + 0.3 of the cache
    worker.scraped_at, worker.kv_usage = 2.0, 0.8  # the next scrape knows it
    assert flow.room(worker, arrival(tokens=1000)) == 2
    assert flow.room(worker, big) == 0


# Each row: the class whose turn ended (and whether it had a TTFT target), the seconds since,
# the class asking; whether a 41k prompt fits (30k of the 100k cache in use, 27k reserved:
# 98% with the reservation, 71% without).
RESERVED = [
    pytest.param("interactive", True, 0.0, "batch", False,
                 id="a targeted turn's prompt and answer are held against a lower class"),
    pytest.param("interactive", True, 0.0, "interactive", True,
                 id="not against its own class"),
    pytest.param("interactive", True, 20.0, "batch", True, id="lapsed after reserve_seconds"),
    pytest.param("interactive", False, 0.0, "batch", True, id="no target: nothing held"),
    pytest.param("batch", True, 0.0, "sheddable", False, id="any class above the asker"),
]


@pytest.mark.parametrize(("ended", "targeted", "after", "asking", "fits"), RESERVED)
def test_a_targeted_turn_reserves_its_kv_on_its_worker(ended: str, targeted: bool,
                                                       after: float, asking: str,
                                                       fits: bool) -> None:
    flow, clock = controller(reserve_seconds=20.0)
    worker = sized(kv=0.3)
    turn = arrival(klass=ended, tokens=25_000, session="s", ttft=2.0 if targeted else None)
    flow.finished(turn, worker.address, prompt_tokens=25_000, output_tokens=2_000)
    clock.now += after
    assert (flow.room(worker, arrival(klass=asking, tokens=41_000)) > 0) == fits


def test_the_sessions_next_turn_takes_its_reservation_up() -> None:
    flow, _ = controller()
    worker = sized(kv=0.3)
    turn = arrival(tokens=25_000, session="s", ttft=2.0)
    flow.finished(turn, worker.address, prompt_tokens=25_000, output_tokens=2_000)
    assert flow.room(worker, arrival(klass="batch", tokens=45_000)) == 0  # 30% + 27% + 45%
    flow.started(turn, worker.address, 500, dispatched=False)
    worker.scraped_at, worker.kv_usage = 2.0, 0.57  # the scrape shows its turn's KV in use
    # Held no more: 57% + 30% fits (it would not if the reservation counted twice).
    assert flow.room(worker, arrival(klass="batch", tokens=30_000)) == 1


def test_a_lower_class_waits_while_the_worker_has_a_long_prefill_pending() -> None:
    flow, _ = controller()
    worker = sized(kv=0.1)
    flow.started(arrival(), worker.address, 8192, dispatched=False, request="r1")
    assert flow.room(worker, arrival(klass="batch")) == 0
    assert flow.room(worker, arrival()) == 5  # interactive has no prefill cap
    flow.first_token("r1")
    assert flow.room(worker, arrival(klass="batch")) == 1
    flow.started(arrival(), worker.address, 9000, dispatched=False, request="r2")
    flow.finished(arrival(), worker.address, 9000, 10, request="r2")  # no first token seen
    assert flow.room(worker, arrival(klass="batch")) == 1


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
    flow, _ = by_rank_alone(output_weight=2.0)
    for tenant, program, tokens in served:
        flow.finished(arrival(tenant, program), None, 0, tokens // 2)
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


class Ticking(Clock):
    """A live clock: every read is a little later."""

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def test_one_instant_ranks_the_whole_queue() -> None:
    classes = {name: replace(c, queue_depth=None, prefill_tokens=None)
               for name, c in FlowControl().classes.items()}
    flow = FlowController(FlowControl(enabled=True, classes=classes), clock=Ticking())
    flow.finished(arrival(), None, 0, 50_000)  # the tenant has service, decaying as it ticks
    pool = workers(5)
    continuation, _ = queue_all(flow, pool, arrival(phase="continuation", program="a"),
                                arrival(phase="first", program="b"))
    pool[0].waiting = 4
    assert flow.dispatch("m", pool) == [continuation]


def test_tenant_weights_share_the_service() -> None:
    flow, _ = controller(tenant_weights={"gold": 4.0})
    flow.finished(arrival("gold", "g"), None, 0, 15_000)  # 30,000 tokens of service, /4
    flow.finished(arrival("free", "f"), None, 0, 5_000)   # 10,000 tokens of service, /1
    pool = workers(5)
    tickets = queue_all(flow, pool, arrival("free", "f"), arrival("gold", "g"))
    pool[0].waiting = 4
    assert flow.dispatch("m", pool) == [tickets[1]]


def test_service_decays_with_its_half_life() -> None:
    flow, clock = controller(half_life_seconds=60.0, output_weight=2.0)
    flow.finished(arrival("t", "p"), None, 0, 500)
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
    (first,) = queue_all(flow, pool, arrival())
    pool[0].waiting = 0
    assert flow.dispatch("m", pool) == [first]
    (second,) = queue_all(flow, pool, arrival())  # the dispatched one will take the place
    flow.cancel(first)
    assert flow.dispatch("m", pool) == [second]


def test_a_draining_process_lets_its_whole_queue_go_to_the_engines() -> None:
    """No room anywhere, yet every queued request is woken (to its home, if it has one) and
    goes when it claims its ticket; one already dispatched is not woken twice."""
    flow, _ = controller(queue_depth_threshold=1)
    pool = workers(3, 3)
    first, homed, other = queue_all(flow, pool, arrival(), arrival(home="w1:8000"),
                                    arrival(tenant="u"))
    assert flow.dispatch("m", pool) == []  # saturated
    pool[0].waiting = 0
    (went,) = flow.dispatch("m", pool)
    pool[0].waiting = 3
    released = flow.release("m")
    assert sorted(released) == sorted({first, homed, other} - {went})
    assert flow.release("m") == [] and flow.release("other-pool") == []
    assert [flow.claim(t, late=False) for t in (first, homed, other)] == ["go"] * 3
    assert flow.queued() == {}


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


# Each row: the request (its home, pinned there?, TTFT target?, seconds it waited), the
# workers' waiting requests (w0, w1, w2; batch: depth 1) and KV use, where it may be placed.
PLACEABLE = [
    pytest.param(None, False, False, 0.0, (1, 0, 0), 0.5, {"w1:8000", "w2:8000"},
                 id="no home: the workers with room"),
    pytest.param("w0:8000", False, False, 0.0, (0, 0, 0), 0.5, {"w0:8000"},
                 id="its home, where its context is"),
    pytest.param("w0:8000", False, False, 0.0, (1, 0, 0), 0.5, None,
                 id="its home is full: it waits for it (no limit if placed anyway)"),
    pytest.param("w0:8000", False, False, 5.0, (1, 0, 0), 0.5, {"w1:8000", "w2:8000"},
                 id="after spill_seconds: an underused worker"),
    pytest.param("w0:8000", False, False, 5.0, (1, 0, 0), 0.85, None,
                 id="none is underused: it keeps waiting for its home"),
    pytest.param("w0:8000", True, False, 5.0, (1, 0, 0), 0.5, None,
                 id="a hard lock's home: never elsewhere"),
    pytest.param("w0:8000", False, True, 5.0, (1, 0, 0), 0.5, None,
                 id="a TTFT target: waiting beats re-prefilling elsewhere"),
    pytest.param("w9:8000", False, False, 0.0, (1, 0, 0), 0.5, {"w1:8000", "w2:8000"},
                 id="a home no longer in the pool: as no home"),
]


@pytest.mark.parametrize(("home", "pinned", "targeted", "waited", "waiting", "kv", "where"),
                         PLACEABLE)
def test_a_request_is_placed_where_it_found_room(home: str | None, pinned: bool,
                                                 targeted: bool, waited: float,
                                                 waiting: tuple[int, ...], kv: float,
                                                 where: set[str] | None) -> None:
    flow, _ = controller()
    pool = [sized(f"w{i}:8000", waiting=n, kv=kv) for i, n in enumerate(waiting)]
    request = arrival(klass="batch", home=home, pinned=pinned, waited=waited,
                      ttft=2.0 if targeted else None)
    assert flow.placeable(request, pool, None) == (None if where is None else frozenset(where))


def test_a_hard_locks_request_is_left_to_the_pick() -> None:
    flow, _ = controller()
    assert flow.placeable(arrival(home="w0:8000", pinned=True), workers(0, 0), "w0:8000") is None


def test_a_request_its_class_keeps_out_does_not_hold_the_room_of_another_class() -> None:
    flow, _ = controller()
    pool = [sized("w0:8000", waiting=5)]
    batch, interactive = queue_all(flow, pool, arrival("a", klass="batch", home="w0:8000"),
                                   arrival("b", home="w0:8000"))
    flow.finished(arrival("b"), None, 0, 10_000)  # the batch request ranks first
    pool[0].waiting = 2  # room for interactive (depth 5), none for batch (depth 1)
    assert flow.dispatch("m", pool) == [interactive]
    assert flow.claim(interactive, late=False) == "go"
    pool[0].waiting = 0  # it runs: nobody waits
    assert flow.dispatch("m", pool) == [batch]


def test_a_request_dispatched_anywhere_takes_a_home_that_is_the_only_room() -> None:
    flow, _ = controller(queue_depth_threshold=1)
    pool = [sized("w0:8000", waiting=1), sized("w1:8000", waiting=1)]
    anywhere, homed = queue_all(flow, pool, arrival("a"), arrival("b", home="w0:8000"))
    flow.finished(arrival("b"), None, 0, 10_000)  # a ranks first
    pool[0].waiting = 0
    assert flow.dispatch("m", pool) == [anywhere]  # not placed yet: w0 is the only room
    assert flow.dispatch("m", pool) == []
    assert flow.claim(anywhere, late=False) == "go"
    assert flow.placeable(arrival("a"), pool, None) == {"w0:8000"}  # it ranks first
    pool[1].waiting = 0  # room elsewhere for it: the home's room is the homed one's
    assert flow.dispatch("m", pool) == [homed]


def test_room_that_shows_up_before_the_dispatch_is_left_to_the_request_waiting_there() -> None:
    """A request dispatched to any worker is placed after its home's room showed up for a
    waiting continuation (one scrape landed, the dispatch that follows them all not yet):
    it takes the room it was dispatched for, not the continuation's."""
    flow, _ = controller(queue_depth_threshold=1)
    pool = [sized("w0:8000", waiting=1), sized("w1:8000", waiting=1)]
    anywhere, _continuation = queue_all(
        flow, pool, arrival("a", phase="first"),
        arrival("b", phase="continuation", home="w0:8000", pinned=True))
    pool[1].waiting = 0
    assert flow.dispatch("m", pool) == [anywhere]
    assert flow.claim(anywhere, late=False) == "go"
    pool[0].waiting = 0  # w0's scrape lands before the next dispatch
    assert flow.placeable(arrival("a", phase="first"), pool, None) == {"w1:8000"}
    pool[1].waiting = 1  # a scrape older than the finish that freed its room
    assert flow.placeable(arrival("a", phase="first"), pool, None) == {"w1:8000"}


def test_a_request_waiting_for_its_home_is_not_passed_there() -> None:
    flow, _ = controller()
    pool = [sized("w0:8000", waiting=1), sized("w1:8000", waiting=1)]
    big, small, elsewhere = (arrival("a", klass="batch", home="w0:8000", tokens=60_000),
                             arrival("b", klass="batch", home="w0:8000", tokens=1_000),
                             arrival("c", klass="batch", home="w1:8000", tokens=1_000))
    tickets = queue_all(flow, pool, big, small, elsewhere)
    flow.finished(arrival("b"), None, 0, 10_000)  # b and c have been served more than a
    flow.finished(arrival("c"), None, 0, 10_000)
    pool[0].waiting = pool[1].waiting = 0
    pool[0].kv_usage = 0.5  # the big one does not fit at its home yet, the small one would
    assert flow.dispatch("m", pool) == [tickets[2]]  # w0's room is the big one's; w1 serves
    pool[0].kv_usage = 0.3
    assert flow.dispatch("m", pool) == [tickets[0]]


