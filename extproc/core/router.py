"""The routing core: request in, facts to load out; facts in, route and writes out. No I/O.

Per request the servicer makes three calls and does the I/O between them:

1. ``read`` parses the body once, reads the session identity and says which facts to load
   (the session's record, the owners of the ids the request carries, the chain to follow);
2. ``route`` decides from those facts — SAAR picks the model, scheduling the worker — and
   returns the ``Routed`` answer with the ``Turn`` it will commit;
3. as the answer passes, ``answered`` (the upstream's status: a 2xx commits the turn),
   ``finished`` (what the answer carried: ids to claim, usage) and ``ended`` (the stream
   closed: bookkeeping, a session's end) return the writes for the store.

Everything here is synchronous and reads time from the injected clock, so the evaluation
matrix, the simulators and the tests drive the very same object (``LocalDriver``) without
Envoy, gRPC or a store server.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import xxhash

from ..apis import model_spans, parse_request, peek_model, rewrite_model
from ..config import Config
from ..errors import RoutingError, SessionPaused
from ..observability.metrics import Metrics
from ..observability.replay import JsonlSink, ReplayStore
from ..observability.trace import MooncakeTraceWriter
from ..scheduling.placement import Placement, Pools, Prompt
from ..state.memory import MemoryStore
from ..state.records import Claim, Commit, Finish, Forget, Owner, SessionRecord, Turn, Write
from ..state.records import owner_key as scoped
from ..state.store import Facts, Query
from ..types import Action, Api, Clock, RequestSummary, ResponseSummary, SessionIdentity
from .health import ModelHealth
from .identity import IdentityReader, chained
from .paths import api_for as api_for  # re-exported: which requests are API calls
from .saar import RoutingDecision, SaarEngine
from .selection import Selector


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


@dataclass(frozen=True, slots=True)
class Timings:
    """Where one request's routing time went, in seconds, as the core measured it; the replay
    record carries it to the metrics, the web view and the service's trace spans."""

    parse: float
    identity: float
    load: float
    """Between ``read`` and ``route``: the servicer loading the facts from the state layer."""
    saar: float
    scheduling: float
    plugins: Mapping[str, float] = field(default_factory=dict)
    """The scheduler's timing of each of its plugins, in the order they ran."""
    held: float = 0.0
    """Seconds the request waited at the processor (its holds), taken out of ``load``."""


class Held(NamedTuple):
    """One wait of a request at the processor before it was routed (``perf_counter`` times):
    admission paused its session, its lock's model was out, its large body waited for its
    tenant's budget. The record lists them; they are not the router's own time."""

    kind: str
    since: float
    until: float


@dataclass(frozen=True, slots=True)
class Routed:
    replay_id: str
    model: str
    cluster: str
    body: bytes | None
    """The rewritten body, or None when the client already named the physical model."""
    diagnostics: dict[str, str]
    """Response headers for the client (Envoy adds them from dynamic metadata)."""
    turn: Turn
    placement: Placement = field(default_factory=lambda: Placement(()))
    stream: bool = False
    """The client asked for a streamed (SSE) answer."""
    api: Api = Api.CHAT
    delay: float | None = None
    """Seconds since the session's previous turn (the agent's tool time), when known."""

    @property
    def workers(self) -> tuple[str, ...]:
        """The picked worker first, then fallbacks; empty when Envoy's balancer decides."""
        return self.placement.workers


