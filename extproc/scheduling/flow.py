"""Flow control: a queue per pool in front of the pick, entered only while the pool is saturated.

Room is judged per worker and per class, from the signals the scorers read. A worker takes a
request of a class while its waiting requests (as last scraped, plus what the router sent it
since, less what finished) stay under the class's ``queue_depth`` (default
``queue_depth_threshold``), and the request's prompt fits in its KV cache below
``kv_threshold`` beside what is in use, what was sent since the scrape and what is reserved
there for higher classes. A turn with a TTFT target leaves its prompt and answer reserved on
its worker for ``reserve_seconds`` after it ends, against lower classes: the session's next
turn finds room where its context is cached. Lower classes wait at the router (a depth of 1),
where they can be passed, not in a worker's own first-come queue.

A request with a home — the worker its context is on: a hard lock's, its session's, or a
sub-agent's parent's — takes room there and is placed there; room elsewhere does not let it in,
since the pick would follow its cache back to the full worker. After ``spill_seconds`` of
waiting (never under a hard lock) it may go to another worker with room whose KV use is under
``spill_kv_threshold``, re-prefilling its context there. A request without a home goes to any
worker with room.

Dispatch ranks the queued requests by, in order: their tenant's attained service over its weight
(fairness across tenants); their class's priority (what the client says matters); within a
class, an open tool loop's continuation first (its KV is warm, and finishing it frees memory);
then their program's attained service (a program is a root session with its sub-agents: least
attained service, so one program's burst of 200 sub-agents does not delay another program's
turn); a later turn before a new session's first prefill; then arrival. The best-ranked request
with room goes first; one without room does not hold back the others. Service is uncached input
tokens plus ``output_weight`` × output tokens, decayed with a ``half_life_seconds`` half-life
(llm-d's program-aware fairness). Class ranks above program because a new session is a new
program, with no service yet: least attained service alone would put every first prefill ahead
of the continuations.

A request never waits past its class's TTL or its own deadline: the hold's timeout is the
earlier of the two. Sheddable classes are refused when they find no room (and whenever no
worker is predicted to meet their TTFT target); a full queue evicts its lowest class first.
Pure: the exchange holds the request (``Hold(kind="queue")``) and wakes the tickets
``dispatch`` returns.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections import Counter, OrderedDict
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
    session: str | None = None
    """Its session's key: what its KV reservation between turns is held under."""
    home: str | None = None
    """The worker its context is on: a hard lock's, its session's, or (a sub-agent's first
    turn) its parent's; None for a new session."""
    pinned: bool = False
    """``home`` is a hard lock's: it never spills elsewhere."""
    waited: float = 0.0
    """Seconds it already waited in the queue (a dispatched request routed again)."""


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
    at: str | None = None
    """Dispatched: the worker whose room it takes (None: any with room)."""


@dataclass(slots=True)
class _Service:
    """Decayed attained service: ``value`` as of ``at``."""

    value: float = 0.0
    at: float = 0.0


@dataclass(slots=True)
class _Reserved:
    """A session's KV between turns, held on its worker against lower classes."""

    worker: str
    tokens: int
    priority: int
    since: float


@dataclass(slots=True)
class _Pool:
    queue: dict[str, _Queued] = field(default_factory=dict)
    dispatched: Counter[str | None] = field(default_factory=Counter)
    """Tickets woken whose requests have not been placed yet, by the worker whose room they
    will take (None: any with room)."""


