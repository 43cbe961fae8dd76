"""One request's life at the processor, as a state machine that does no I/O.

Events go in — what Envoy sent (request headers, body chunks and their end, trailers, response
headers, an answer's chunks, the stream's end), and the results of what the exchange asked for
(the body parsed, the facts loaded, a hold woken) — and commands come out: load these facts,
parse this body, reply to Envoy like this, hold the request (kind, what wakes it, for how long),
wake another request, apply these writes, refuse with this error. The adapter's loop
(``adapter.stream``) decodes Envoy's messages into events, runs the commands and encodes the
replies; every stream kind drives this one machine:

* the **routing stream** of a local Envoy (``BUFFERED`` body): request headers → body →
  (parse, load, route) → the route; response headers → the commit, and for a JSON answer its
  body, read as it passes (the ids it may carry, its usage and finish reason, told to the journal
  before the client gets a byte of it); the end of the stream ends the turn;
* a gateway's **endpoint picker stream** (``FULL_DUPLEX_STREAMED``): the request's chunks are
  gathered until its end, and only then are the headers answered (the pick rides on them) and
  the body sent back; the answer's chunks pass back at once, each after the ids it carries are
  claimed;
* the **observe stream** (``observability_mode``) of a streamed answer: the turn comes in the
  ``saar`` metadata; ids are claimed the moment they pass, the terminal event finishes the turn.

Every write lands in this process's state at once; the shared store's copy follows
(``Apply(wait=False)``), except where an answer passes through this stream carrying an id that
binds its next request (a tool call, a response id, provider state): that chunk goes on only
once the shared store has the id's owner (``Apply(wait=True)``, bounded by the store's
timeout), so no replica can be asked for the continuation before it can know the issuer; and
a streamed answer that may carry such ids is committed there before its first byte passes. A
request that could still race a claim — the newest id it continues has no known issuer, and a
write that may name one is on its way (an observe stream's, which Envoy does not wait for) —
is held (``settle``) until the issuer appears or the bound passes: only it waits, and only
then; past the bound it goes by the session's record, which names that answer's model and
worker.
Holds are woken by what they wait for: admission resuming the session, the locked model's
cool-down ending, a large-body slot freed, a claim landing; never polled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import TypeAlias

from ..apis import ResponseObserver
from ..config import Config
from ..errors import (
    BodyTooLarge,
    LockedModelDown,
    MalformedRequest,
    PathNotFound,
    RequestShed,
    RoutingError,
    SessionPaused,
    TenantBusy,
    shown,
)
from ..state.records import Commit, Turn, Write
from ..state.store import Facts, Query
from ..types import Api, ResponseSummary
from .bodies import LargeBodies
from .journal import Held
from .paths import classify, error_style
from .router import Issuer, Queued, Request, Routed, Router, binding, issued

SERVED_APIS = "POST /v1/chat/completions, /v1/responses, /v1/messages and /v1/completions"
SETTLE_FIRST_SECONDS = 0.002
"""The first look again for an issuer not known yet; each later one waits twice as long."""
QUEUE_LOOK_SECONDS = 2.0
"""How often a queued request looks whether it was dispatched (its wake-up is the fast way)."""

# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestHeaders:
    headers: Mapping[str, str]
    """Lower-cased names, as Envoy sends them."""
    end: bool = False
    subset: frozenset[str] | None = None
    """The proxy's subset hint: pick only from these endpoints."""
    duplex: bool = False
    """The body streams in full duplex (a gateway's endpoint picker filter)."""
    duplex_response: bool = False


@dataclass(frozen=True, slots=True)
class RequestBody:
    chunk: bytes
    end: bool = True


@dataclass(frozen=True, slots=True)
class RequestTrailers:
    pass


@dataclass(frozen=True, slots=True)
class Parsed:
    """What ``Parse`` gave: the request, or the error that refuses it."""

    request: Request | None
    error: RoutingError | None = None


@dataclass(frozen=True, slots=True)
class Loaded:
    facts: Facts
    early: bool = False
    """Facts of the session the headers named, loaded while the body was on its way."""


@dataclass(frozen=True, slots=True)
class ResponseHeaders:
    status: int
    streamed: bool = False
    """An SSE answer (``text/event-stream``)."""
    served: str | None = None
    """The worker Envoy really sent the request to, when it says."""
    end: bool = False


@dataclass(frozen=True, slots=True)
class ResponseBody:
    chunk: bytes
    end: bool = True


@dataclass(frozen=True, slots=True)
class ResponseTrailers:
    pass


