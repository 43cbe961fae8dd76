"""The routing policy: request in, facts to load out; facts in, route and writes out. No I/O.

Per request the exchange (``core.exchange``) makes these calls and has the I/O done between
them:

1. ``read`` parses the body once, reads the session identity and says which facts to load
   (the session's record, the owners of the ids the request carries, the chain to follow
   when it names no session: the newest id of its history, see ``RequestSummary.trail``);
2. ``route`` decides from those facts — SAAR picks the model, scheduling the worker — and
   returns the ``Routed`` answer with the ``Turn`` it will commit;
3. as the answer passes, ``answered`` (the upstream's status: a 2xx commits the turn),
   ``finished`` (what the answer carried: ids to claim, usage) and ``ended`` (the stream
   closed: bookkeeping, a session's end) return the writes for the store.

Everything here is synchronous, reads time from the injected clock and is handed its parts
(``extproc.assembly`` builds them): the live service, the evaluation matrix, the simulators and
the tests drive the very same object (``LocalDriver`` without Envoy, gRPC or a store server).
What it decided goes to the injected ``Journal`` as typed facts; observability makes records.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ..apis import (
    CHARS_PER_TOKEN,
    Preambles,
    answer_mark,
    model_spans,
    parse_request,
    peek_model,
    rewrite_model,
    strip_preambles,
    task_mark,
)
from ..config import Config
from ..errors import LockedModelDown, RequestShed, RoutingError, SessionPaused
from ..observability import logs
from ..observability.metrics import Metrics
from ..scheduling.flow import Arrival, Entered
from ..scheduling.latency import Features
from ..scheduling.placement import Placement, Pools, Prompt
from ..state.memory import MemoryStore
from ..state.records import Claim, Commit, Finish, Forget, Owner, SessionRecord, Turn, Write
from ..state.records import owner_key as scoped
from ..state.store import Facts, Query
from ..state.table import SessionTable
from ..types import (
    Action,
    Api,
    Clock,
    RequestSummary,
    ResponseSummary,
    SessionIdentity,
    Usage,
)
from . import side
from .health import ModelHealth
from .identity import IdentityReader, chained, opened, parented
from .journal import Decided, Held, Journal, Outcome, Timings
from .paths import api_for as api_for  # re-exported: which requests are API calls
from .saar import RoutingDecision, SaarEngine, issuer
from .side import Standing

UNCLAIMED_SECONDS = 2.0
"""How long after its routing stream ended a streamed answer may still have ids to claim here."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request as ``read`` understood it: what ``route`` needs once the facts are in."""

    summary: RequestSummary
    identity: SessionIdentity
    headers: Mapping[str, str]
    query: Query
    started: float
    """``time.perf_counter()`` when reading began (the decision latency metric)."""
    parsed: float = 0.0
    identified: float = 0.0
    """``time.perf_counter()`` when the body was parsed and when the identity was read."""
    spans: list[tuple[int, int]] | None = None
    """Where the body's top-level model values are (found once, spliced by the rewrite)."""
    prompt: Prompt | None = None
    """The prompt, rendered (and tokenised in precise mode) where the body was parsed."""


class Diagnostics(NamedTuple):
    """What a response tells its client about the decision (the adapter names the headers)."""

    replay_id: str
    model: str
    decision: str
    phase: str
    action: str
    confidence: str
    context_tokens: str


@dataclass(frozen=True, slots=True)
class Routed:
    replay_id: str
    model: str
    cluster: str
    body: bytes | None
    """The rewritten body, or None when the body goes upstream as the client sent it."""
    diagnostics: Diagnostics
    turn: Turn
    placement: Placement = field(default_factory=lambda: Placement(()))
    stream: bool = False
    """The client asked for a streamed (SSE) answer."""
    api: Api = Api.CHAT
    locked: bool = False
    """A hard lock kept the session on its model (and its issuer's worker)."""
    reads_answer: bool = True
    """The answer may carry ids the router must own (tool calls, a response id, provider
    state): a JSON answer's commit waits for its body, written with their claims (every JSON
    answer's body is read, for its usage and finish reason)."""
    fresh: bool = False
    """The session had no record: if this turn is never answered, nothing of it is kept."""
    arrival: Arrival | None = None
    """What flow control knew of the request (None: flow control off, or Envoy balances)."""
    wake: tuple[str, ...] = ()
    """Flow control's tickets to wake now (dispatched, or evicted, by this request's entry)."""

    @property
    def workers(self) -> tuple[str, ...]:
        """The picked worker first, then fallbacks; empty when Envoy's balancer decides."""
        return self.placement.workers