class Router:
    def __init__(
        self,
        config: Config,
        *,
        clock: Clock = time.time,
        metrics: Metrics | None = None,
        selector: Selector | None = None,
        secret: bytes | None = None,
    ) -> None:
        """``secret`` keys the tenant hash (replicas share it); a random one by default."""
        self.config = config
        self.clock = clock
        self.metrics = metrics or Metrics()
        identity = config.identity
        self.identity = IdentityReader(
            identity.tenant_header, identity.extra_session_headers, identity.max_value_bytes,
            **({"secret": secret} if secret else {}),
        )
        self.health = ModelHealth(
            clock=clock,
            failure_threshold=config.health.failure_threshold,
            cooldown=config.health.cooldown_seconds,
        )
        self.engine = SaarEngine(config, self.health, clock=clock, selector=selector)
        self.pools = Pools(config, clock=clock)
        sink = JsonlSink(config.replay.jsonl_path) if config.replay.jsonl_path else None
        self.replay = ReplayStore(config.replay.capacity, sink, clock=clock)
        self._trace_sink = (
            JsonlSink(config.replay.mooncake_trace_path)
            if config.replay.mooncake_trace_path else None
        )
        self.trace = MooncakeTraceWriter(self._trace_sink.write) if self._trace_sink else None

    # -- the request path ------------------------------------------------------------------

    def read(self, api: Api, headers: Mapping[str, str], raw: bytes) -> Request:
        """Parse once and say which facts to load. Raises ``RoutingError`` (counted). A model
        nobody serves is refused before the parse: no one can make the router parse 8 MiB
        bodies only to answer 404."""
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
        prompt = Prompt(summary)
        self.pools.prepare(prompt)
        parsed = time.perf_counter()
        identity = self.identity.read(headers, summary)
        tenant = identity.tenant
        ids = [*summary.tool_result_ids, *summary.provider_state]
        chain = None
        if summary.previous_response_id:
            ids.append(summary.previous_response_id)
            if identity.session_id is None:
                chain = scoped(tenant, summary.previous_response_id)
        query = Query(identity.key, tuple(scoped(tenant, i) for i in ids), chain)
        return Request(summary, identity, headers, query, started, parsed, time.perf_counter(),
                       spans, prompt)

    def prefetch(self, headers: Mapping[str, str]) -> Query | None:
        """What to load before the body arrives: the session the headers name (the body can
        only name one when they name none), None when they name none."""
        key = self.identity.read(headers).key
        return None if key is None else Query(key)

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

    def route(
        self,
        request: Request,
        facts: Facts,
        *,
        subset: frozenset[str] | None = None,
        admit_paused: bool = False,
        holds: Iterable[Held] = (),
    ) -> Routed:
        """Decide where the request goes: model, then worker. Raises ``RoutingError`` (already
        counted); ``SessionPaused`` unless ``admit_paused`` (a hold that timed out). ``holds``:
        where the request waited before this call (recorded, and not counted as loading)."""
        began = time.perf_counter()
        summary = request.summary
        identity = chained(request.identity, facts.session_key)
        state = facts.session if identity.key == facts.session_key else None
        try:
            if not admit_paused and self.pools.admission.is_paused(identity.key):
                assert identity.key is not None
                tick = self.config.scheduling.admission.tick_seconds
                raise SessionPaused(identity.key, retry_after=max(1, round(tick)))
            prompt = request.prompt or Prompt(summary)
            prompt.session = identity.key  # the chain may have named it only now
            owners = _owners(facts, state, identity)
            cached: dict[str, int | None] = {}

            def cached_tokens(model: str) -> int | None:
                if model not in cached:
                    cached[model] = self.pools.cached_tokens(prompt, model)
                return cached[model]

            decision = self.engine.decide(
                summary, identity, request.headers, state, owners, cached_tokens
            )
            decided = time.perf_counter()
            bound = state.worker if state is not None and state.model == decision.model else None
            pinned = decision.pinned_worker
            if pinned is None and decision.lock is None:
                pinned = _issuer(owners, summary, decision.model)
            placement = self.pools.place(
                prompt, decision.model, identity.key, subset, bound=bound, pinned=pinned,
                identity=identity,
            )
            body = None
            if decision.model != summary.model:
                spans = request.spans
                if peek_model(summary.raw, spans) != summary.model:  # an escaped duplicate
                    spans = model_spans(summary.raw)
                body = rewrite_model(summary.raw, decision.model, spans)
        except RoutingError as exc:
            self.metrics.errors.labels(exc.code).inc()
            raise
        placed = time.perf_counter()
        holds = tuple(holds)
        held = sum(max(0.0, min(h.until, began) - max(h.since, request.identified))
                   for h in holds)
        timings = Timings(
            request.parsed - request.started, request.identified - request.parsed,
            began - request.identified - held, decided - began, placed - decided,
            placement.result.durations if placement.result is not None else {},
            sum(h.until - h.since for h in holds),
        )
        now = self.clock()
        replay_id = self.replay.new_id()
        turn = Turn(
            replay_id, identity.key, identity.tenant, decision.model, decision.decision,
            decision.phase, decision.action is Action.SWITCH, summary.context_tokens, now,
            placement.worker, identity.final,
        )
        self.replay.put(decision_record(replay_id, now, summary, identity, decision,
                                        placement, state, timings,
                                        request.headers.get("traceparent"), cached, holds))
        self.pools.started(placement, identity.key, summary.context_tokens)
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
            None if state is None else max(0.0, now - state.last_seen),
        )

    # -- the answer path -------------------------------------------------------------------

    def answered(self, routed: Routed, status: int, served: str | None = None) -> list[Commit]:
        """The upstream answered (``served``: the worker Envoy really used, when known): a 2xx
        commits the turn, anything else does not (a failed request never counts as a switch).
        """
        turn = routed.turn
        self.health.record(turn.model, status)
        self.metrics.responses.labels(turn.model, f"{status // 100}xx").inc()
        self.replay.complete(turn.replay_id, outcome_of(status, served, None))
        if not 200 <= status < 300:
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
        ids = issued(response)
        writes: list[Write] = [
            Finish(turn, bool(response.tool_call_ids), response.usage, tuple(ids))
        ]
        done = set(claimed)
        claim = self.claim(turn, [i for i in ids if i not in done])
        if claim is not None:
            writes.append(claim)
        return writes

    @staticmethod
    def claim(turn: Turn, ids: Iterable[str]) -> Claim | None:
        """``ids`` issued by ``turn``: its model and worker own them, in its tenant."""
        keys = tuple(scoped(turn.tenant, i) for i in ids)
        return Claim(keys, Owner(turn.model, turn.worker, turn.session_key)) if keys else None

    def ended(
        self, routed: Routed, outcome: dict[str, Any], response: ResponseSummary | None
    ) -> list[Write]:
        """The request's stream closed (answered, failed or abandoned): the worker has one
        fewer in flight, admission sees a tool boundary, the replay record gets its outcome
        and a session's final request forgets it."""
        turn = routed.turn
        usage = response.usage if response is not None else None
        self.pools.finished(
            routed.placement, turn.session_key,
            usage.prompt_tokens if usage else turn.context_tokens,
            usage.completion_tokens if usage else 0,
        )
        outcome["latency_ms"] = round((self.clock() - turn.started) * 1000, 3)
        self.replay.complete(turn.replay_id, outcome)
        if self.trace is not None:
            self._trace(routed, usage)
        if turn.final and turn.session_key is not None:
            self.pools.admission.release(turn.session_key)
            return [Forget(turn.session_key)]
        return []

    def close(self) -> None:
        """Flush the replay and trace sinks."""
        self.replay.close()
        if self._trace_sink is not None:
            self._trace_sink.close()

    # -- internals -------------------------------------------------------------------------

    def _trace(self, routed: Routed, usage: Any) -> None:
        assert self.trace is not None
        turn = routed.turn
        key = turn.session_key
        self.trace.write(
            session_id=None if key is None else xxhash.xxh3_64_hexdigest(key.encode()),
            timestamp_ms=turn.started * 1000,
            input_length=max(1, usage.prompt_tokens if usage else turn.context_tokens),
            output_length=usage.completion_tokens if usage else 0,
            block_hashes=routed.placement.blocks,
            delay_ms=None if routed.delay is None else routed.delay * 1000,
        )

    def _count(self, api: Api, decision: RoutingDecision) -> None:
        self.metrics.requests.labels(api.value, decision.decision).inc()
        self.metrics.decisions.labels(decision.action.value, decision.reason).inc()
        if decision.lock:
            self.metrics.locks.labels(decision.lock).inc()
        if decision.reset:
            self.metrics.resets.labels(decision.reset).inc()