@dataclass(frozen=True, slots=True)
class Observe:
    """An observe stream begins: the turn it completes (None: nothing to observe)."""

    turn: Turn | None
    api: Api | None


@dataclass(frozen=True, slots=True)
class Woken:
    """A hold ended: ``late`` when its time ran out, else what it waited for may have come."""

    kind: str
    late: bool = False


@dataclass(frozen=True, slots=True)
class Closed:
    pass


Event: TypeAlias = (RequestHeaders | RequestBody | RequestTrailers | Parsed | Loaded
                    | ResponseHeaders | ResponseBody | ResponseTrailers | Observe | Woken
                    | Closed)

# -- commands --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Load:
    """Load ``query``'s facts and send them back as ``Loaded`` (``early``: start now, while
    the exchange answers Envoy; the facts come back whenever they are in)."""

    query: Query
    early: bool = False


@dataclass(frozen=True, slots=True)
class Parse:
    """Run ``job`` (pure) and send back ``Parsed``; on the parse thread when ``offload``."""

    job: Callable[[], Request]
    offload: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    """Answer the current message later: tell Envoy to wait up to ``timeout`` longer, then
    send ``Woken`` when ``Wake(kind, key)`` comes, ``due`` seconds have passed, or ``timeout``
    (``late``). Nothing sent upstream is touched: only this request, not yet forwarded, waits.

    Kinds: ``large_body`` (its tenant's large-body slots or bytes are busy), ``paused``
    (admission paused the session), ``locked`` (a hard lock's model is out), ``settle`` (the
    issuer of the newest id it continues is not known yet), ``queue`` (flow control's queue of
    a saturated pool)."""

    kind: str
    key: str
    timeout: float
    due: float | None = None


@dataclass(frozen=True, slots=True)
class Wake:
    """Wake the request held as ``(kind, key)``, if one is."""

    kind: str
    key: str


@dataclass(frozen=True, slots=True)
class Apply:
    """Write to the state layer: here at once; to the shared store now (``wait``) or soon."""

    writes: tuple[Write, ...]
    wait: bool = False


class Phase(Enum):
    REQUEST_HEADERS = auto()
    REQUEST_BODY = auto()
    REQUEST_TRAILERS = auto()
    RESPONSE_HEADERS = auto()
    RESPONSE_BODY = auto()
    RESPONSE_TRAILERS = auto()


@dataclass(frozen=True, slots=True)
class Continue:
    """Let the message ``phase`` go on. Request headers: ``remove`` the client's routing
    headers, set ``path`` (the canonical one), ``skip`` the rest of the request (not an API
    call), send it to ``issuer``. Response headers: set ``diagnostics``, and ``read_body`` (a
    JSON answer's)."""

    phase: Phase
    remove: tuple[str, ...] = ()
    path: str | None = None
    skip: bool = False
    routed: Routed | None = None
    """Response headers: the decision whose diagnostics the client gets."""
    read_body: bool = False
    issuer: Issuer | None = None
    """Request headers: the model and worker that issued the stored response the request
    names (its cluster and worker are set as a route's are)."""


@dataclass(frozen=True, slots=True)
class Route:
    """The route: cluster, model, pick, metadata and the body to send on. Buffered, the
    reply to the body; full duplex, the headers' reply (with ``remove`` and ``path``), then
    ``body`` in chunks, then the trailers' reply when they came."""

    routed: Routed
    body: bytes | None
    """What goes upstream, when it is not the body Envoy holds (buffered: the rewrite)."""
    duplex: bool = False
    remove: tuple[str, ...] = ()
    path: str | None = None
    trailers: bool = False


@dataclass(frozen=True, slots=True)
class Chunk:
    """Full duplex: a body chunk passed back (the request's, for traffic that is no API call;
    the answer's)."""

    phase: Phase
    data: bytes
    end: bool


@dataclass(frozen=True, slots=True)
class Refuse:
    error: RoutingError
    style: str
    """The client's error format: ``openai`` or ``anthropic``."""


@dataclass(frozen=True, slots=True)
class Done:
    """An observe stream has nothing left to learn: end it (Envoy would keep it open)."""


Command: TypeAlias = (Load | Parse | Hold | Wake | Apply | Continue | Route | Chunk | Refuse
                      | Done)

