"""One ext_proc stream, message by message: the only code that speaks Envoy's protobuf types.

Two filters in Envoy talk to this service (see ``envoy/envoy.yaml``):

* ``saar`` (one stream per request): the request headers; the buffered body — its facts are
  loaded from the state layer, the core routes, and the reply sets the cluster header, rewrites
  the model, clears the route cache and emits the ``saar`` metadata; the response headers (the
  upstream answered: a 2xx commits the turn, awaited, before the client sees a byte); for a
  JSON answer, its buffered body (switched on per request), whose ids are claimed before the
  client can act on them. When the stream closes, the turn's bookkeeping ends.
* ``saar-observe`` (``observability_mode``: never waits), enabled by route only for streamed
  (SSE) answers. It may reach another replica: the turn it completes travels in the ``saar``
  metadata Envoy forwards. Ids are claimed the moment they pass; the terminal event finishes
  the turn — and commits it, if it got there before the routing stream's response headers.

A gateway's endpoint picker filter (the Endpoint Picker Protocol) sends bodies in
``FULL_DUPLEX_STREAMED`` mode instead, told by the first message's ``protocol_config``: the
request body's chunks are gathered until its end, the request is routed, and only then are the
headers answered (the pick, the model header, the route cache cleared) and the body sent back as
streamed chunks; the answer's chunks are passed back the moment they arrive, read on the way as
the observe filter reads them — the only wait is for the ids a chunk carries to be claimed
before the client can act on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from envoy.config.core.v3 import base_pb2 as core
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from ..apis import ResponseObserver
from ..core.paths import classify, error_style
from ..core.refusals import record_refusal
from ..core.router import Held, Request, Routed, Router, issued, outcome_of
from ..errors import (
    BodyTooLarge,
    LockedModelDown,
    MalformedRequest,
    PathNotFound,
    RoutingError,
    SessionPaused,
    TenantBusy,
    shown,
)
from ..state.layer import StateLayer
from ..state.records import Commit, Turn
from ..state.store import Facts, Write
from ..types import Action, Api, ResponseSummary
from .contract import (
    API_KEY,
    ATTRIBUTES_NAMESPACE,
    DESTINATION_HEADER,
    DIAGNOSTIC_PREFIX,
    ERROR_KEY,
    LB_NAMESPACE,
    METADATA_NAMESPACE,
    MODEL_RETRIES,
    OBSERVE_HEADER,
    PICK_HEADER,
    SERVED_KEY,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
    TURN_KEY,
    UPSTREAM_ATTRIBUTE,
)
from .gate import LargeBodies, ParseThread

log = logging.getLogger(__name__)

_OVERWRITE = core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_PASS_THROUGH = pm.ProcessingMode(
    request_body_mode=pm.ProcessingMode.NONE, response_header_mode=pm.ProcessingMode.SKIP
)
_BUFFER_RESPONSE = pm.ProcessingMode(response_body_mode=pm.ProcessingMode.BUFFERED)
_DUPLEX = pm.ProcessingMode.FULL_DUPLEX_STREAMED
CHUNK_BYTES = 62_000
"""Streamed body chunks sent back stay under the 64 KiB some proxies allow per message."""
HOLD_POLL_SECONDS = 0.05
SERVED_APIS = "POST /v1/chat/completions, /v1/responses and /v1/messages"

Reply: TypeAlias = ep.ProcessingResponse | Sequence[ep.ProcessingResponse]
"""What one message is answered with: one response, or (full duplex) several in order."""


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """How this process sits in the gateway, read once from the config."""

    model_header: str | None = "x-gateway-model-name"
    """Set to the routed model (HTTPRoute rules match it); the client's copy is removed."""
    pool: str | None = None
    """The model whose pool this process picks endpoints for (``--pool-name``)."""


def _header(key: str, value: str) -> core.HeaderValueOption:
    # Envoy reads ``raw_value``; a value in ``value`` arrives empty.
    return core.HeaderValueOption(
        header=core.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE
    )