class LocalDriver:
    """The servicer's three calls, synchronously, over an in-process store: what the
    evaluation matrix, the simulators and the tests run the router with."""

    def __init__(self, router: Router, store: MemoryStore | None = None) -> None:
        self.router = router
        self.store = store or MemoryStore.from_config(router.config, router.clock)

    def route(
        self, api: Api, headers: Mapping[str, str], raw: bytes, **options: Any
    ) -> Routed:
        request = self.router.read(api, headers, raw)
        return self.router.route(request, self.store.load_now(request.query), **options)

    def respond(
        self, routed: Routed, response: ResponseSummary, served: str | None = None
    ) -> None:
        """The answer arrives whole: its status, then its body, then the stream ends."""
        router, now = self.router, self.router.clock()
        writes: list[Write] = [*router.answered(routed, response.status, served)]
        if writes:
            writes += router.finished(routed.turn, response)
        self.store.apply_now(writes, now)
        self.store.apply_now(router.ended(routed, outcome_of(None, None, response), response), now)

    def session(self, key: str) -> SessionRecord | None:
        return self.store.record(key)


def issued(response: ResponseSummary) -> list[str]:
    """The ids an answer made its model own: tool calls, provider state, the response."""
    ids = [*response.tool_call_ids, *response.provider_state]
    if response.response_id:
        ids.append(response.response_id)
    return ids