@dataclass(frozen=True, slots=True)
class Issuer:
    """Where a request about a stored response goes (``core.paths``): the model whose answer
    issued the response, its cluster, and the worker that answered (None: a pool Envoy
    balances). A provider-bound id goes to its issuer, as a hard lock sends a turn."""

    model: str
    cluster: str
    worker: str | None


@dataclass(slots=True)
class _Picked:
    pool: str
    features: Features
    at: float
    """Clock time of the pick (the TTFT runs from it)."""
    first: float | None = None
    """Clock time of the first token."""


class Queued(Exception):
    """The request's pool is saturated: it waits in flow control's queue as ``entered.ticket``
    (not an error: a hold, woken when dispatched)."""

    def __init__(self, entered: Entered, arrival: Arrival, decision: RoutingDecision) -> None:
        super().__init__(entered.ticket)
        self.entered = entered
        self.arrival = arrival
        self.decision = decision


PICKED_BOUND = 10_000
"""Requests whose pick's features wait for their first token (the oldest dropped past it)."""


class Router:
    def __init__(
        self,
        config: Config,
        *,
        identity: IdentityReader,
        health: ModelHealth,
        engine: SaarEngine,
        pools: Pools,
        journal: Journal,
        metrics: Metrics,
        clock: Clock,
        new_id: Callable[[], str],
        table: SessionTable,
        preambles: Preambles | None = None,
    ) -> None:
        """The parts come from ``extproc.assembly``; ``new_id`` names each decision; ``table``
        holds this process's live sessions (a routed session is active there); ``preambles``
        the volatile preambles prefix matching ignores (and the engine's body loses where
        ``strips_preambles``)."""
        self.config = config
        self.identity = identity
        self.health = health
        self.engine = engine
        self.pools = pools
        self.journal = journal
        self.metrics = metrics
        self.clock = clock
        self._new_id = new_id
        self._rewrite = config.routing.rewrite_model
        self._table = table
        self._preambles = preambles or Preambles(())
        self._streaming = 0
        self._stream_ended = -math.inf
        """Streamed answers that may issue ids, running here, and when the last one ended."""
        self._picked: dict[str, _Picked] = {}
        """replay id → the pick's features, for the latency predictor (flow control on)."""

    # -- the request path ------------------------------------------------------------------

    def read(self, api: Api, headers: Mapping[str, str], raw: bytes) -> Request:
        """Parse once and say which facts to load. Raises ``RoutingError`` (counted). A model
        nobody serves is refused before the parse: no one can make the router parse 8 MiB
        bodies only to answer 404. Pure: it may run on the parse thread."""
        started = time.perf_counter()
        try:
            spans = model_spans(raw, thorough=False)
            named = peek_model(raw, spans)
            if named is not None:
                self.engine.check_model(named)
            summary = parse_request(api, raw, max_body_bytes=self.config.limits.max_body_bytes)
        except RoutingError as exc:
            self.metrics.errors.labels(exc.code).inc()
            raise
        prompt = Prompt(summary, preambles=self._preambles, limit=self.pools.render_limit)
        self.pools.prepare(prompt)
        if prompt.counted and prompt.tokens is not None:  # the model's count, not an estimate
            summary = prompt.request = replace(summary, context_tokens=len(prompt.tokens),
                                               context_counted=True)
        parsed = time.perf_counter()
        identity = self.identity.read(headers, summary)
        tenant = identity.tenant
        ids = tuple(scoped(tenant, i) for i in summary.continued)
        chain = None
        trail = summary.trail if identity.session_id is None else None
        if trail is not None:
            chain = scoped(tenant, trail)
            if chain not in ids:
                ids = (*ids, chain)
        if identity.opens:  # a sub-agent's task, if another session's tool call gave it
            ids = (*ids, *(scoped(tenant, mark) for mark in summary.task_marks))
        query = Query(identity.key, ids, chain)
        return Request(summary, identity, headers, query, started, parsed, time.perf_counter(),
                       spans, prompt)

    def prefetch(self, headers: Mapping[str, str]) -> Query | None:
        """What to load before the body arrives: the session the headers name (the body can
        only name one when they name none), None when they name none."""
        key = self.identity.read(headers).key
        return None if key is None else Query(key)

    def locate(self, headers: Mapping[str, str], response_id: str) -> Query:
        """What to load to find who issued ``response_id``, the stored response a path names
        (``GET /v1/responses/{id}``…): its owner in the caller's tenant."""
        return Query(None, (scoped(self.identity.tenant(headers), response_id),))

    def located(self, query: Query, facts: Facts) -> Issuer | None:
        """The issuer of the stored response ``locate`` asked for; None when no answer this
        router read issued it (or its model is no longer configured): it passes through."""
        owner = facts.owners.get(query.ids[0]) if query.ids else None
        model = self.config.models.get(owner.model) if owner is not None else None
        if owner is None or model is None:
            return None
        return Issuer(owner.model, model.cluster, owner.worker)

    @staticmethod
    def covers(request: Request, facts: Facts) -> bool:
        """Whether facts loaded from the headers alone serve ``request``: the same session,
        and every id it carries issued by that session's last answer (the record says who
        issued those), so no owner needs looking up."""
        query = request.query
        if query.session is None or facts.session_key != query.session:
            return False
        if not query.ids:
            return True
        issued = set(facts.session.issued) if facts.session is not None else set()
        cut = len(request.identity.tenant) + 1
        return all(key[cut:] in issued for key in query.ids)

    def unsettled(self, request: Request, facts: Facts) -> bool:
        """Whether the newest id the request continues (its pending tool results, else its
        ``previous_response_id``, else its newest provider state) has no known issuer: the
        write of the answer that issued it may still be on its way (another replica's, or a
        streamed answer's claim not yet handled). Only then is waiting worth it — and not
        again for ids a settle hold of this session already waited for in vain."""
        newest = request.summary.newest
        if not newest:
            return False
        issued = facts.session.issued if facts.session is not None else ()
        tenant = request.identity.tenant
        entry = self._table.get(_destination(request, facts))
        orphans = entry.orphans if entry is not None and entry.orphans else ()
        return any(scoped(tenant, i) not in facts.owners and i not in issued
                   and i not in orphans for i in newest)

    def orphaned(self, request: Request, facts: Facts) -> None:
        """A settle hold's bound passed with the request's newest ids still unissued."""
        key = _destination(request, facts)
        if key is not None:
            self._table.touch(key).orphans = frozenset(request.summary.newest)

    def unclaimed(self, session_key: str) -> bool:
        """Whether a streamed answer of this session may still carry ids this process has not
        claimed: its stream is running, or ended less than ``UNCLAIMED_SECONDS`` ago (the
        observe stream's last chunks may be handled after the routing stream's end)."""
        entry = self._table.get(session_key)
        answers = None if entry is None else entry.unclaimed
        if entry is None or not answers:
            return False
        horizon = self.clock() - UNCLAIMED_SECONDS
        for replay_id in [r for r, ended in answers.items() if ended < horizon]:
            del answers[replay_id]
        if not answers:
            entry.unclaimed = None
        return bool(answers)

    def claims_pending(self) -> bool:
        """Whether some streamed answer here may still carry ids not claimed yet (one runs,
        or one ended less than ``UNCLAIMED_SECONDS`` ago): a request that follows a chain of
        ids to a session it cannot name may be racing that claim."""
        return self._streaming > 0 or self.clock() - self._stream_ended < UNCLAIMED_SECONDS

    def route(
        self,
        request: Request,
        facts: Facts,
        *,
        subset: frozenset[str] | None = None,
        admit_paused: bool = False,
        admitted: bool = False,
        holds: Sequence[Held] = (),
    ) -> Routed:
        """Decide where the request goes: model, then worker. Raises ``RoutingError`` (already
        counted); ``SessionPaused`` unless ``admit_paused`` (a hold that timed out); ``Queued``
        while its pool is saturated, unless ``admitted`` (flow control dispatched it).
        ``holds``: where the request waited before this call (recorded, and not counted as
        loading)."""
        began = time.perf_counter()
        summary = request.summary
        replay_id = self._new_id()
        identity = opened(chained(request.identity, facts.session_key), replay_id)
        state = facts.session if identity.key == facts.session_key else None
        identity = parented(identity, state.parent if state is not None else None,
                            _spawner(request, facts))
        logs.tag(replay_id, identity.session_id)  # this stream's log lines name both
        side_tokens = self.config.routing.side_request_max_tokens
        standing = side.standing(summary, state, side_tokens)
        # A side request, and the main loop's first after only light ones, are decided and
        # placed as first requests; a side request is no turn of its session (``key``).
        seen = state if standing in (Standing.MAIN, Standing.PROVISIONAL) else None
        key = None if standing is Standing.SIDE else identity.key
        try:
            if not admit_paused and self.pools.admission.is_paused(identity.key):
                assert identity.key is not None
                tick = self.config.scheduling.admission.tick_seconds
                raise SessionPaused(identity.key, retry_after=max(1, round(tick)))
            prompt = request.prompt or Prompt(summary, preambles=self._preambles,
                                              limit=self.pools.render_limit)
            prompt.session = key  # the chain may have named it only now
            owners = _owners(facts, state, identity)
            cached: dict[str, int | None] = {}

            def cached_tokens(model: str) -> int | None:
                if model not in cached:
                    cached[model] = self.pools.cached_tokens(prompt, model)
                return cached[model]

            decision = self.engine.decide(
                summary, identity, request.headers, seen, owners, cached_tokens
            )
            if standing is Standing.SIDE:
                decision = replace(decision, reason="side_request")
            decided = time.perf_counter()
            bound = seen.worker if seen is not None and seen.model == decision.model else None
            pinned = decision.pinned_worker
            if pinned is None and decision.lock is None:
                # A physical model name skips SAAR's locks, not the worker they pin to (an
                # endpoint picker behind the model router sees physical names only).
                owner = issuer(owners, summary.continued, None)
                if owner is not None and owner.model == decision.model:
                    pinned = owner.worker
            arrival = self._arrival(request, identity, seen, decision.model, replay_id,
                                    pinned or bound, pinned is not None, holds)
            wake = () if arrival is None or admitted else self._enter(arrival, decision)
            if arrival is not None:
                room = self.pools.flow.placeable(arrival, self.pools.scored(arrival.pool),
                                                 pinned)
                if room is not None:
                    subset = room if subset is None else (subset & room) or subset
            placement = self.pools.place(
                prompt, decision.model, key, subset, bound=bound, pinned=pinned,
                identity=identity, ttft=arrival.ttft if arrival is not None else None,
                tpot=arrival.tpot if arrival is not None else None, request_id=replay_id,
            )
            body = None
            if decision.model != summary.model and self._rewrite:
                spans = request.spans
                if peek_model(summary.raw, spans) != summary.model:  # an escaped duplicate
                    spans = model_spans(summary.raw)
                body = rewrite_model(summary.raw, decision.model, spans)
            if self._preambles and self.config.strips_preambles(decision.model):
                # Cut what changes per session from the system prompt the engine caches.
                body = strip_preambles(summary.api, body or summary.raw, self._preambles) or body
        except RoutingError as exc:
            self.metrics.errors.labels(exc.code).inc()
            raise
        placed = time.perf_counter()
        held = sum(max(0.0, min(h.until, began) - max(h.since, request.identified))
                   for h in holds)
        timings = Timings(
            request.parsed - request.started, request.identified - request.parsed,
            began - request.identified - held, decided - began, placed - decided,
            placement.result.durations if placement.result is not None else {},
            sum(h.until - h.since for h in holds),
        )
        now = self.clock()
        turn = Turn(
            replay_id, key, identity.tenant, decision.model, decision.decision,
            decision.phase, decision.action is Action.SWITCH, summary.context_tokens, now,
            placement.worker, identity.final, identity.parent_session_id,
            None if side.light(summary, side_tokens) else summary.model,
            standing is Standing.FIRST,
        )
        self.journal.decided(Decided(
            replay_id, now, summary, identity, decision, placement, state, timings,
            request.headers.get("traceparent"), cached, tuple(holds)))
        if key is not None:
            entry = self._table.touch(key)
            if summary.stream and summary.may_issue:
                if entry.unclaimed is None:
                    entry.unclaimed = {}
                entry.unclaimed[replay_id] = math.inf
        if summary.stream and summary.may_issue:
            self._streaming += 1
        self.pools.started(placement, key, summary.context_tokens)
        if arrival is not None:
            self._started(arrival, placement, replay_id, now, holds, admitted)
        if placement.worker is not None:
            self.metrics.worker_picks.labels(decision.model, placement.worker).inc()
        self._count(summary.api, decision)
        self.metrics.decision_seconds.observe(time.perf_counter() - request.started)
        return Routed(
            replay_id,
            decision.model,
            self.config.models[decision.model].cluster,
            body,
            diagnostics(replay_id, decision, summary),
            turn,
            placement,
            summary.stream,
            summary.api,
            decision.action is Action.LOCKED_KEEP,
            summary.may_issue,
            key is not None and state is None,
            arrival,
            wake,
        )

    # -- flow control ----------------------------------------------------------------------

    def _arrival(self, request: Request, identity: SessionIdentity,
                 state: SessionRecord | None, model: str, replay_id: str, home: str | None,
                 pinned: bool, holds: Sequence[Held]) -> Arrival | None:
        """The request as flow control sees it; None when flow control is off or Envoy
        balances this model (a pool of one: nothing here counts its load). ``home``: the
        worker its session is bound (or a hard lock ``pinned``) to; a sub-agent's first turn
        has its parent's."""
        flow = self.pools.flow
        if not flow.enabled or not self.pools.scored(model):
            return None
        headers, summary = request.headers, request.summary
        klass = flow.klass(headers)
        wait, ttft = flow.targets(headers, klass)
        root = identity.key
        if identity.parent_session_id is not None:
            root = SessionIdentity(identity.tenant, identity.parent_session_id).key
            if home is None and state is None:
                home = self.pools.scheduler.placed_worker(root)
        program = root or replay_id
        phase = ("continuation" if summary.pending_tool_results
                 else "first" if state is None else "turn")
        deadline = None if wait is None else self.clock() + wait
        waited = sum(h.until - h.since for h in holds if h.kind == "queue")
        return Arrival(model, identity.tenant, program, klass, phase, summary.context_tokens,
                       deadline, ttft, flow.tpot(headers, klass), identity.key, home, pinned,
                       waited)

    def _enter(self, arrival: Arrival, decision: RoutingDecision) -> tuple[str, ...]:
        """Admit the request now (the tickets its entry dispatched or evicted, to wake), or
        raise ``Queued`` or ``RequestShed``."""
        entered = self.pools.flow.enter(arrival, self.pools.scored(arrival.pool))
        if entered.shed is not None:  # route counts it as an error, as every error it raises
            error = self._dropped(arrival, decision, entered.shed)
            error.wake = (*entered.woken, *entered.evicted)
            raise error
        if entered.ticket is not None:
            raise Queued(entered, arrival, decision)
        return (*entered.woken, *entered.evicted)

    def shed(self, arrival: Arrival, decision: RoutingDecision, reason: str) -> RequestShed:
        """The refusal of a queued request flow control drops for ``reason`` (counted)."""
        error = self._dropped(arrival, decision, reason)
        self.metrics.errors.labels(error.code).inc()
        return error

    def _dropped(self, arrival: Arrival, decision: RoutingDecision,
                 reason: str) -> RequestShed:
        """The refusal of a request flow control drops for ``reason`` (its shed counted)."""
        self.metrics.flow_shed.labels(arrival.pool, arrival.klass, reason).inc()
        messages = {
            "saturated": f"every worker of {arrival.pool} is saturated and this request's "
                         f"class ({arrival.klass}) is sheddable; retry shortly",
            "queue_full": f"the queue of {arrival.pool} is full; retry shortly",
            "evicted": "a request of a higher class took this one's place in the queue of "
                       f"{arrival.pool}; retry shortly",
            "ttl": f"this request waited the longest its class ({arrival.klass}) waits for "
                   f"{arrival.pool}; retry shortly",
            "deadline": "the request's deadline passed while it waited for "
                        f"{arrival.pool}; retry with a longer deadline",
            "slo": f"no worker of {arrival.pool} is predicted to meet this request's "
                   "time-to-first-token target; retry shortly",
        }
        return RequestShed(messages[reason], reason=reason, klass=arrival.klass,
                           model=arrival.pool, decision=decision)

    def queued(self, ticket: str, *, late: bool) -> str:
        """A queued request woke: ``go``, ``wait``, or why it is shed (``FlowController``)."""
        return self.pools.flow.claim(ticket, late=late)

    def cancel(self, ticket: str, pool: str) -> list[str]:
        """A queued request went away: its place goes to the next (the tickets to wake)."""
        self.pools.flow.cancel(ticket)
        return self.dispatch(pool)

    def dispatch(self, pool: str) -> list[str]:
        """Tickets of ``pool`` flow control lets go now (the pool has room again)."""
        return self.pools.dispatch(pool)

    def _started(self, arrival: Arrival, placement: Placement, replay_id: str, now: float,
                 holds: Sequence[Held], admitted: bool) -> None:
        features = placement.features
        uncached = arrival.tokens if features is None else int(features.uncached_tokens)
        self.pools.flow.started(arrival, placement.worker, uncached, dispatched=admitted,
                                request=replay_id)
        waited = [h for h in holds if h.kind == "queue"]
        if waited:
            self.metrics.flow_wait_seconds.labels(arrival.pool, arrival.klass).observe(
                sum(h.until - h.since for h in waited))
        if features is not None and self.pools.predictor is not None:
            picked = self._picked
            picked[replay_id] = _Picked(arrival.pool, features, now)
            while len(picked) > PICKED_BOUND:
                del picked[next(iter(picked))]

    def first_token(self, turn: Turn) -> None:
        """A streamed answer's first token passed: its prefill is done, the journal records
        its TTFT, the predictor learns it."""
        now = self.clock()
        self.journal.completed(turn.replay_id, Outcome(
            first_chunk_ms=round((now - turn.started) * 1000, 3)))
        self.pools.flow.first_token(turn.replay_id)
        self.pools.first_token(turn.replay_id)
        picked, predictor = self._picked.get(turn.replay_id), self.pools.predictor
        if picked is None or predictor is None or picked.first is not None:
            return
        picked.first = now
        error = predictor.observed_ttft(picked.pool, picked.features, now - picked.at)
        if error is not None:
            self.metrics.prediction_error.labels("ttft").observe(error)

    def _learn_itl(self, turn: Turn, completion_tokens: int) -> None:
        picked, predictor = self._picked.pop(turn.replay_id, None), self.pools.predictor
        if picked is None or predictor is None or picked.first is None or completion_tokens < 2:
            return
        itl = (self.clock() - picked.first) / (completion_tokens - 1)
        error = predictor.observed_itl(picked.pool, picked.features, itl)
        if error is not None:
            self.metrics.prediction_error.labels("itl").observe(error)

    def refused(self, request: Request, facts: Facts, error: LockedModelDown | RequestShed,
                holds: Sequence[Held] = ()) -> None:
        """A decision that ends in a refusal still gets a record: the lock held, its model is
        out; flow control shed it. Sets ``error.replay_id``, so ``x-replay-id`` on the error
        explains it."""
        identity = chained(request.identity, facts.session_key)
        state = facts.session if identity.key == facts.session_key else None
        replay_id = self._new_id()
        logs.tag(replay_id, identity.session_id)
        self.journal.decided(Decided(
            replay_id, self.clock(), request.summary, identity, error.decision, Placement(()),
            state, None, request.headers.get("traceparent"), holds=tuple(holds)))
        self.journal.completed(replay_id, Outcome(
            status=error.status, refused=error.code, retry_after=error.retry_after))
        error.replay_id = replay_id

    # -- the answer path -------------------------------------------------------------------

    def answered(self, routed: Routed, status: int, served: str | None = None) -> list[Commit]:
        """The upstream answered (``served``: the worker Envoy really used, when known): a 2xx
        commits the turn, anything else does not (a failed request never counts as a switch).
        """
        turn = routed.turn
        self.health.record(turn.model, status)
        self.metrics.responses.labels(turn.model, f"{status // 100}xx").inc()
        self.journal.completed(turn.replay_id, Outcome(status=status, served=served))
        self.pools.prefilled(routed.placement)
        if not 200 <= status < 300:
            self._claimed(turn)  # a failed answer issues nothing
            return []
        if served and served != turn.worker:
            self.pools.served(routed.placement, served)
            turn = replace(turn, worker=served)
        return [Commit(turn)]

    def finished(
        self, turn: Turn, response: ResponseSummary, claimed: Iterable[str] = ()
    ) -> list[Write]:
        """A successful answer ended: the turn is committed (if the answer got here before
        the status did), the ids it issued and not yet ``claimed`` are claimed, its usage
        kept."""
        self._claimed(turn)
        ids = issued(response)
        writes: list[Write] = [
            Finish(turn, bool(response.tool_call_ids), response.usage, tuple(ids))
        ]
        done = set(claimed)
        claim = self.claim(turn, [i for i in ids if i not in done])
        if claim is not None:
            writes.append(claim)
        return writes

    def observed(self, turn: Turn, response: ResponseSummary) -> None:
        """What an answer carried, told to the journal by the stream that read it, as soon as
        it read the answer's end (its usage estimated if it reported none); the worker's
        predicted rates learn from its timings and usage."""
        self.journal.completed(turn.replay_id, Outcome(response=reported(turn, response)))
        self.pools.answered(turn.replay_id, response.usage)

    @staticmethod
    def claim(turn: Turn, ids: Iterable[str]) -> Claim | None:
        """``ids`` issued by ``turn``: its model and worker own them, in its tenant."""
        keys = tuple(scoped(turn.tenant, i) for i in ids)
        return Claim(keys, Owner(turn.model, turn.worker, turn.session_key)) if keys else None

    def ended(
        self, routed: Routed, response: ResponseSummary | None, *, aborted: bool = False,
        told: bool = False,
    ) -> list[Write]:
        """The request's stream closed (answered, failed or abandoned): the worker has one
        fewer in flight, admission sees a tool boundary, the journal gets the outcome (what
        the answer carried unless ``observed`` already ``told`` it) and a session's final
        request forgets it."""
        turn = routed.turn
        usage = response.usage if response is not None else None
        completion = usage.completion_tokens if usage else 0
        self.pools.finished(
            routed.placement, turn.session_key,
            usage.prompt_tokens if usage else turn.context_tokens, completion,
            answered=not aborted, request_id=turn.replay_id)
        arrival = routed.arrival
        if arrival is not None:
            self.pools.flow.finished(
                arrival, turn.worker, usage.prompt_tokens if usage else turn.context_tokens,
                completion, request=turn.replay_id)
            self._learn_itl(turn, completion)
        now = self.clock()
        if routed.stream and routed.reads_answer:
            self._streaming -= 1
            if not aborted:  # an answer never begun has nothing to claim
                self._stream_ended = now
        entry = self._table.get(turn.session_key)
        answers = None if entry is None else entry.unclaimed
        if answers is not None and turn.replay_id in answers:
            if aborted:
                self._claimed(turn)  # nothing was answered: nothing to claim
            else:
                answers[turn.replay_id] = now
        latency = round((now - turn.started) * 1000, 3)
        self.journal.completed(turn.replay_id, Outcome(
            response=None if told or response is None else reported(turn, response),
            aborted=aborted, latency_ms=latency))
        key = turn.session_key
        if key is not None and (turn.final or (aborted and routed.fresh)):
            # The session ended (its final request), or it never was (its first request went
            # unanswered: the client hung up): nothing of it stays in this process.
            self._table.forget(key)
            return [Forget(key)] if turn.final else []
        return []

    # -- internals -------------------------------------------------------------------------

    def _claimed(self, turn: Turn) -> None:
        """Nothing of ``turn``'s answer is left to claim here."""
        entry = self._table.get(turn.session_key)
        if entry is not None and entry.unclaimed is not None:
            entry.unclaimed.pop(turn.replay_id, None)
            if not entry.unclaimed:
                entry.unclaimed = None

    def _count(self, api: Api, decision: RoutingDecision) -> None:
        self.metrics.requests.labels(api.value, decision.decision).inc()
        self.metrics.decisions.labels(decision.action.value, decision.reason).inc()
        if decision.lock:
            self.metrics.locks.labels(decision.lock).inc()
        if decision.reset:
            self.metrics.resets.labels(decision.reset).inc()