def _headers_dict(message: ep.HttpHeaders) -> dict[str, str]:
    return {
        h.key: (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
        for h in message.headers.headers
    }


def _continue_headers(remove: list[str]) -> ep.CommonResponse:
    common = ep.CommonResponse(status=ep.CommonResponse.CONTINUE)
    if remove:
        common.header_mutation.remove_headers.extend(remove)
        common.clear_route_cache = True
    return common


def error_response(error: RoutingError, style: str = "openai") -> ep.ProcessingResponse:
    """An immediate response in the client's format (``openai`` or ``anthropic``). It carries
    ``saar.error`` metadata, so Envoy's local reply mappers leave it as it is, and the replay id
    of the decision it answers, when one was recorded."""
    metadata = struct_pb2.Struct()
    values = {ERROR_KEY: error.code}
    if error.replay_id is not None:
        values["replay_id"] = error.replay_id
    _set_strings(metadata, METADATA_NAMESPACE, values)
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),
            headers=ep.HeaderMutation(
                set_headers=[_header(k, v) for k, v in error.headers().items()]
            ),
            body=error.body(style),
            details=f"saar_{error.code}",
        ),
        dynamic_metadata=metadata,
    )


def routed_response(
    routed: Routed, cluster_header: str, model_header: str | None = None
) -> ep.ProcessingResponse:
    """The reply to a buffered body: the route, the pick and the rewritten body in one."""
    common, metadata = _routing(routed, cluster_header, model_header)
    if routed.body is not None:
        common.body_mutation.body = routed.body
        # Envoy answers 500 when content-length disagrees with a mutated body.
        common.header_mutation.set_headers.append(
            _header("content-length", str(len(routed.body))))
    return ep.ProcessingResponse(
        request_body=ep.BodyResponse(response=common), dynamic_metadata=metadata
    )


def routed_duplex(
    routed: Routed, body: bytes, cluster_header: str, model_header: str | None,
    *, trailers: bool = False,
) -> list[ep.ProcessingResponse]:
    """Full duplex: the headers reply carries the route and the pick (a header mutation on a
    body reply would be ignored), then the body (rewritten or as it came) goes back in chunks.
    Envoy drops content-length itself in this mode."""
    common, metadata = _routing(routed, cluster_header, model_header)
    replies = [ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common),
                                     dynamic_metadata=metadata)]
    replies += streamed_body(
        "request_body", routed.body if routed.body is not None else body, end=not trailers)
    if trailers:
        replies.append(ep.ProcessingResponse(request_trailers=ep.TrailersResponse()))
    return replies


def streamed_body(kind: str, body: bytes, *, end: bool) -> list[ep.ProcessingResponse]:
    """``body`` as streamed body responses of at most ``CHUNK_BYTES`` each."""
    pieces = [body[i:i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)] or [b""]
    return [
        ep.ProcessingResponse(**{kind: ep.BodyResponse(response=ep.CommonResponse(
            body_mutation=ep.BodyMutation(streamed_response=ep.StreamedBodyResponse(
                body=piece, end_of_stream=end and i == len(pieces) - 1)))),
        })
        for i, piece in enumerate(pieces)
    ]


def _routing(
    routed: Routed, cluster_header: str, model_header: str | None
) -> tuple[ep.CommonResponse, struct_pb2.Struct]:
    common = ep.CommonResponse(status=ep.CommonResponse.CONTINUE, clear_route_cache=True)
    headers = [_header(cluster_header, routed.cluster)]
    if model_header:
        headers.append(_header(model_header, routed.model))
    metadata = struct_pb2.Struct()
    values = _metadata(routed)
    if routed.stream:
        headers.append(_header(OBSERVE_HEADER, "1"))
        values[TURN_KEY] = routed.turn.to_wire()
        values[API_KEY] = routed.api.value
    _set_strings(metadata, METADATA_NAMESPACE, values)
    if routed.workers:
        # The Gateway API Inference Extension's contract: the pick in the header, the pick and
        # its fallbacks (for Envoy's retries) in envoy.lb metadata. Each attempt takes the next
        # host of the list: a hard lock's retries stay with the worker that issued its state.
        workers = routed.workers
        if routed.diagnostics.get("x-saar-action") == Action.LOCKED_KEEP.value:
            workers = (workers[0],) * (MODEL_RETRIES + 1)
        headers.append(_header(DESTINATION_HEADER, routed.workers[0]))
        _set_strings(metadata, LB_NAMESPACE, {DESTINATION_HEADER: ",".join(workers)})
    common.header_mutation.set_headers.extend(headers)
    return common, metadata