def outcome_of(
    status: int | None, served: str | None, response: ResponseSummary | None
) -> dict[str, Any]:
    """The replay record's outcome (content-free): the status and worker where the caller saw
    them, what the answer carried where it saw that (an observe stream sees only the body)."""
    out: dict[str, Any] = {}
    if status is not None:
        out["status"] = status
        out["served_worker"] = served
    if response is not None:
        usage = response.usage
        out.update(
            model=response.model,
            finish_reason=response.finish_reason,
            tool_names=response.tool_names,
            tool_calls=len(response.tool_call_ids),
            response_id=response.response_id,
            usage=None if usage is None else {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cached_tokens": usage.cached_tokens,
            },
        )
    return out


def _issuer(owners: Mapping[str, Owner], request: RequestSummary, model: str) -> str | None:
    """The worker of ``model`` that issued what the request continues (its pending tool calls,
    its provider state): a physical model name skips SAAR's locks, not the worker they pin to
    (an endpoint picker behind the model router sees physical names only)."""
    ids = [*request.tool_result_ids, *request.provider_state]
    if request.previous_response_id:
        ids.append(request.previous_response_id)
    for key in ids:
        owner = owners.get(key)
        if owner is not None and owner.model == model and owner.worker:
            return owner.worker
    return None


def _owners(
    facts: Facts, state: SessionRecord | None, identity: SessionIdentity
) -> dict[str, Owner]:
    """Who issued the ids, keyed by the bare id as the engine looks them up: what the session
    record says of its last answer's ids, then what the store's owner keys say."""
    owners: dict[str, Owner] = {}
    if state is not None and state.issued:
        issuer = Owner(state.model, state.issued_worker, identity.key)
        owners = dict.fromkeys(state.issued, issuer)
    cut = len(identity.tenant) + 1
    owners.update((key[cut:], owner) for key, owner in facts.owners.items())
    return owners


def diagnostics(
    replay_id: str, decision: RoutingDecision, request: RequestSummary
) -> dict[str, str]:
    return {
        "x-replay-id": replay_id,
        "x-saar-selected-model": decision.model,
        "x-saar-decision": decision.decision,
        "x-saar-session-phase": decision.phase.value,
        "x-saar-action": decision.action.value,
        "x-saar-confidence": f"{decision.confidence:.3f}",
        "x-saar-context-tokens": str(request.context_tokens),
    }