# -- options ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    """What the exchange reads of the configuration, once per process."""

    cluster_header: str
    model_header: str | None
    """Set to the routed model (HTTPRoute rules match it); the client's copy is removed."""
    diagnostic_prefix: str
    destination_header: str
    observe_header: str
    """The names Envoy trusts (the adapter's contract): a client's copies are removed."""
    prefill_header: str | None = None
    """The prefill pick's header, which the decode worker's sidecar trusts: also removed."""
    max_body_bytes: int = 8 * 1024 * 1024
    parse_thread_bytes: int = 256 * 1024
    hold_paused: bool = True
    paused_hold_seconds: float = 30.0
    locked_hold_seconds: float = 10.0
    settle_seconds: float = 0.0
    """How long a request whose newest issuer is unknown waits for it (0: never)."""
    shared: bool = False
    """A shared store: other replicas' writes may be on their way."""

    @classmethod
    def from_config(cls, config: Config, *, shared: bool, **names: str) -> Options:
        """``names``: the adapter's header names (its contract), given by the assembly."""
        admission = config.scheduling.admission
        return cls(
            cluster_header=config.routing.cluster_header.lower(),
            model_header=config.routing.model_header.lower() or None,
            max_body_bytes=config.limits.max_body_bytes,
            parse_thread_bytes=config.limits.parse_thread_bytes,
            hold_paused=admission.on_paused == "hold",
            paused_hold_seconds=admission.hold_timeout_seconds,
            locked_hold_seconds=config.health.locked_hold_seconds,
            settle_seconds=config.state.settle_ms / 1000,
            shared=shared,
            **names,
        )


# -- the exchange ----------------------------------------------------------------------------


class Stage(Enum):
    START = auto()
    PASS = auto()
    """Not an API call: everything passes."""
    LOCATE = auto()
    """An operation on a stored response: its issuer is being looked up."""
    GATHER = auto()
    """An API call whose body is on its way."""
    DECIDE = auto()
    """The body is in: parsing, loading, routing, or held on the way."""
    ROUTED = auto()
    OBSERVE = auto()
    DONE = auto()


@dataclass(slots=True)
class _Inbound:
    """What the request headers said."""

    headers: Mapping[str, str]
    api: Api
    remove: tuple[str, ...]
    path: str | None
    subset: frozenset[str] | None
    duplex: bool
    duplex_response: bool
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    trailers: bool = False
    answered: bool = False
    """The request headers have been answered (full duplex: only once routed)."""
    tenant: str = ""
    """Whose large-body budget the body is charged to (read once, at the headers)."""


@dataclass(frozen=True, slots=True)
class _Locating:
    """What the request headers of an operation on a stored response said."""

    query: Query
    remove: tuple[str, ...]
    path: str | None
    duplex: bool


@dataclass(slots=True)
class _Slot:
    """A large body's place: its tenant, and its ticket while it waits in line."""

    tenant: str
    ticket: str | None = None
    taken: bool = False


@dataclass(slots=True)
class _Waiting:
    """The hold in progress and what to do when it ends."""

    kind: str
    key: str
    since: float
    deadline: float
    then: Callable[[bool], list[Command]]
    """Called with ``late``."""


@dataclass(slots=True)
class _Answer:
    """The answer as it passes."""

    turn: Turn
    observer: ResponseObserver | None = None
    held: list[Write] = field(default_factory=list)
    """A JSON answer's commit, written together with what its body carries."""
    claimed: list[str] = field(default_factory=list)
    sse: bool | None = None
    begun: bool = False
    """Its first event passed (the time to first token is learnt then)."""
    finished: bool = False
    told: bool = False
    """The journal has what it carried (the routing stream's end need not tell it again)."""