class LocalDriver:
    """The exchange's calls, synchronously, over an in-process store: what the evaluation
    matrix, the simulators and the tests run the router with."""

    def __init__(self, router: Router, store: MemoryStore | None = None) -> None:
        self.router = router
        self.store = store or MemoryStore.from_config(router.config, router.clock)

    def route(
        self, api: Api, headers: Mapping[str, str], raw: bytes, **options: object
    ) -> Routed:
        request = self.router.read(api, headers, raw)
        return self.router.route(request, self.store.load_now(request.query),
                                 **options)  # type: ignore[arg-type]

    def respond(
        self, routed: Routed, response: ResponseSummary, served: str | None = None
    ) -> None:
        """The answer arrives whole: its status, then its body, then the stream ends."""
        router, now = self.router, self.router.clock()
        writes: list[Write] = [*router.answered(routed, response.status, served)]
        if writes:
            writes += router.finished(routed.turn, response)
        self.store.apply_now(writes, now)
        self.store.apply_now(router.ended(routed, response), now)

    def session(self, key: str) -> SessionRecord | None:
        return self.store.record(key)


def reported(turn: Turn, response: ResponseSummary) -> ResponseSummary:
    """``response`` with the usage the journal records: the engine's when it reported any;
    else, for an answer that generated something, the router's estimate, marked as such —
    the prompt as the router counted it, the output from the characters generated (the
    prompt's ratio), cached tokens unknown. A Chat stream carries usage only when its client
    asked (``stream_options.include_usage``): asking the engine behind the client's back
    would add a chunk to the client's stream, which only a processor holding every chunk
    could take out again."""
    if response.usage is not None or not (response.output_chars or response.finish_reason):
        return response
    output = -(-response.output_chars // CHARS_PER_TOKEN)
    return replace(response, usage=Usage(turn.context_tokens, output, estimated=True))


def issued(response: ResponseSummary) -> list[str]:
    """The ids an answer made its model own: tool calls, provider state, the response, the
    mark of its text and of its tool calls' task texts."""
    ids = list(binding(response))
    if mark := answer_mark(response.text):
        ids.append(mark)
    tasks = (task_mark(a) for a in response.arguments.values() if a is not None)
    ids += dict.fromkeys(mark for mark in tasks if mark is not None)
    return ids


def binding(response: ResponseSummary) -> tuple[str, ...]:
    """The ids an answer issued that bind the request continuing them to its issuer (tool
    calls, provider state, the response): unlike its marks, which only suggest a session."""
    response_id = (response.response_id,) if response.response_id else ()
    return (*response.tool_call_ids, *response.provider_state, *response_id)


def _spawner(request: Request, facts: Facts) -> str | None:
    """The session whose answer issued a tool call carrying the task this first request
    opens with (its first owned task mark), if any."""
    tenant = request.identity.tenant
    for mark in request.summary.task_marks:
        owner = facts.owners.get(scoped(tenant, mark))
        if owner is not None and owner.session is not None:
            return owner.session
    return None


def _owners(
    facts: Facts, state: SessionRecord | None, identity: SessionIdentity
) -> dict[str, Owner]:
    """Who issued the ids, keyed by the bare id as the engine looks them up: what the session
    record says of its last answer's ids, then what the store's owner keys say."""
    owners: dict[str, Owner] = {}
    if state is not None and state.issued:
        issuer_of_last = Owner(state.model, state.issued_worker, identity.key)
        owners = dict.fromkeys(state.issued, issuer_of_last)
    cut = len(identity.tenant) + 1
    owners.update((key[cut:], owner) for key, owner in facts.owners.items())
    return owners


def diagnostics(
    replay_id: str, decision: RoutingDecision, request: RequestSummary
) -> Diagnostics:
    return Diagnostics(replay_id, decision.model, decision.decision, decision.phase.value,
                       decision.action.value, f"{decision.confidence:.3f}",
                       str(request.context_tokens))


def _destination(request: Request, facts: Facts) -> str | None:
    """The session ``route`` will give the request: the one it names, else the one its chain
    leads to, else its fallback (a chain that leads nowhere known)."""
    return chained(request.identity, facts.session_key).key