def decision_record(
    replay_id: str,
    now: float,
    request: RequestSummary,
    identity: SessionIdentity,
    decision: RoutingDecision,
    placement: Placement,
    state: SessionRecord | None,
    timings: Timings | None = None,
    traceparent: str | None = None,
    cached: Mapping[str, int | None] | None = None,
    holds: Iterable[Held] = (),
) -> dict[str, Any]:
    """The content-free replay record of one decision; ``memory`` is the session's record as
    the decision saw it (``previous_replay_id`` chains a session's records). It holds what
    ``saar replay what-if`` needs to decide the turn again (the matched decision and whether it
    matched on content, a fingerprint of the provider state referenced, the tokens SAAR's
    pricing measured cached on each model's best worker), the core's timings, the request's
    holds at the processor, and the client's W3C ``traceparent`` when well formed (the
    service's span continues it)."""
    base = decision.base
    result = placement.result
    return {
        "replay_id": replay_id,
        "time": now,
        "session": {
            "id": identity.session_id,
            "tenant": identity.tenant,
            "source": identity.source,
            "parent": identity.parent_session_id,
            "final": identity.final,
            "compaction": identity.compaction,
        },
        "memory": None
        if state is None
        else {
            "model": state.model,
            "decision": state.decision,
            "phase": state.phase.value,
            "worker": state.worker,
            "turns": state.turns,
            "switches": state.switches,
            "recent_switches_ago_s": [round(now - t, 3) for t in state.switch_times],
            "idle_s": round(now - state.last_seen, 3),
            "context_tokens": state.context_tokens,
            "estimated_reuse_tokens": state.estimated_reuse_tokens,
            "reported_prompt_tokens": state.reported_prompt_tokens,
            "reported_cached_tokens": state.reported_cached_tokens,
            "previous_replay_id": state.last_replay_id,
        },
        "request": {
            "api": request.api.value,
            "model": request.model,
            "stream": request.stream,
            "messages": request.message_count,
            "context_tokens": request.context_tokens,
            "tools_offered": len(request.tools_offered),
            "tool_results": max(request.tool_results, len(request.tool_result_ids)),
            "previous_response_id": request.previous_response_id is not None,
            "previous_response_ref": None
            if request.previous_response_id is None else id_ref(request.previous_response_id),
            "provider_state_items": len(request.provider_state),
        },
        "base": None
        if base is None
        else {
            "decision": base.decision,
            "model": base.model,
            "difficulty": round(base.difficulty, 4),
            "matched": base.matched,
            "topical": base.topical,
            "confidence": round(base.confidence, 4),
            "scores": {k: round(v, 4) for k, v in base.scores.items()},
        },
        "cached_tokens": dict(cached or {}),
        "lock": decision.lock,
        "reset": decision.reset,
        "candidates": [
            {
                "model": t.model,
                "base": round(t.base, 4),
                "stay_bias": t.stay_bias,
                "handoff": t.handoff,
                "history": round(t.history, 4),
                "cache_penalty": round(t.cache_penalty, 4),
                "transition_usd": round(t.transition_usd, 6),
                "remaining_turns": t.remaining_turns,
                "saving_usd": round(t.saving_usd, 6),
                "risk_usd": round(t.risk_usd, 6),
                "held": t.held,
                "adjusted": round(t.adjusted, 4),
                "available": t.available,
            }
            for t in decision.candidates
        ],
        "previous_model": decision.previous_model,
        "decision": decision.decision,
        "model": decision.model,
        "action": decision.action.value,
        "phase": decision.phase.value,
        "reason": decision.reason,
        "confidence": round(decision.confidence, 4),
        "worker": None
        if result is None
        else {
            "picked": placement.worker,
            "pinned": decision.pinned_worker,
            "fallbacks": list(placement.workers[1:]),
            "matched_blocks": dict(result.matched_blocks),
            "scores": {k: round(v, 4) for k, v in result.total.items()},
            "by_scorer": {name: {k: round(v, 4) for k, v in scores.items()}
                          for name, scores in result.scores.items()},
        },
        "timings_us": None
        if timings is None
        else {
            "parse": _us(timings.parse),
            "identity": _us(timings.identity),
            "load": _us(timings.load),
            "saar": _us(timings.saar),
            "scheduling": _us(timings.scheduling),
            "plugins": {name: _us(seconds) for name, seconds in timings.plugins.items()},
            "held": _us(timings.held),
        },
        "holds": [{"kind": h.kind, "ms": round((h.until - h.since) * 1e3, 1)} for h in holds]
        or None,
        "traceparent": traceparent
        if traceparent is not None and _TRACEPARENT.fullmatch(traceparent) else None,
    }


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def id_ref(value: str) -> str:
    """A fingerprint of an id for the record (the what-if matches references to issuers)."""
    return xxhash.xxh3_64_hexdigest(value.encode())


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)