class _ClassRooms:
    """One dispatch's room per class and worker for a prompt of none (room's upper bound),
    kept in step as places are promised (``take``)."""

    def __init__(self, flow: FlowController, pool: str, workers: Sequence[Worker],
                 taken: Counter[str | None]) -> None:
        self._flow, self._pool, self._workers, self._taken = flow, pool, workers, taken
        self._serving = {w.address for w in workers if w.healthy and w.decodes}
        self._rooms: dict[str, dict[str, int]] = {}

    def possible(self, arrival: Arrival, spills: bool) -> bool:
        """Whether a request of ``arrival``'s class (and home, unless it ``spills``) could
        take a place now."""
        rooms = self._rooms.get(arrival.klass)
        if rooms is None:
            probe = Arrival(self._pool, "", "", arrival.klass, "turn", 0)
            rooms = self._rooms[arrival.klass] = {
                w.address: self._flow.room(w, probe) - self._taken[w.address]
                for w in self._workers if self._flow._places(w) > self._taken[w.address]}
        total = sum(n for n in rooms.values() if n > 0)
        anywhere = self._taken[None]
        if arrival.home in self._serving and not spills:
            here = max(0, rooms.get(arrival.home, 0))
            return here - max(0, anywhere - (total - here)) > 0
        return total > anywhere

    def take(self, at: str | None) -> None:
        self._taken[at] += 1
        if at is not None:
            for rooms in self._rooms.values():
                if at in rooms:
                    rooms[at] -= 1


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
        self._placed: Counter[str] = Counter()
        """address → prompt tokens placed there so far."""
        self._prefill: Counter[str] = Counter()
        """address → uncached prompt tokens placed there with no first token yet."""
        self._prefilling: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """request → (address, its part of ``_prefill``), the oldest first."""
        self._kv_baseline: dict[str, tuple[float | None, int]] = {}
        """address → (scrape time, ``_placed`` then): the KV sent since its scrape."""
        self._reserved: OrderedDict[str, _Reserved] = OrderedDict()
        """session → its reservation, the oldest first."""
        self._reserved_tokens: dict[str, Counter[int]] = {}
        """address → priority → tokens reserved there (the sum of ``_reserved``)."""
        self._order = itertools.count()
        self._deepest = max([config.queue_depth_threshold]
                            + [c.queue_depth for c in config.classes.values()
                               if c.queue_depth is not None])
        """The deepest queue any class lets a worker have."""

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

    # -- room ------------------------------------------------------------------------------

    def room(self, worker: Worker, arrival: Arrival) -> int:
        """Requests of ``arrival``'s class ``worker`` takes now: the places left under the
        class's queue depth, while ``arrival``'s prompt fits in its KV below ``kv_threshold``
        (beside what is in use, was sent since the scrape, and is reserved for higher
        classes); 0 when it does not, or the worker is down or does not decode. An idle
        worker takes a prompt larger than that (as the engine would)."""
        config = self.config
        klass = config.classes[arrival.klass]
        if not worker.healthy or not worker.decodes:
            return 0
        places = (klass.queue_depth or config.queue_depth_threshold) - self._waiting(worker)
        if places <= 0 or (klass.prefill_tokens is not None
                           and self._prefill[worker.address] >= klass.prefill_tokens):
            return 0
        threshold = config.kv_threshold if klass.kv_threshold is None else klass.kv_threshold
        capacity = (worker.num_blocks or 0) * worker.block_size
        if not capacity:
            return places if worker.kv_usage < threshold else 0
        used = worker.kv_usage + self._sent(worker) / capacity
        held = self._held(worker.address, klass.priority)
        if used > 0 and used + (held + arrival.tokens) / capacity > threshold:
            return 0
        return places

    def placeable(self, arrival: Arrival, workers: Sequence[Worker],
                  pinned: str | None) -> frozenset[str] | None:
        """Where a request flow control let in is placed (the pick's subset; None: no limit):
        its home, when it took room there; else the workers with room for it — so the room it
        was admitted against is the room it takes, not a full worker's that its prefix or
        session affinity prefers; and, unless it is its own home, not a worker a
        better-ranked queued request waits for as its home. Never for a request a hard lock
        pins (its issuer serves it, whatever its load), nor when no worker has room."""
        if not self.config.enabled or pinned is not None:
            return None
        state = self._pools.get(arrival.pool)
        if state is None:
            return self._where(arrival, workers, Counter(), set(), arrival.waited) or None
        where = self._where(arrival, workers, Counter(state.dispatched), set(), arrival.waited)
        awaited = self._awaited(state, arrival, where) if where != {arrival.home} else set()
        if not awaited:
            return where or None
        # A home a better-ranked queued request waits for is not this request's room, though
        # it can show up before the dispatch that wakes that request (one worker's scrape
        # lands before the others'). When the room this request was dispatched for looks
        # gone meanwhile (a scrape older than the finish that freed it), it still goes there.
        free = where - awaited or frozenset(
            w.address for w in workers if w.healthy and w.decodes) - awaited
        return free or where or None

    def _awaited(self, state: _Pool, arrival: Arrival,
                 where: frozenset[str]) -> set[str]:
        """The workers of ``where`` that queued requests ranked above ``arrival`` wait for as
        their home (not yet dispatched, not spilling)."""
        now = self._clock()
        waiting = [q for q in state.queue.values() if not q.dispatched and q.arrival.home
                   in where and not self._spills(q.arrival, now - q.since + q.arrival.waited)]
        if not waiting:
            return set()
        rank = self._rank(_Queued("", arrival, now, sys.maxsize), now)[:-1]
        return {home for q in waiting
                if (home := q.arrival.home) is not None and self._rank(q, now)[:-1] < rank}

    def _where(self, arrival: Arrival, workers: Sequence[Worker], taken: Counter[str | None],
               blocked: set[str], waited: float) -> frozenset[str]:
        """The workers ``arrival`` may take room on now (none: it waits), with ``taken`` the
        places already promised to dispatched requests (by worker; None: anywhere) and
        ``blocked`` the workers better-ranked requests wait for."""
        rooms = {w.address: 0 if w.address in blocked or self._places(w) <= taken[w.address]
                 else self.room(w, arrival) - taken[w.address] for w in workers}
        home = self._home(arrival, workers)
        candidates = [w for w in workers if rooms[w.address] > 0]
        if home is not None:
            # Requests dispatched to any worker take the home's room too, when the others'
            # is not enough for them.
            elsewhere = sum(rooms[w.address] for w in candidates if w.address != home)
            if rooms[home] - max(0, taken[None] - elsewhere) > 0:
                return frozenset((home,))
            if not self._spills(arrival, waited):
                return frozenset()
            candidates = [w for w in candidates if self._underused(w, arrival)]
        if sum(rooms[w.address] for w in candidates) <= taken[None]:
            return frozenset()
        return frozenset(w.address for w in candidates)

    def _places(self, worker: Worker) -> int:
        """The most requests of any class ``worker`` could take (room's upper bound: cheap,
        so a saturated pool's long queue is not walked)."""
        if not worker.healthy or not worker.decodes:
            return 0
        return max(0, self._deepest - self._waiting(worker))

    @staticmethod
    def _home(arrival: Arrival, workers: Sequence[Worker]) -> str | None:
        """``arrival``'s home, while it is a healthy worker of the pool that decodes."""
        return next((w.address for w in workers if w.address == arrival.home and w.healthy
                     and w.decodes), None)

    def _spills(self, arrival: Arrival, waited: float) -> bool:
        """Whether a request its home has no room for may go elsewhere: after
        ``spill_seconds``, unless a hard lock pins it or it has a TTFT target (re-prefilling
        its whole context elsewhere takes longer than waiting for room at home)."""
        return (not arrival.pinned and arrival.ttft is None
                and waited >= self.config.spill_seconds)

    def _underused(self, worker: Worker, arrival: Arrival) -> bool:
        """A worker a request that waited for its own may spill to: KV in use (and reserved
        for classes above ``arrival``'s) under ``spill_kv_threshold``."""
        capacity = (worker.num_blocks or 0) * worker.block_size
        held = self._held(worker.address, self.config.classes[arrival.klass].priority)
        used = worker.kv_usage + ((self._sent(worker) + held) / capacity if capacity else 0.0)
        return used < self.config.spill_kv_threshold

    def _waiting(self, worker: Worker) -> int:
        """Waiting requests as scraped, plus those sent since the scrape (less those that
        finished: a finished request let a waiting one run)."""
        base = self._baseline.get(worker.address)
        if base is None or base[0] != worker.scraped_at:
            base = self._baseline[worker.address] = (worker.scraped_at, worker.in_flight)
        return max(0, worker.waiting + worker.in_flight - base[1])

    def _sent(self, worker: Worker) -> int:
        """Prompt tokens placed on ``worker`` since its last scrape (its KV use does not show
        them yet)."""
        address = worker.address
        base = self._kv_baseline.get(address)
        if base is None or base[0] != worker.scraped_at:
            base = self._kv_baseline[address] = (worker.scraped_at, self._placed[address])
        return self._placed[address] - base[1]

    def _held(self, address: str, priority: int) -> int:
        """KV tokens reserved on ``address`` for sessions of classes above ``priority``."""
        self._expire()
        found = self._reserved_tokens.get(address)
        return 0 if found is None else sum(n for p, n in found.items() if p > priority)

    def _expire(self) -> None:
        """Reservations older than ``reserve_seconds`` lapse (and past ``max_programs``)."""
        limit = self._clock() - self.config.reserve_seconds
        reserved = self._reserved
        while reserved and (len(reserved) > self.config.max_programs
                            or next(iter(reserved.values())).since <= limit):
            self._release(next(iter(reserved)))

    def _release(self, session: str) -> None:
        found = self._reserved.pop(session, None)
        if found is not None:
            tokens = self._reserved_tokens[found.worker]
            tokens[found.priority] -= found.tokens
            if tokens[found.priority] <= 0:
                del tokens[found.priority]
            if not tokens:
                del self._reserved_tokens[found.worker]

    # -- the queue -------------------------------------------------------------------------

    def enter(self, arrival: Arrival, workers: Sequence[Worker]) -> Entered:
        """Admit ``arrival`` now, queue it, or shed it. It joins the queue and goes at once
        when dispatch finds it room (so it never passes a better-ranked request that waits
        for the same room)."""
        if not self.config.enabled:
            return Entered()
        now = self._clock()
        state = self._pools.setdefault(arrival.pool, _Pool())
        klass = self.config.classes[arrival.klass]
        if self._hopeless(arrival, workers, klass):
            return Entered(shed="slo")
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
        others = tuple(t for t in woken if t != ticket)
        if ticket in woken:  # its own dispatch: it goes now, charged when placed
            self.claim(ticket, late=False)
            self._charge(arrival.tenant, arrival.program, -arrival.tokens)
            return Entered(woken=others, evicted=evicted)
        left, expiry = klass.ttl_seconds, "ttl"
        if arrival.deadline is not None and arrival.deadline - now < left:
            left, expiry = arrival.deadline - now, "deadline"
        if klass.sheddable or left <= 0:
            self.cancel(ticket)
            return Entered(shed="saturated" if klass.sheddable else "deadline", woken=others,
                           evicted=evicted)
        return Entered(ticket, left, woken=others, evicted=evicted, expiry=expiry)

    def dispatch(self, pool: str, workers: Sequence[Worker]) -> list[str]:
        """Tickets of ``pool`` to wake now: the best-ranked first, each that finds room. A
        request its class's room rules out (queue depth, pending prefill, KV of an empty
        prompt) is passed over; one only its own prompt keeps out (its KV does not fit) keeps
        its home's next room: nobody ranked below it takes room there."""
        state = self._pools.get(pool)
        if state is None or not state.queue:
            return []
        taken = Counter(state.dispatched)
        if sum(max(0, self._places(w) - taken[w.address]) for w in workers) <= taken[None]:
            return []  # saturated: a long queue is not walked
        now = self._clock()
        rooms = _ClassRooms(self, pool, workers, taken)
        line = [(self._rank(q, now), q) for q in state.queue.values()
                if not q.dispatched and rooms.possible(q.arrival, self._spills(
                    q.arrival, now - q.since + q.arrival.waited))]
        heapq.heapify(line)  # popped best first: no full sort
        blocked: set[str] = set()
        woken: list[str] = []
        while line:
            queued = heapq.heappop(line)[1]
            arrival = queued.arrival
            waited = now - queued.since + arrival.waited
            spills = self._spills(arrival, waited)
            if not rooms.possible(arrival, spills):
                continue
            where = self._where(arrival, workers, taken, blocked, waited)
            if not where:
                home = self._home(arrival, workers)
                if home is not None and not spills:
                    blocked.add(home)
                continue
            queued.at = arrival.home if where == {arrival.home} else None
            queued.dispatched = True
            state.dispatched[queued.at] += 1
            rooms.take(queued.at)
            woken.append(queued.ticket)
            self._charge(arrival.tenant, arrival.program, arrival.tokens)
        return woken

    def release(self, pool: str) -> list[str]:
        """Tickets of ``pool`` to wake now, every one, room or not: this process is draining.
        Its queue would only wait for room the other replicas, which keep taking the traffic,
        fill first (they learn of room as their own streams end, this one only by scraping):
        its requests would starve to their TTL. Each goes to its home (a hard lock's or its
        session's), else where the router places it, and waits in the engine's own queue."""
        state = self._pools.get(pool)
        if state is None:
            return []
        woken = []
        for queued in state.queue.values():
            if queued.dispatched or queued.shed is not None:
                continue
            queued.dispatched = True
            queued.at = queued.arrival.home
            state.dispatched[queued.at] += 1
            woken.append(queued.ticket)
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
        state.dispatched[queued.at] -= 1
        return "go"

    def cancel(self, ticket: str) -> None:
        """The request went away (its client hung up): its place, dispatched or not, is freed."""
        queued = self._tickets.pop(ticket, None)
        if queued is None:
            return
        state = self._pools[queued.arrival.pool]
        state.queue.pop(ticket, None)
        if queued.dispatched and queued.shed is None:
            state.dispatched[queued.at] -= 1

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

    def started(self, arrival: Arrival, worker: str | None, uncached_tokens: int,
                dispatched: bool, request: str | None = None) -> None:
        """``request`` was placed on ``worker``: charge what it costs, its uncached prompt (a
        dispatched one was charged its whole prompt at dispatch, and gets the difference
        back); its prompt counts in the worker's KV until the next scrape shows it, its
        uncached part in the worker's prefill until its first token; its session's
        reservation is taken up."""
        if not self.config.enabled:
            return
        charge = uncached_tokens - (arrival.tokens if dispatched else 0)
        self._charge(arrival.tenant, arrival.program, charge)
        if worker is not None:
            self._placed[worker] += arrival.tokens
            if request is not None and uncached_tokens > 0:
                self._prefill[worker] += uncached_tokens
                self._prefilling[request] = (worker, uncached_tokens)
                while len(self._prefilling) > self.config.max_programs:
                    self.first_token(next(iter(self._prefilling)))
        if arrival.session is not None:
            self._release(arrival.session)

    def first_token(self, request: str) -> None:
        """``request``'s first token came (or its answer ended without one): its prefill is
        done."""
        found = self._prefilling.pop(request, None)
        if found is not None:
            worker, tokens = found
            self._prefill[worker] -= tokens
            if self._prefill[worker] <= 0:
                del self._prefill[worker]

    def finished(self, arrival: Arrival, worker: str | None, prompt_tokens: int,
                 output_tokens: int, request: str | None = None) -> None:
        """``request``'s answer ended on ``worker``: its output is charged; a turn with a
        TTFT target leaves its prompt and answer reserved there for its session's next
        turn."""
        if not self.config.enabled:
            return
        if request is not None:
            self.first_token(request)
        if output_tokens > 0:
            self._charge(arrival.tenant, arrival.program,
                         self.config.output_weight * output_tokens)
        if (arrival.session is None or arrival.ttft is None or worker is None
                or self.config.reserve_seconds <= 0):
            return
        self._release(arrival.session)
        priority = self.config.classes[arrival.klass].priority
        tokens = prompt_tokens + output_tokens
        self._reserved[arrival.session] = _Reserved(worker, tokens, priority, self._clock())
        self._reserved_tokens.setdefault(worker, Counter())[priority] += tokens
        self._expire()

    def service(self, tenant: str, program: str | None = None,
                now: float | None = None) -> float:
        """The decayed attained service of a tenant (or one of its programs) at ``now``
        (default: the clock's now)."""
        found = (self._tenants.get(tenant) if program is None
                 else self._programs.get((tenant, program)))
        return 0.0 if found is None else self._decayed(
            found, self._clock() if now is None else now)

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

    def _rank(self, queued: _Queued, now: float) -> tuple[float, int, bool, float, int, int]:
        """Its place in line at ``now`` (one instant for the whole queue: a live clock read
        per request would decay the same tenant's service between two of its requests, and
        that difference would outrank class and phase)."""
        arrival = queued.arrival
        weight = self.config.tenant_weights.get(arrival.tenant, 1.0)
        return (self.service(arrival.tenant, now=now) / weight,
                -self.config.classes[arrival.klass].priority,
                arrival.phase != "continuation",
                self.service(arrival.tenant, arrival.program, now),
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
