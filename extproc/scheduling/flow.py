"""Flow control: a queue per pool in front of the pick, entered only while the pool is saturated.

Saturation reads the signals the scorers read: a worker is saturated when its waiting requests
(as last scraped, plus what the router sent it since, less what finished) reach
``queue_depth_threshold`` or its KV use reaches ``kv_threshold``; a pool is saturated when the
room its workers have left is taken by requests already dispatched from its queue.

Dispatch ranks the queued requests by, in order: their tenant's attained service over its weight
(fairness across tenants); their class's priority (what the client says matters); within a
class, an open tool loop's continuation first (its KV is warm, and finishing it frees memory);
then their program's attained service (a program is a root session with its sub-agents: least
attained service, so one program's burst of 200 sub-agents does not delay another program's
turn); a later turn before a new session's first prefill; then arrival. Service is uncached
input tokens plus ``output_weight`` × output tokens, decayed with a ``half_life_seconds``
half-life (llm-d's program-aware fairness). Class ranks above program because a new session is
a new program, with no service yet: least attained service alone would put every first
prefill ahead of the continuations.

A request never waits past its class's TTL or its own deadline: the hold's timeout is the
earlier of the two. Sheddable classes are refused while the pool is saturated (and whenever no
worker is predicted to meet their TTFT target); a full queue evicts its lowest class first.
Pure: the exchange holds the request (``Hold(kind="queue")``) and wakes the tickets
``dispatch`` returns.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..config import FlowControl, PriorityClass
from ..types import Clock
from .latency import Features, LatencyPredictor
from .types import Worker

REASONS = ("saturated", "queue_full", "evicted", "ttl", "deadline", "slo")
"""Why a request was shed (the metric's bounded label, the drop-reason header's value)."""
PHASES = ("continuation", "turn", "first")
"""A request's phase, best first: it continues an open tool loop, it is a later turn, or it
opens a new session."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """What flow control needs of one request, read once by the router."""

    pool: str
    tenant: str
    program: str
    """The root session (a sub-agent's parent's key, else its own; else the request's id)."""
    klass: str
    phase: str
    tokens: int
    """Prompt tokens it brings (its service estimate until its placement says what was cached)."""
    deadline: float | None = None
    """Clock time the client stops waiting (its deadline header), if it sent one."""
    ttft: float | None = None
    """Its TTFT target in seconds (header, else its class's), if any."""
    tpot: float | None = None
    """Its per-output-token target in seconds (header, else its class's), if any."""


@dataclass(frozen=True, slots=True)
class Entered:
    """``enter``'s verdict: go now (``ticket`` None, ``shed`` None), wait as ``ticket`` for up
    to ``timeout`` seconds, or be refused for ``shed``. ``woken``: other tickets dispatched now;
    ``evicted``: tickets pushed out (their holders wake to a refusal)."""

    ticket: str | None = None
    timeout: float = 0.0
    shed: str | None = None
    woken: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    expiry: str = "ttl"
    """What a wait that runs out is: ``ttl`` (the class's) or ``deadline`` (the client's)."""


@dataclass(slots=True)
class _Queued:
    ticket: str
    arrival: Arrival
    since: float
    order: int
    shed: str | None = None
    dispatched: bool = False


@dataclass(slots=True)
class _Service:
    """Decayed attained service: ``value`` as of ``at``."""

    value: float = 0.0
    at: float = 0.0


@dataclass(slots=True)
class _Pool:
    queue: dict[str, _Queued] = field(default_factory=dict)
    dispatched: int = 0
    """Tickets woken whose requests have not been placed yet: room they will take."""


class FlowController:
    def __init__(self, config: FlowControl, *, clock: Clock,
                 predictor: LatencyPredictor | None = None) -> None:
        self.config = config
        self._clock = clock
        self._predictor = predictor
        self._pools: dict[str, _Pool] = {}
        self._tickets: dict[str, _Queued] = {}
        self._tenants: dict[str, _Service] = {}
        self._programs: OrderedDict[tuple[str, str], _Service] = OrderedDict()
        self._baseline: dict[str, tuple[float | None, int]] = {}
        """address → (scrape time, in-flight count then): what was sent since its scrape."""
        self._order = itertools.count()

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    # -- reading a request -----------------------------------------------------------------

    def klass(self, headers: Mapping[str, str]) -> str:
        """The request's class: its header's, when the configuration knows it."""
        named = headers.get(self.config.class_header)
        return named if named in self.config.classes else self.config.default_class

    def targets(self, headers: Mapping[str, str], klass: str) -> tuple[float | None,
                                                                       float | None]:
        """(seconds the client waits at most, TTFT target in seconds): headers first (ms),
        then the class's TTFT; a malformed or non-positive header value counts as absent."""
        config = self.config
        ttft = _seconds(headers.get(config.ttft_header))
        return (_seconds(headers.get(config.deadline_header)),
                ttft if ttft is not None else config.classes[klass].ttft_seconds)

    def tpot(self, headers: Mapping[str, str], klass: str) -> float | None:
        """Its per-output-token target in seconds: the header's (ms), else its class's."""
        found = _seconds(headers.get(self.config.tpot_header))
        return found if found is not None else self.config.classes[klass].tpot_seconds

    # -- saturation ------------------------------------------------------------------------

    def room(self, pool: str, workers: Sequence[Worker]) -> int:
        """Requests the pool takes before it is saturated, less those already dispatched."""
        room = sum(self._room(worker) for worker in workers)
        state = self._pools.get(pool)
        return room - (state.dispatched if state is not None else 0)

    def unsaturated(self, workers: Sequence[Worker]) -> frozenset[str]:
        """The workers with room."""
        return frozenset(w.address for w in workers if self._room(w) > 0)

    def placeable(self, arrival: Arrival, workers: Sequence[Worker],
                  pinned: str | None) -> frozenset[str] | None:
        """Where a request with a TTFT target may be placed (the pick's subset; None: no
        limit): the workers with room, so the room it was admitted against is the room it
        takes, not a saturated worker's that its prefix or session affinity prefers. Never for
        a request a hard lock pins (its issuer serves it, whatever its load), nor when no
        worker has room."""
        if not self.config.enabled or arrival.ttft is None or pinned is not None:
            return None
        return self.unsaturated(workers) or None

    def _room(self, worker: Worker) -> int:
        config = self.config
        if not worker.healthy or not worker.decodes or worker.kv_usage >= config.kv_threshold:
            return 0
        return max(0, config.queue_depth_threshold - self._waiting(worker))

    def _waiting(self, worker: Worker) -> int:
        """Waiting requests as scraped, plus those sent since the scrape (less those that
        finished: a finished request let a waiting one run)."""
        base = self._baseline.get(worker.address)
        if base is None or base[0] != worker.scraped_at:
            base = self._baseline[worker.address] = (worker.scraped_at, worker.in_flight)
        return max(0, worker.waiting + worker.in_flight - base[1])

    # -- the queue -------------------------------------------------------------------------

    def enter(self, arrival: Arrival, workers: Sequence[Worker]) -> Entered:
        """Admit ``arrival`` now, queue it, or shed it."""
        if not self.config.enabled:
            return Entered()
        now = self._clock()
        state = self._pools.setdefault(arrival.pool, _Pool())
        klass = self.config.classes[arrival.klass]
        if self._hopeless(arrival, workers, klass):
            return Entered(shed="slo")
        room = self.room(arrival.pool, workers)
        if not state.queue and room > 0:
            return Entered()
        if klass.sheddable:
            return Entered(shed="saturated")
        left = klass.ttl_seconds
        expiry = "ttl"
        if arrival.deadline is not None and arrival.deadline - now < left:
            left, expiry = arrival.deadline - now, "deadline"
            if left <= 0:
                return Entered(shed="deadline")
        evicted: tuple[str, ...] = ()
        if len(state.queue) >= self.config.max_queued:
            victim = self._victim(state, arrival)
            if victim is None:
                return Entered(shed="queue_full")
            self._evict(state, victim)
            evicted = (victim.ticket,)
        ticket = f"q{next(self._order)}"
        queued = _Queued(ticket, arrival, now, next(self._order))
        state.queue[ticket] = queued
        self._tickets[ticket] = queued
        woken = self.dispatch(arrival.pool, workers)
        if ticket in woken:  # its own dispatch: it goes now, charged when placed
            self.claim(ticket, late=False)
            self._charge(arrival.tenant, arrival.program, -arrival.tokens)
            return Entered(woken=tuple(t for t in woken if t != ticket), evicted=evicted)
        return Entered(ticket, left, woken=tuple(woken), evicted=evicted, expiry=expiry)

    def dispatch(self, pool: str, workers: Sequence[Worker]) -> list[str]:
        """Tickets of ``pool`` to wake now, best ranked first, while the pool has room."""
        state = self._pools.get(pool)
        if state is None or not state.queue:
            return []
        room = self.room(pool, workers)
        woken: list[str] = []
        waiting = [q for q in state.queue.values() if not q.dispatched]
        while room > 0 and waiting:
            best = min(waiting, key=self._rank)
            waiting.remove(best)
            best.dispatched = True
            state.dispatched += 1
            room -= 1
            woken.append(best.ticket)
            self._charge(best.arrival.tenant, best.arrival.program, best.arrival.tokens)
        return woken

    def claim(self, ticket: str, *, late: bool) -> str:
        """The holder of ``ticket`` woke (dispatched, its periodic look, or ``late``: its time
        ran out): ``go`` (its place is taken now), ``wait`` (not dispatched yet, time left),
        ``expired`` (it leaves the queue unserved) or ``evicted``."""
        queued = self._tickets.get(ticket)
        if queued is None:
            return "evicted"
        if queued.shed is None and not queued.dispatched and not late:
            return "wait"
        del self._tickets[ticket]
        state = self._pools[queued.arrival.pool]
        state.queue.pop(ticket, None)
        if queued.shed is not None:
            return queued.shed
        if not queued.dispatched:
            return "expired"
        state.dispatched -= 1
        return "go"

    def cancel(self, ticket: str) -> None:
        """The request went away (its client hung up): its place, dispatched or not, is freed."""
        queued = self._tickets.pop(ticket, None)
        if queued is None:
            return
        state = self._pools[queued.arrival.pool]
        state.queue.pop(ticket, None)
        if queued.dispatched and queued.shed is None:
            state.dispatched -= 1

    def queued(self) -> dict[tuple[str, str], int]:
        """(pool, class) → requests waiting, for the depth gauge."""
        depth: dict[tuple[str, str], int] = {}
        for pool, state in self._pools.items():
            for q in state.queue.values():
                if not q.dispatched:
                    key = (pool, q.arrival.klass)
                    depth[key] = depth.get(key, 0) + 1
        return depth

    # -- service ---------------------------------------------------------------------------

    def started(self, arrival: Arrival, uncached_tokens: int, dispatched: bool) -> None:
        """A request was placed: charge what it costs, its uncached prompt (a dispatched one
        was charged its whole prompt at dispatch, and gets the difference back)."""
        if not self.config.enabled:
            return
        charge = uncached_tokens - (arrival.tokens if dispatched else 0)
        self._charge(arrival.tenant, arrival.program, charge)

    def finished(self, tenant: str, program: str, output_tokens: int) -> None:
        if self.config.enabled and output_tokens > 0:
            self._charge(tenant, program, self.config.output_weight * output_tokens)

    def service(self, tenant: str, program: str | None = None) -> float:
        """The decayed attained service of a tenant (or one of its programs), now."""
        now = self._clock()
        found = (self._tenants.get(tenant) if program is None
                 else self._programs.get((tenant, program)))
        return 0.0 if found is None else self._decayed(found, now)

    def _charge(self, tenant: str, program: str, tokens: float) -> None:
        now = self._clock()
        for service in (self._tenants.setdefault(tenant, _Service(at=now)),
                        self._program(tenant, program)):
            service.value = max(0.0, self._decayed(service, now) + tokens)
            service.at = now

    def _program(self, tenant: str, program: str) -> _Service:
        key = (tenant, program)
        found = self._programs.get(key)
        if found is None:
            found = self._programs[key] = _Service(at=self._clock())
            while len(self._programs) > self.config.max_programs:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        return found

    def _decayed(self, service: _Service, now: float) -> float:
        return service.value * 0.5 ** (max(0.0, now - service.at) / self.config.half_life_seconds)

    # -- ranking ---------------------------------------------------------------------------

    def _rank(self, queued: _Queued) -> tuple[float, int, bool, float, int, int]:
        arrival = queued.arrival
        weight = self.config.tenant_weights.get(arrival.tenant, 1.0)
        return (self.service(arrival.tenant) / weight,
                -self.config.classes[arrival.klass].priority,
                arrival.phase != "continuation",
                self.service(arrival.tenant, arrival.program),
                PHASES.index(arrival.phase),
                queued.order)

    def _victim(self, state: _Pool, arrival: Arrival) -> _Queued | None:
        """Who leaves a full queue for ``arrival``: the newest of the lowest class waiting,
        when that class ranks below the newcomer's."""
        classes = self.config.classes
        waiting = [q for q in state.queue.values() if not q.dispatched]
        if not waiting:
            return None
        victim = min(waiting, key=lambda q: (classes[q.arrival.klass].priority, -q.order))
        if classes[victim.arrival.klass].priority >= classes[arrival.klass].priority:
            return None
        return victim

    def _evict(self, state: _Pool, victim: _Queued) -> None:
        victim.shed = "evicted"
        del state.queue[victim.ticket]

    def _hopeless(self, arrival: Arrival, workers: Sequence[Worker],
                  klass: PriorityClass) -> bool:
        """A sheddable request whose TTFT target no worker is predicted to meet."""
        if not klass.sheddable or arrival.ttft is None or self._predictor is None:
            return False
        best = None
        for worker in workers:
            predicted = self._predictor.ttft(arrival.pool, Features.of(worker, arrival.tokens))
            if predicted is not None and (best is None or predicted < best):
                best = predicted
        return best is not None and best > arrival.ttft


def _seconds(value: str | None) -> float | None:
    """A header's milliseconds as seconds (None: absent, malformed or not positive)."""
    if not value:
        return None
    try:
        ms = float(value)
    except ValueError:
        return None
    return ms / 1000.0 if 0 < ms < 1e9 else None