class Exchange:
    """One stream's request (or, for an observe stream, one answer), event by event."""

    def __init__(self, router: Router, options: Options, *,
                 bodies: LargeBodies | None = None,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        """``bodies`` bounds each tenant's large bodies in flight (off without it: tests,
        tools); ``timer`` is the monotonic clock of holds."""
        self._router = router
        self._options = options
        self._bodies = bodies
        self._timer = timer
        self.stage = Stage.START
        self.style = "openai"
        """The error format of this request's client."""
        self._inbound: _Inbound | None = None
        self._locating: _Locating | None = None
        self._slot: _Slot | None = None
        self._request: Request | None = None
        self._early: Facts | bool | None = None
        """The early load: None (none), True (on its way), or its facts."""
        self._facts: Facts | None = None
        self._settle_deadline: float | None = None
        self._settle_step = SETTLE_FIRST_SECONDS
        self._duplex = False
        self._observing = False
        self._waiting: _Waiting | None = None
        self._holds: list[Held] = []
        self._locked_held = False
        self._ticket: tuple[str, str] | None = None
        """Flow control's ticket (and pool) while the request waits in its queue."""
        self._routed: Routed | None = None
        self._status = 0
        self._answer: _Answer | None = None
        self._ended = False

    @property
    def held(self) -> bool:
        """The current message waits for a hold to end."""
        return self._waiting is not None

    @property
    def closing(self) -> bool:
        """Envoy sends nothing more on this routing stream but its end: the answer's headers
        passed and no body of it is read here, or its end was (the routing filter's modes send
        no body unless a reply asks for it, and no trailers)."""
        inbound, answer = self._inbound, self._answer
        return (self._status != 0 and not self._observing and inbound is not None
                and not inbound.duplex_response and (answer is None or answer.finished))

    def handle(self, event: Event) -> list[Command]:
        """The commands ``event`` calls for, in order."""
        try:
            return self._dispatch(event)
        except RoutingError as exc:
            return self._failed(exc, admit_paused=False)

    def _dispatch(self, event: Event) -> list[Command]:
        if isinstance(event, RequestHeaders):
            return self._on_request_headers(event)
        if isinstance(event, RequestBody):
            return self._on_request_body(event)
        if isinstance(event, Parsed):
            return self._on_parsed(event)
        if isinstance(event, Loaded):
            return self._on_loaded(event)
        if isinstance(event, Woken):
            return self._on_woken(event)
        if isinstance(event, ResponseHeaders):
            return self._on_response_headers(event)
        if isinstance(event, ResponseBody):
            if self._observing:
                return self._observed_chunk(event)
            return self._on_response_body(event)
        if isinstance(event, RequestTrailers):
            inbound = self._inbound
            if self.stage is Stage.GATHER and inbound is not None and inbound.duplex:
                inbound.trailers = True
                return self._gathered()
            return [Continue(Phase.REQUEST_TRAILERS)]
        if isinstance(event, ResponseTrailers):
            return [Continue(Phase.RESPONSE_TRAILERS)]
        if isinstance(event, Observe):
            return self._on_observe(event)
        return self._on_closed()

    # -- request headers -------------------------------------------------------------------

    def _on_request_headers(self, event: RequestHeaders) -> list[Command]:
        headers = event.headers
        self._duplex = event.duplex
        remove = self._spoofed(headers)
        method, path = headers.get(":method", ""), headers.get(":path", "")
        found = classify(method, path)
        self.style = found.api.error_style if found.api else error_style(path, headers)
        if found.unknown:
            self._router.metrics.errors.labels(PathNotFound.code).inc()
            raise PathNotFound(f"Invalid URL ({shown(method, 16)} {shown(path)}): this router "
                               f"serves {SERVED_APIS}")
        if found.response_id is not None:  # provider-bound: its issuer answers
            locating = _Locating(self._router.locate(headers, found.response_id), remove,
                                 found.path, event.duplex)
            self._locating = locating
            self.stage = Stage.LOCATE
            return [Load(locating.query)]
        if found.api is None:
            self.stage = Stage.PASS
            return [Continue(Phase.REQUEST_HEADERS, remove, skip=not event.duplex)]
        if event.end:
            raise MalformedRequest("request has no body; a JSON body with a model is required")
        self._inbound = _Inbound(headers, found.api, remove, found.path, event.subset,
                                 event.duplex, event.duplex_response)
        if self._bodies is not None:  # every tenant at work shares the large-body budget
            self._inbound.tenant = self._router.identity.tenant(headers)
            self._bodies.seen(self._inbound.tenant)
        self.stage = Stage.GATHER
        commands: list[Command] = []
        query = self._router.prefetch(headers) if self._options.shared else None
        if query is not None:
            self._early = True
            commands.append(Load(query, early=True))
        if event.duplex:
            return commands  # answered once the body has been seen: the pick rides on it
        length = headers.get("content-length", "")
        size = int(length) if length.isdigit() else 0
        return commands + self._gate(size, self._answer_headers)

    def _answer_headers(self) -> list[Command]:
        inbound = self._inbound
        assert inbound is not None
        inbound.answered = True
        return [Continue(Phase.REQUEST_HEADERS, inbound.remove, inbound.path)]

    def _spoofed(self, headers: Mapping[str, str]) -> tuple[str, ...]:
        """Client headers that Envoy or we would trust for routing: always removed."""
        options = self._options
        trusted = (options.destination_header, options.cluster_header, options.model_header,
                   options.prefill_header)
        names = tuple(h for h in headers
                      if h in trusted or h.startswith(options.diagnostic_prefix))
        for name in names:
            self._router.metrics.stripped_headers.labels(
                name if name in trusted or name == options.observe_header else "other").inc()
        return names

    # -- the body --------------------------------------------------------------------------

    def _on_request_body(self, event: RequestBody) -> list[Command]:
        inbound = self._inbound
        if self.stage is not Stage.GATHER or inbound is None:
            # Not an API call, or already answered: each chunk passes as it is.
            if self._duplex:
                return [Chunk(Phase.REQUEST_BODY, event.chunk, event.end)]
            return [Continue(Phase.REQUEST_BODY)]
        inbound.size += len(event.chunk)
        if inbound.size > self._options.max_body_bytes:
            inbound.chunks = []
            self._router.metrics.errors.labels(BodyTooLarge.code).inc()
            raise BodyTooLarge(f"request body is over {self._options.max_body_bytes} bytes")
        inbound.chunks.append(event.chunk)
        if not event.end:
            return []
        return self._gathered()

    def _gathered(self) -> list[Command]:
        """The whole body is in: past the large-body gate, it is parsed."""
        inbound = self._inbound
        assert inbound is not None
        self.stage = Stage.DECIDE
        return self._gate(inbound.size, self._parse)

    def _parse(self) -> list[Command]:
        inbound = self._inbound
        assert inbound is not None
        body = inbound.chunks[0] if len(inbound.chunks) == 1 else b"".join(inbound.chunks)
        inbound.chunks = [body]
        router, api, headers = self._router, inbound.api, inbound.headers
        threshold = self._options.parse_thread_bytes
        return [Parse(lambda: router.read(api, headers, body),
                      offload=bool(threshold) and len(body) >= threshold)]

    def _on_parsed(self, event: Parsed) -> list[Command]:
        commands = self._release()  # the large body is parsed (or refused): its slot is free
        if event.error is not None:
            return commands + self._failed(event.error, admit_paused=False)
        assert event.request is not None
        self._request = event.request
        return commands + self._facts_needed()

    def _facts_needed(self) -> list[Command]:
        """Route if the facts are in; else say which to load (none while the early load is on
        its way: its facts may do)."""
        request = self._request
        assert request is not None
        if self._early is True:
            return []
        if isinstance(self._early, Facts):
            early, self._early = self._early, None
            if self._router.covers(request, early):
                return self._settled(early)
        return [Load(request.query)]

    def _on_loaded(self, event: Loaded) -> list[Command]:
        if self.stage is Stage.LOCATE:
            return self._located(event.facts)
        if self.stage is not Stage.DECIDE and self.stage is not Stage.GATHER:
            return []  # late: the request was refused, or routed from other facts
        if event.early:
            self._early = event.facts
            return self._facts_needed() if self._request is not None else []
        return self._settled(event.facts)

    def _located(self, facts: Facts) -> list[Command]:
        """The owner of the stored response is known (or not): the request goes to its
        issuer (or passes through), and nothing more of it is seen here."""
        locating, self._locating = self._locating, None
        assert locating is not None
        self.stage = Stage.PASS
        issuer = self._router.located(locating.query, facts)
        return [Continue(Phase.REQUEST_HEADERS, locating.remove, locating.path,
                         skip=not locating.duplex, issuer=issuer)]

    def _settled(self, facts: Facts) -> list[Command]:
        """Route on ``facts`` — unless the request could race the write that names the issuer
        of what it continues, and there is time left to wait for it."""
        request = self._request
        assert request is not None
        self._facts = facts
        options = self._options
        key = request.identity.key or facts.session_key
        # A request that names no session and whose chain leads nowhere yet waits on the id
        # it follows: only the claim of that id can tell its session.
        following = key is None and request.query.chain is not None
        if following:
            key = request.query.chain
        if options.settle_seconds > 0 and key is not None and self._router.unsettled(
                request, facts) and (options.shared or self._router.unclaimed(key) or (
                    following and self._router.claims_pending())):
            now = self._timer()
            if self._settle_deadline is None:
                self._settle_deadline = now + options.settle_seconds
            left = self._settle_deadline - now
            if left > 0:
                step = self._settle_step
                self._settle_step *= 2
                return self._hold("settle", key, left, self._look_again,
                                  due=min(step, left) if options.shared or following
                                  else None)
            self._router.orphaned(request, facts)
        return self._route(admit_paused=False)

    def _look_again(self, late: bool) -> list[Command]:
        """The settle hold ended: load the facts again (past its time, route on them)."""
        assert self._request is not None
        if late:
            self._settle_deadline = 0.0
        return [Load(self._request.query)]

    # -- routing ---------------------------------------------------------------------------

    def _route(self, *, admit_paused: bool, admitted: bool = False) -> list[Command]:
        request, facts, inbound = self._request, self._facts, self._inbound
        assert request is not None and facts is not None and inbound is not None
        try:
            routed = self._router.route(request, facts, subset=inbound.subset,
                                        admit_paused=admit_paused, admitted=admitted,
                                        holds=self._holds)
        except Queued as queued:
            return self._queue(queued, admit_paused)
        except RoutingError as exc:
            return self._failed(exc, admit_paused=admit_paused)
        self._routed = routed
        self.stage = Stage.ROUTED
        wake: list[Command] = [Wake("queue", t) for t in routed.wake]
        if inbound.duplex:
            inbound.answered = True
            body = routed.body if routed.body is not None else request.summary.raw
            return [*wake, Route(routed, body, True, inbound.remove, inbound.path,
                                 inbound.trailers)]
        return [*wake, Route(routed, routed.body)]

    def _queue(self, queued: Queued, admit_paused: bool) -> list[Command]:
        """Wait in flow control's queue until dispatched (then route, admitted), or until the
        class's TTL or the client's deadline (then 429 with the drop reason). A look every
        ``QUEUE_LOOK_SECONDS`` catches a dispatch whose wake-up was missed."""
        entered = queued.entered
        ticket = entered.ticket
        assert ticket is not None
        self._ticket = (ticket, queued.arrival.pool)
        deadline = self._timer() + entered.timeout
        wake: list[Command] = [Wake("queue", t) for t in (*entered.woken, *entered.evicted)]

        def woken(late: bool) -> list[Command]:
            left = deadline - self._timer()
            verdict = self._router.queued(ticket, late=late or left <= 0)
            if verdict == "wait":
                return self._hold("queue", ticket, left, woken, due=min(QUEUE_LOOK_SECONDS, left))
            self._ticket = None
            if verdict == "go":
                return self._route(admit_paused=admit_paused, admitted=True)
            reason = entered.expiry if verdict == "expired" else verdict
            error = self._router.shed(queued.arrival, queued.decision, reason)
            return self._failed(error, admit_paused=admit_paused)

        return [*wake, *self._hold("queue", ticket, entered.timeout, woken,
                                   due=min(QUEUE_LOOK_SECONDS, entered.timeout))]

    def _failed(self, exc: RoutingError, *, admit_paused: bool) -> list[Command]:
        """A routing error: hold the request where a hold can help, else refuse it."""
        options = self._options
        if isinstance(exc, SessionPaused) and options.hold_paused:
            return self._hold("paused", exc.session_key, options.paused_hold_seconds,
                              lambda late: self._route(admit_paused=late))
        if isinstance(exc, LockedModelDown):
            seconds = options.locked_hold_seconds
            if not self._locked_held and seconds > 0:
                self._locked_held = True
                due = self._router.health.down_for(exc.model)
                return self._hold("locked", exc.model, seconds,
                                  lambda late: self._route(admit_paused=admit_paused),
                                  due=min(due, seconds) if due > 0 else None)
            if self._request is not None and self._facts is not None and exc.replay_id is None:
                self._router.refused(self._request, self._facts, exc)
        wake: list[Command] = []
        if isinstance(exc, RequestShed):
            wake = [Wake("queue", t) for t in exc.wake]
            if self._request is not None and self._facts is not None:
                self._router.refused(self._request, self._facts, exc, self._holds)
        self.stage = Stage.DONE
        return [*wake, *self._release(), Refuse(exc, self.style)]

    # -- holds -----------------------------------------------------------------------------

    def _hold(self, kind: str, key: str, timeout: float,
              then: Callable[[bool], list[Command]], due: float | None = None) -> list[Command]:
        now = self._timer()
        self._waiting = _Waiting(kind, key, now, now + timeout, then)
        return [Hold(kind, key, timeout, due)]

    def _on_woken(self, event: Woken) -> list[Command]:
        waiting = self._waiting
        if waiting is None or waiting.kind != event.kind:
            return []
        self._waiting = None
        now = self._timer()
        self._holds.append(Held(waiting.kind, waiting.since, now))
        return waiting.then(event.late or now >= waiting.deadline)

    # -- large bodies ----------------------------------------------------------------------

    def _gate(self, size: int, then: Callable[[], list[Command]]) -> list[Command]:
        """``then()`` once a body of ``size`` is past the large-body gate: at once, after a
        wait in its tenant's line (a hold), or never (429)."""
        bodies, inbound = self._bodies, self._inbound
        if bodies is None or inbound is None or self._slot is not None or not bodies.large(
                size):
            return then()
        tenant = inbound.tenant
        admission = bodies.enter(tenant, size)
        if admission.now:
            self._slot = _Slot(tenant, taken=True)
            return then()
        if admission.refused or admission.ticket is None:
            raise self._busy(admission.retry_after)
        slot = self._slot = _Slot(tenant, admission.ticket)
        deadline = self._timer() + bodies.wait_seconds

        def woken(late: bool) -> list[Command]:
            assert slot.ticket is not None
            if bodies.take(tenant, slot.ticket):
                slot.ticket, slot.taken = None, True
                return then()
            left = deadline - self._timer()
            if late or left <= 0:
                head = bodies.cancel(tenant, slot.ticket)
                self._slot = None
                self.stage = Stage.DONE
                wake = [Wake("large_body", head)] if head else []
                return [*wake, Refuse(self._busy(1), self.style)]
            return self._hold("large_body", slot.ticket, left, woken)

        return self._hold("large_body", admission.ticket, bodies.wait_seconds, woken,
                          due=admission.due or None)

    def _busy(self, retry_after: int) -> TenantBusy:
        self._router.metrics.errors.labels(TenantBusy.code).inc()
        return TenantBusy(
            "this credential is sending more large request bodies than the router takes from "
            "one caller; retry shortly", retry_after=retry_after)

    def _release(self) -> list[Command]:
        """Give the large-body slot back (or leave the line); wake who heads it now."""
        slot, bodies, self._slot = self._slot, self._bodies, None
        if slot is None or bodies is None:
            return []
        if slot.taken:
            head = bodies.leave(slot.tenant)
        else:
            assert slot.ticket is not None
            head = bodies.cancel(slot.tenant, slot.ticket)
        return [Wake("large_body", head)] if head else []

    # -- the answer ------------------------------------------------------------------------

    def _on_response_headers(self, event: ResponseHeaders) -> list[Command]:
        """The upstream answered (or Envoy did, e.g. no healthy upstream): the turn is
        committed for a 2xx, and a JSON answer is read as it passes (full duplex: every
        answer's chunks pass this stream). Its commit waits for its body only when the answer
        may carry ids (they are claimed in the same write); every body is read, for its usage
        and finish reason: one message more, the answer buffered in Envoy meanwhile."""
        routed = self._routed
        if routed is None:
            return [Continue(Phase.RESPONSE_HEADERS)]
        inbound = self._inbound
        assert inbound is not None
        router = self._router
        self._status = event.status
        commits: list[Write] = list(router.answered(routed, event.status, event.served))
        reply = Continue(Phase.RESPONSE_HEADERS, routed=routed)
        if not commits:
            return [reply]  # a failure has nothing to commit, nor to read
        turn = commits[0].turn if isinstance(commits[0], Commit) else routed.turn
        duplex = inbound.duplex_response
        if event.streamed:
            if duplex:  # this stream sees the chunks itself, as the observe filter would
                self._answer = _Answer(turn, ResponseObserver(routed.api, streaming=True))
            # Else the observe stream reads the body, and Envoy does not wait for its claims:
            # the commit, in the store before the client has a byte, names this turn's model
            # and worker, which a continuation whose ids are not claimed yet is locked to.
            return [Apply(tuple(commits), wait=routed.reads_answer), reply]
        if event.end:
            done = router.finished(turn, ResponseSummary())
            return [Apply((*commits, *done)), reply]
        held = duplex or routed.reads_answer
        self._answer = _Answer(turn, ResponseObserver(routed.api, streaming=False),
                               commits if held else [])
        read = Continue(Phase.RESPONSE_HEADERS, routed=routed, read_body=not duplex)
        return [read] if held else [Apply(tuple(commits)), read]

    def _on_response_body(self, event: ResponseBody) -> list[Command]:
        answer, inbound = self._answer, self._inbound
        duplex = inbound is not None and inbound.duplex_response
        if answer is None or answer.observer is None or answer.finished:
            return [self._pass_answer(event, duplex)]
        observer = answer.observer
        commands: list[Command] = []
        if not observer.streaming:
            observer.feed(event.chunk, end=event.end)
            if event.end:
                summary = observer.summary
                writes = [*answer.held, *self._router.finished(answer.turn, summary)]
                commands.append(Apply(tuple(writes), wait=bool(binding(summary))))
                answer.held = []
                answer.finished = True
                # Told now, before Envoy passes the body on: a client that looks its answer up
                # by x-replay-id at once finds what it carried (the stream's end comes later).
                self._router.observed(answer.turn, summary)
                answer.told = True
        else:
            commands = self._read_sse(answer, event, passing=True)
        return [*commands, self._pass_answer(event, duplex)]

    @staticmethod
    def _pass_answer(event: ResponseBody, duplex: bool) -> Command:
        return Chunk(Phase.RESPONSE_BODY, event.chunk, event.end) if duplex else Continue(
            Phase.RESPONSE_BODY)

    def _read_sse(self, answer: _Answer, event: ResponseBody, *, passing: bool) -> list[Command]:
        """An SSE chunk: ids claimed the moment they pass (the client may answer a tool call
        at once); the terminal event finishes the turn. ``passing``: the chunk goes on to the
        client only after this stream's reply, so a claim of a binding id is awaited."""
        observer = answer.observer
        assert observer is not None
        if answer.sse is None and event.chunk.strip():
            answer.sse = _is_event_stream(event.chunk)
        observer.feed(event.chunk, end=event.end)
        writes: list[Write] = []
        if not answer.sse:
            answer.finished = observer.done
            return []
        if not answer.begun:
            answer.begun = True
            self._router.first_token(answer.turn)
        summary = observer.summary
        fresh = [i for i in issued(summary) if i not in answer.claimed]
        claim = self._router.claim(answer.turn, fresh)
        if claim is not None:
            answer.claimed += fresh
            writes.append(claim)
        if observer.done:
            answer.finished = True
            writes += self._router.finished(answer.turn, summary, answer.claimed)
            self._router.observed(answer.turn, summary)
            answer.told = True
        if not writes:
            return []
        binds = not set(binding(summary)).isdisjoint(fresh)
        return [Apply(tuple(writes), wait=passing and binds)]

    # -- the observe stream ----------------------------------------------------------------

    def _on_observe(self, event: Observe) -> list[Command]:
        if event.turn is None or event.api is None:
            self.stage = Stage.DONE
            return [Done()]
        self.stage = Stage.OBSERVE
        self._observing = True
        self._answer = _Answer(event.turn, ResponseObserver(event.api, streaming=True))
        return []

    def _observed_chunk(self, event: ResponseBody) -> list[Command]:
        answer = self._answer
        assert answer is not None
        if answer.finished:
            return []
        commands = self._read_sse(answer, event, passing=False)
        if answer.finished:
            self.stage = Stage.DONE
            commands.append(Done())
        return commands

    # -- the end ---------------------------------------------------------------------------

    def _on_closed(self) -> list[Command]:
        """The stream ended. A routing stream ends its turn (however far it got: answered,
        failed after routing, or abandoned by the client); an observe stream that never saw
        its terminal event finishes the turn with what it did see."""
        commands = self._release()
        if self._waiting is not None and self._waiting.kind == "large_body":
            self._waiting = None
        if self._ticket is not None:  # the client left the queue
            commands += [Wake("queue", t) for t in self._router.cancel(*self._ticket)]
            self._ticket = None
        answer = self._answer
        if self._observing:
            if answer is not None and not answer.finished and answer.sse:
                answer.finished = True
                assert answer.observer is not None
                seen = answer.observer.summary
                commands.append(Apply(tuple(self._router.finished(
                    answer.turn, seen, answer.claimed))))
                self._router.observed(answer.turn, seen)
            self.stage = Stage.DONE
            return commands
        routed = self._routed
        if routed is None or self._ended:
            return commands
        self._ended = True
        summary = answer.observer.summary if answer is not None and answer.observer else None
        writes: list[Write] = []
        if answer is not None and answer.held:
            writes += answer.held  # the body never came (the client hung up): still accepted
            answer.held = []
        elif answer is not None and answer.observer is not None and not answer.finished and (
                answer.sse):
            # A streamed answer cut short: finish the turn with what passed.
            answer.finished = True
            writes += self._router.finished(answer.turn, answer.observer.summary,
                                            answer.claimed)
        writes += self._router.ended(routed, summary, aborted=self._status == 0,
                                     told=answer is not None and answer.told)
        if routed.arrival is not None:  # a place in its pool is free: the queue's next goes
            commands += [Wake("queue", t) for t in self._router.dispatch(routed.model)]
        self.stage = Stage.DONE
        return [*commands, Apply(tuple(writes))] if writes else commands


def _is_event_stream(chunk: bytes) -> bool:
    """An SSE body begins with a field (``data:``, ``event:``…) or a comment, never ``{``: the
    observer of a streamed request also sees a failed upstream's JSON error body."""
    return not chunk.lstrip().startswith((b"{", b"["))