def _metadata(routed: Routed) -> dict[str, str]:
    """Diagnostics as metadata keys: ``x-saar-session-phase`` → ``session_phase``."""
    out = {}
    for name, value in routed.diagnostics.items():
        key = name.removeprefix("x-saar-").removeprefix("x-").replace("-", "_")
        out[key] = value
    return out


def _set_strings(metadata: struct_pb2.Struct, namespace: str, values: dict[str, str]) -> None:
    """``metadata[namespace] = values`` without ``Struct.update``'s generic walk (hot path)."""
    fields = metadata.fields[namespace].struct_value.fields
    for key, value in values.items():
        fields[key].string_value = value


@dataclass(frozen=True, slots=True)
class Hold:
    """Answer this message later. The servicer tells Envoy to wait up to ``timeout`` longer
    (``override_message_timeout``), awaits ``wait()`` (True: what was waited for happened),
    then answers with ``stream.resume(hold, ready)``. Nothing sent upstream is touched: only
    this request, not yet forwarded, waits.

    Kinds: ``paused`` (admission paused the session), ``locked`` (a hard lock's model is taken
    out by model health), ``large_body`` (the tenant's large-body slots are busy)."""

    kind: str
    timeout: float
    wait: Callable[[], Awaitable[bool]]
    then: Callable[[bool], Awaitable[Reply]]
    since: float = field(default_factory=time.perf_counter)


def _upstream(message: ep.ProcessingRequest) -> str | None:
    """The worker Envoy sent the request to: what the proxy reports as served (the Endpoint
    Picker Protocol's ``envoy.lb`` metadata), else the ``upstream.address`` attribute."""
    lb = message.metadata_context.filter_metadata.get(LB_NAMESPACE)
    if lb is not None and SERVED_KEY in lb.fields:
        value = lb.fields[SERVED_KEY]
        served = value.string_value.split(",")[0].strip() if value.HasField(
            "string_value") else ""
        if served:
            return served
    attributes = message.attributes.get(ATTRIBUTES_NAMESPACE)
    if attributes is None or UPSTREAM_ATTRIBUTE not in attributes.fields:
        return None
    return attributes.fields[UPSTREAM_ATTRIBUTE].string_value or None


def _subset(message: ep.ProcessingRequest) -> frozenset[str] | None:
    """The proxy's subset hint (a list or a comma-separated string), if it sent one."""
    hint = message.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return None
    value = hint.fields[SUBSET_KEY]
    if value.HasField("list_value"):
        items = [v.string_value for v in value.list_value.values]
    else:
        items = value.string_value.split(",")
    return frozenset(i.strip() for i in items if i.strip())


def _observed_turn(message: ep.ProcessingRequest) -> tuple[Turn, Api] | None:
    """The turn an observe stream completes, from the metadata the routing stream emitted."""
    fields = message.metadata_context.filter_metadata.get(METADATA_NAMESPACE)
    if fields is None or TURN_KEY not in fields.fields or API_KEY not in fields.fields:
        return None
    try:
        return (Turn.from_wire(fields.fields[TURN_KEY].string_value),
                Api(fields.fields[API_KEY].string_value))
    except ValueError:
        return None


def _is_event_stream(chunk: bytes) -> bool:
    """An SSE body begins with a field (``data:``, ``event:``…) or a comment, never ``{``: the
    observer of a streamed request also sees a failed upstream's JSON error body."""
    return not chunk.lstrip().startswith((b"{", b"["))


class ExtProcStream:
    """One ext_proc stream (one HTTP request seen by one filter), driven message by message."""

    def __init__(
        self, router: Router, state: StateLayer, options: StreamOptions | None = None, *,
        bodies: LargeBodies | None = None, parser: ParseThread | None = None,
    ) -> None:
        """``bodies`` bounds each tenant's large bodies in flight; ``parser`` takes the parse
        of large bodies off the event loop (both off without them: tests, tools)."""
        self._router = router
        self._state = state
        self._options = options or StreamOptions()
        self._bodies = bodies
        self._parser = parser
        self._slot: str | None = None
        """The tenant whose large-body slot this stream holds."""
        self._style = "openai"
        self._rewrite: str | None = None
        """The canonical ``:path`` of a variant of an API's path."""
        self._request: Request | None = None
        self._refused: tuple[Request, Facts] | None = None
        self._held_locked = False
        self._holds: list[Held] = []
        self._headers: dict[str, str] = {}
        self._subset: frozenset[str] | None = None
        self._body: bytes = b""
        self._api: Api | None = None
        self._routed: Routed | None = None
        self._status = 0
        self._served: str | None = None
        self._held: list[Commit] = []
        """A JSON answer's commit, written together with what its body carries."""
        self._observer: ResponseObserver | None = None
        self._claimed: list[str] = []
        self._turn: Turn | None = None
        self._sse: bool | None = None
        self._finished = False
        self._observing = False
        self._ended = False
        self._duplex_request = False
        self._duplex_response = False
        self._chunks: list[bytes] = []
        self._size = 0
        self._waiting = False
        """Full duplex: the request headers are unanswered until the body has been seen."""
        self._trailers = False
        self._remove: list[str] = []
        self._prefetch: asyncio.Task[Facts] | None = None
        """The session's facts, loaded while Envoy still buffers the body."""

    @property
    def api(self) -> Api | None:
        return self._api

    @property
    def style(self) -> str:
        """The error format of this request's client (``openai`` or ``anthropic``)."""
        return self._style

    @property
    def duplex(self) -> bool:
        """The request body streams in full duplex (an error reply is all that is left)."""
        return self._duplex_request

    async def handle(self, request: ep.ProcessingRequest) -> Reply | Hold | None:
        kind = request.WhichOneof("request")
        if request.observability_mode or self._observing:
            # Envoy leaves observability_mode unset on an observe stream's last message.
            self._observing = True
            self._observe(request)
            return None
        if request.HasField("protocol_config"):
            config = request.protocol_config
            self._duplex_request = config.request_body_mode == _DUPLEX
            self._duplex_response = config.response_body_mode == _DUPLEX
        try:
            if kind == "request_headers":
                self._subset = _subset(request)
                return self._on_request_headers(request.request_headers)
            if kind == "request_body":
                if self._duplex_request:
                    return await self._on_streamed_request_body(request.request_body)
                return await self._on_request_body(request.request_body)
            if kind == "request_trailers" and self._waiting:
                self._trailers = True
                return await self._gated(self._size, self._route_whole)
            if kind == "response_headers":
                return await self._on_response_headers(request)
            if kind == "response_body":
                if self._duplex_response:
                    return await self._on_streamed_response_body(request.response_body)
                return await self._on_response_body(request.response_body)
        except RoutingError as exc:
            return self._failed(exc, admit_paused=False)
        return _passthrough(kind)

    async def resume(self, hold: Hold, ready: bool) -> Reply | Hold:
        """The answer a hold was waiting to give (``ready``: what it waited for happened), or
        another hold (a resumed session whose locked model is down)."""
        self._holds.append(Held(hold.kind, hold.since, time.perf_counter()))
        try:
            return await hold.then(ready)
        except RoutingError as exc:
            return self._failed(exc, admit_paused=hold.kind == "paused" and not ready)

    def _failed(self, exc: RoutingError, *, admit_paused: bool) -> Reply | Hold:
        """A routing error: hold the request where a hold can help, else answer it."""
        if isinstance(exc, SessionPaused):
            admission = self._router.config.scheduling.admission
            if admission.on_paused == "hold":
                paused = self._router.pools.admission.is_paused
                key = exc.session_key
                return Hold("paused", admission.hold_timeout_seconds,
                            lambda: _until(lambda: not paused(key),
                                           admission.hold_timeout_seconds),
                            lambda ready: self._route_again(admit_paused=not ready))
        if isinstance(exc, LockedModelDown):
            seconds = self._router.config.health.locked_hold_seconds
            if not self._held_locked and seconds > 0:
                self._held_locked = True
                available, model = self._router.health.available, exc.model
                return Hold("locked", seconds, lambda: _until(lambda: available(model), seconds),
                            lambda ready: self._route_again(admit_paused=admit_paused))
            if self._refused is not None and exc.replay_id is None:
                record_refusal(self._router, *self._refused, exc)
        return error_response(exc, self._style)

    async def _route_again(self, *, admit_paused: bool) -> Reply:
        if self._waiting:
            return await self._route_gathered(admit_paused=admit_paused)
        return await self._route(admit_paused=admit_paused)

    @property
    def observed(self) -> bool:
        """An observe stream with nothing left to learn: ending it now frees Envoy's stream
        (otherwise held for ``deferred_close_timeout`` after the request)."""
        return self._observing and self._finished

    def close(self) -> None:
        """The stream ended. A routing stream ends its turn (however far it got: answered,
        failed after routing, or abandoned by the client); an observe stream that never saw
        its terminal event finishes the turn with what it did see."""
        if self._prefetch is not None:
            self._prefetch.cancel()
        self._release()
        if self._observing:
            if not self._finished:
                self._finish_observed()
            return
        if self._routed is None or self._ended:
            return
        self._ended = True
        summary = self._observer.summary if self._observer is not None else None
        outcome = outcome_of(None, None, summary)
        if self._status == 0:
            outcome["aborted"] = True
        if self._held:
            # The body never came (the client hung up): the upstream did accept the turn.
            self._state.send(self._held)
            self._held = []
        elif self._duplex_response and self._observer is not None and not self._finished:
            # A streamed answer cut short: finish the turn with what passed.
            self._finish_observed()
        self._state.send(self._router.ended(self._routed, outcome, summary))

    # -- request path ----------------------------------------------------------------------

    def _spoofed(self) -> list[str]:
        """Client headers that Envoy or we would trust for routing: always removed."""
        cluster = self._router.config.routing.cluster_header.lower()
        model = (self._options.model_header or "").lower()
        names = [h for h in self._headers
                 if h in (DESTINATION_HEADER, cluster, model) or h.startswith(DIAGNOSTIC_PREFIX)]
        for name in names:
            self._router.metrics.stripped_headers.labels(
                name if name in (DESTINATION_HEADER, cluster, model, OBSERVE_HEADER) else "other"
            ).inc()
        return names

    def _on_request_headers(
        self, message: ep.HttpHeaders
    ) -> ep.ProcessingResponse | Hold | None:
        self._headers = _headers_dict(message)
        remove = self._spoofed()
        method, path = self._headers.get(":method", ""), self._headers.get(":path", "")
        found = classify(method, path)
        self._api = found.api
        self._style = self._api.error_style if self._api else error_style(path, self._headers)
        if found.unknown:
            self._router.metrics.errors.labels(PathNotFound.code).inc()
            raise PathNotFound(f"Invalid URL ({shown(method, 16)} {shown(path)}): this router "
                               f"serves {SERVED_APIS}")
        if self._api is None:
            reply = ep.ProcessingResponse(
                request_headers=ep.HeadersResponse(response=_continue_headers(remove))
            )
            if not self._duplex_request:
                reply.mode_override.CopyFrom(_PASS_THROUGH)
            return reply
        if message.end_of_stream:
            raise MalformedRequest("request has no body; a JSON body with a model is required")
        self._rewrite = found.path
        query = self._router.prefetch(self._headers)
        if query is not None:
            self._prefetch = self._state.prefetch(query)
        if self._duplex_request:
            # Answered once the body has been seen: the pick rides on this reply. The client's
            # routing headers are dropped then by overwriting or removing them.
            self._waiting = True
            self._remove = remove
            return None
        common = _continue_headers(remove)
        if found.path is not None:
            common.header_mutation.set_headers.append(_header(":path", found.path))
            common.clear_route_cache = True
        reply = ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common))
        length = self._headers.get("content-length", "")
        if length.isdigit():
            return self._admit(int(length), lambda: _ready(reply)) or reply
        return reply

    async def _on_request_body(self, message: ep.HttpBody) -> ep.ProcessingResponse | Hold:
        if self._api is None:
            return _passthrough("request_body")
        self._body = message.body
        return await self._gated(len(self._body), lambda: self._route(admit_paused=False))

    # -- large bodies ----------------------------------------------------------------------

    async def _gated(self, size: int, go: Callable[[], Awaitable[Reply]]) -> Reply | Hold:
        """``go()`` once a body of ``size`` is past the large-body gate; a hold for it when
        the body must wait its turn."""
        return self._admit(size, go) or await go()

    async def _route_whole(self) -> Reply:
        """Full duplex, the body whole (its end, or trailers): routed."""
        return await self._route_gathered(admit_paused=False)

    def _admit(self, size: int, go: Callable[[], Awaitable[Reply]]) -> Hold | None:
        """A large body needs its tenant's budget and a slot: now (None), after a wait (a
        hold whose answer is ``go()``), or not at all (429)."""
        bodies = self._bodies
        if bodies is None or self._slot is not None or not bodies.large(size):
            return None
        tenant = self._router.identity.tenant(self._headers)
        admission = bodies.enter(tenant, size)
        if admission.now:
            self._slot = tenant
            return None
        if admission.refused:
            raise self._busy(admission.retry_after)

        async def wait() -> bool:
            if await bodies.wait(tenant, admission.delay):
                self._slot = tenant
                return True
            return False

        async def then(ready: bool) -> Reply:
            if not ready:
                raise self._busy(1)
            return await go()

        return Hold("large_body", bodies.wait_seconds, wait, then)

    def _busy(self, retry_after: int) -> TenantBusy:
        self._router.metrics.errors.labels(TenantBusy.code).inc()
        return TenantBusy(
            "this credential is sending more large request bodies than the router takes from "
            "one caller; retry shortly", retry_after=retry_after)

    def _release(self) -> None:
        if self._slot is not None and self._bodies is not None:
            self._bodies.leave(self._slot)
        self._slot = None

    async def _on_streamed_request_body(self, message: ep.HttpBody) -> Reply | Hold | None:
        """Full duplex: gather the chunks until the body ends, then route."""
        if not self._waiting:
            # Not an LLM request (or already answered): pass each chunk straight back.
            return streamed_body("request_body", message.body, end=message.end_of_stream)
        self._size += len(message.body)
        limit = self._router.config.limits.max_body_bytes
        if self._size > limit:
            self._waiting = False
            self._chunks = []
            self._router.metrics.errors.labels(BodyTooLarge.code).inc()
            raise BodyTooLarge(f"request body is over {limit} bytes")
        self._chunks.append(message.body)
        if not message.end_of_stream:
            return None
        return await self._gated(self._size, self._route_whole)

    async def _route_gathered(self, *, admit_paused: bool) -> list[ep.ProcessingResponse]:
        self._body = b"".join(self._chunks)
        self._chunks = [self._body]
        routed = await self._decide(admit_paused=admit_paused)
        self._waiting = False
        self._chunks = []
        replies = routed_duplex(routed, self._body, self._router.config.routing.cluster_header,
                                self._options.model_header, trailers=self._trailers)
        mutation = replies[0].request_headers.response.header_mutation
        if self._rewrite is not None:
            mutation.set_headers.append(_header(":path", self._rewrite))
        # The client's routing headers the reply does not overwrite are removed.
        mine = {h.header.key for h in mutation.set_headers}
        replies[0].request_headers.response.header_mutation.remove_headers.extend(
            h for h in self._remove if h not in mine)
        return replies

    async def _route(self, *, admit_paused: bool) -> ep.ProcessingResponse:
        routed = await self._decide(admit_paused=admit_paused)
        return routed_response(routed, self._router.config.routing.cluster_header,
                               self._options.model_header)

    async def _decide(self, *, admit_paused: bool) -> Routed:
        try:
            request = self._request or await self._read()
        finally:
            self._release()  # the large body is parsed (or refused): its slot is free
        self._request = request
        facts = None
        if self._prefetch is not None:
            prefetched, self._prefetch = self._prefetch, None
            with contextlib.suppress(Exception):
                facts = await prefetched
            if facts is not None and not self._router.covers(request, facts):
                facts = None
        if facts is None:
            facts = await self._state.load(request.query)
        self._refused = (request, facts)
        routed = self._router.route(request, facts, subset=self._subset,
                                    admit_paused=admit_paused, holds=self._holds)
        self._routed = routed
        return routed

    async def _read(self) -> Request:
        """``Router.read``, on the parse thread for a large body (it is pure)."""
        assert self._api is not None
        api, headers, body = self._api, self._headers, self._body
        threshold = self._router.config.limits.parse_thread_bytes
        if self._parser is not None and threshold and len(body) >= threshold:
            return await self._parser.run(lambda: self._router.read(api, headers, body))
        return self._router.read(api, headers, body)

    # -- response path ---------------------------------------------------------------------

    async def _on_response_headers(self, request: ep.ProcessingRequest) -> ep.ProcessingResponse:
        """The upstream answered (or Envoy did, e.g. no healthy upstream): commit a 2xx before
        the client sees it; read a JSON answer's body in one more message on this stream (or,
        full duplex, as its chunks pass)."""
        reply = _passthrough("response_headers")
        routed = self._routed
        if routed is None:
            return reply
        reply.response_headers.response.header_mutation.set_headers.extend(
            self._diagnostic_headers(routed))
        message = request.response_headers
        headers = _headers_dict(message)
        self._status = int(headers.get(":status", "0") or 0)
        self._served = _upstream(request)
        writes = self._router.answered(routed, self._status, self._served)
        turn = writes[0].turn if writes else routed.turn  # with the worker Envoy used
        streamed = headers.get("content-type", "").startswith("text/event-stream")
        if not writes or (streamed and not self._duplex_response):
            # A stream's body goes to the observe filter, unheld; a failure has nothing to read.
            await self._state.apply(writes)
            return reply
        self._observer = ResponseObserver(routed.api, streaming=streamed)
        self._turn = turn
        if streamed:
            # Full duplex: this stream sees the chunks itself, as the observe filter would.
            await self._state.apply(writes)
            self._sse = None
            return reply
        if message.end_of_stream:
            await self._state.apply([*writes, *self._router.finished(turn, self._observer.summary)])
            return reply
        self._held = writes
        if not self._duplex_response:
            reply.mode_override.CopyFrom(_BUFFER_RESPONSE)
        return reply

    def _diagnostic_headers(self, routed: Routed) -> list[core.HeaderValueOption]:
        """The diagnostics as response headers too, for gateways that do not render the
        ``saar`` metadata (a local Envoy renders the same values from it)."""
        out = [_header(name, value) for name, value in routed.diagnostics.items()]
        if routed.workers:
            out.append(_header(PICK_HEADER, routed.workers[0]))
        return out

    async def _on_response_body(self, message: ep.HttpBody) -> ep.ProcessingResponse:
        if self._observer is not None and self._turn is not None and self._held:
            self._observer.feed(message.body, end=True)
            writes = [*self._held, *self._router.finished(self._turn, self._observer.summary)]
            self._held = []
            await self._state.apply(writes)
        return _passthrough("response_body")

    async def _on_streamed_response_body(self, message: ep.HttpBody) -> Reply:
        """Full duplex: every chunk goes straight back. Ids it carries are claimed first (the
        client may answer a tool call the moment it reads it); a JSON answer's commit and ids
        are written before its last chunk is let through."""
        observer, turn = self._observer, self._turn
        if observer is not None and turn is not None and not self._finished:
            body, end = message.body, message.end_of_stream
            writes: list[Write] = []
            if observer.streaming:
                if self._sse is None and body.strip():
                    self._sse = _is_event_stream(body)
                observer.feed(body, end=end)
                if self._sse:
                    fresh = [i for i in issued(observer.summary) if i not in self._claimed]
                    claim = self._router.claim(turn, fresh)
                    if claim is not None:
                        self._claimed += fresh
                        writes.append(claim)
                    if observer.done:
                        writes += self._router.finished(turn, observer.summary, self._claimed)
                if observer.done:
                    self._finished = True
            else:
                observer.feed(body, end=end)
                if end:
                    writes = [*self._held, *self._router.finished(turn, observer.summary)]
                    self._held = []
                    self._finished = True
            if writes:
                await self._state.apply(writes)
        return streamed_body("response_body", message.body, end=message.end_of_stream)

    # -- observe stream ----------------------------------------------------------------------

    def _observe(self, request: ep.ProcessingRequest) -> None:
        """An observe stream: the streamed (SSE) body of a routed request, chunk by chunk."""
        if self._finished:
            return
        if self._observer is None:
            found = _observed_turn(request)
            if found is None:
                self._finished = True
                return
            self._turn, api = found
            self._observer = ResponseObserver(api, streaming=True)
        if request.WhichOneof("request") != "response_body":
            return
        body = request.response_body
        if self._sse is None and body.body.strip():
            self._sse = _is_event_stream(body.body)
        self._observer.feed(body.body, end=body.end_of_stream)
        self._claim_new()
        if self._observer.done:
            self._finish_observed()

    def _claim_new(self) -> None:
        """Claim ids as soon as they pass: the client may answer a tool call at once."""
        assert self._observer is not None and self._turn is not None
        if not self._sse:
            return
        fresh = [i for i in issued(self._observer.summary) if i not in self._claimed]
        claim = self._router.claim(self._turn, fresh)
        if claim is not None:
            self._claimed += fresh
            self._state.send([claim])

    def _finish_observed(self) -> None:
        self._finished = True
        if self._observer is None or self._turn is None or not self._sse:
            return
        summary: ResponseSummary = self._observer.summary
        self._state.send(self._router.finished(self._turn, summary, self._claimed))
        self._router.replay.complete(self._turn.replay_id, outcome_of(None, None, summary))


async def _until(ready: Callable[[], bool], timeout: float) -> bool:
    """Poll ``ready`` until it holds (True) or ``timeout`` seconds have passed (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ready():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(HOLD_POLL_SECONDS)
    return True


async def _ready(reply: Reply) -> Reply:
    return reply


def _passthrough(kind: str | None) -> ep.ProcessingResponse:
    """Continue any phase we did not ask for (trailers, or a body after a mode override)."""
    if kind in ("request_headers", "response_headers"):
        return ep.ProcessingResponse(**{kind: ep.HeadersResponse()})
    if kind in ("request_trailers", "response_trailers"):
        return ep.ProcessingResponse(**{kind: ep.TrailersResponse()})
    if kind in ("request_body", "response_body"):
        return ep.ProcessingResponse(**{kind: ep.BodyResponse()})
    return ep.ProcessingResponse()
