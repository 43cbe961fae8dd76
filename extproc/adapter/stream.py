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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2 as core
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from ..apis import ResponseObserver
from ..core.router import Request, Routed, Router, api_for, issued, outcome_of
from ..errors import MalformedRequest, RoutingError, SessionPaused
from ..state.layer import StateLayer
from ..state.records import Commit, Turn
from ..types import Api, ResponseSummary
from .contract import (
    API_KEY,
    ATTRIBUTES_NAMESPACE,
    DESTINATION_HEADER,
    DIAGNOSTIC_PREFIX,
    LB_NAMESPACE,
    METADATA_NAMESPACE,
    OBSERVE_HEADER,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
    TURN_KEY,
    UPSTREAM_ATTRIBUTE,
)

log = logging.getLogger(__name__)

_OVERWRITE = core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_PASS_THROUGH = pm.ProcessingMode(
    request_body_mode=pm.ProcessingMode.NONE, response_header_mode=pm.ProcessingMode.SKIP
)
_BUFFER_RESPONSE = pm.ProcessingMode(response_body_mode=pm.ProcessingMode.BUFFERED)


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


def error_response(error: RoutingError, api: Api | None) -> ep.ProcessingResponse:
    style = api.error_style if api else "openai"
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),
            headers=ep.HeaderMutation(
                set_headers=[_header(k, v) for k, v in error.headers().items()]
            ),
            body=error.body(style),
            details=f"saar_{error.code}",
        )
    )


def routed_response(routed: Routed, cluster_header: str) -> ep.ProcessingResponse:
    common = ep.CommonResponse(status=ep.CommonResponse.CONTINUE, clear_route_cache=True)
    headers = [_header(cluster_header, routed.cluster)]
    if routed.body is not None:
        common.body_mutation.body = routed.body
        # Envoy answers 500 when content-length disagrees with a mutated body.
        headers.append(_header("content-length", str(len(routed.body))))
    metadata = struct_pb2.Struct()
    values = _metadata(routed)
    if routed.stream:
        headers.append(_header(OBSERVE_HEADER, "1"))
        values[TURN_KEY] = routed.turn.to_wire()
        values[API_KEY] = routed.api.value
    _set_strings(metadata, METADATA_NAMESPACE, values)
    if routed.workers:
        # The Gateway API Inference Extension's contract: the pick in the header, the pick and
        # its fallbacks (for Envoy's retries) in envoy.lb metadata.
        headers.append(_header(DESTINATION_HEADER, routed.workers[0]))
        _set_strings(metadata, LB_NAMESPACE, {DESTINATION_HEADER: ",".join(routed.workers)})
    common.header_mutation.set_headers.extend(headers)
    return ep.ProcessingResponse(
        request_body=ep.BodyResponse(response=common), dynamic_metadata=metadata
    )


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
    """The request belongs to a session admission paused: the servicer waits, then resumes."""

    session_key: str
    timeout: float


def _upstream(message: ep.ProcessingRequest) -> str | None:
    """The worker Envoy sent the request to (the ``upstream.address`` response attribute)."""
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

    def __init__(self, router: Router, state: StateLayer) -> None:
        self._router = router
        self._state = state
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

    @property
    def api(self) -> Api | None:
        return self._api

    async def handle(self, request: ep.ProcessingRequest) -> ep.ProcessingResponse | Hold | None:
        kind = request.WhichOneof("request")
        if request.observability_mode or self._observing:
            # Envoy leaves observability_mode unset on an observe stream's last message.
            self._observing = True
            self._observe(request)
            return None
        try:
            if kind == "request_headers":
                self._subset = _subset(request)
                return self._on_request_headers(request.request_headers)
            if kind == "request_body":
                return await self._on_request_body(request.request_body)
            if kind == "response_headers":
                return await self._on_response_headers(request)
            if kind == "response_body":
                return await self._on_response_body(request.response_body)
        except SessionPaused as exc:
            admission = self._router.config.scheduling.admission
            if admission.on_paused == "hold":
                return Hold(exc.session_key, admission.hold_timeout_seconds)
            return error_response(exc, self._api)
        except RoutingError as exc:
            return error_response(exc, self._api)
        return _passthrough(kind)

    async def resume(self, *, admit_paused: bool) -> ep.ProcessingResponse:
        """Route the held body again: the session was resumed, or the hold timed out."""
        try:
            return await self._route(admit_paused=admit_paused)
        except RoutingError as exc:
            return error_response(exc, self._api)

    @property
    def observed(self) -> bool:
        """An observe stream with nothing left to learn: ending it now frees Envoy's stream
        (otherwise held for ``deferred_close_timeout`` after the request)."""
        return self._observing and self._finished

    def close(self) -> None:
        """The stream ended. A routing stream ends its turn (however far it got: answered,
        failed after routing, or abandoned by the client); an observe stream that never saw
        its terminal event finishes the turn with what it did see."""
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
        self._state.send(self._router.ended(self._routed, outcome, summary))

    # -- request path ----------------------------------------------------------------------

    def _spoofed(self) -> list[str]:
        """Client headers that Envoy or we would trust for routing: always removed."""
        cluster = self._router.config.routing.cluster_header.lower()
        names = [h for h in self._headers
                 if h in (DESTINATION_HEADER, cluster) or h.startswith(DIAGNOSTIC_PREFIX)]
        for name in names:
            self._router.metrics.stripped_headers.labels(name).inc()
        return names

    def _on_request_headers(self, message: ep.HttpHeaders) -> ep.ProcessingResponse:
        self._headers = _headers_dict(message)
        remove = self._spoofed()
        self._api = api_for(self._headers.get(":method", ""), self._headers.get(":path", ""))
        if self._api is None:
            reply = ep.ProcessingResponse(
                request_headers=ep.HeadersResponse(response=_continue_headers(remove))
            )
            reply.mode_override.CopyFrom(_PASS_THROUGH)
            return reply
        if message.end_of_stream:
            raise MalformedRequest("request has no body; a JSON body with a model is required")
        return ep.ProcessingResponse(
            request_headers=ep.HeadersResponse(response=_continue_headers(remove))
        )

    async def _on_request_body(self, message: ep.HttpBody) -> ep.ProcessingResponse:
        if self._api is None:
            return _passthrough("request_body")
        self._body = message.body
        return await self._route(admit_paused=False)

    async def _route(self, *, admit_paused: bool) -> ep.ProcessingResponse:
        assert self._api is not None
        request: Request = self._router.read(self._api, self._headers, self._body)
        facts = await self._state.load(request.query)
        routed = self._router.route(request, facts, subset=self._subset,
                                    admit_paused=admit_paused)
        self._routed = routed
        return routed_response(routed, self._router.config.routing.cluster_header)

    # -- response path ---------------------------------------------------------------------

    async def _on_response_headers(self, request: ep.ProcessingRequest) -> ep.ProcessingResponse:
        """The upstream answered (or Envoy did, e.g. no healthy upstream): commit a 2xx before
        the client sees it; read a JSON answer's body in one more message on this stream."""
        reply = _passthrough("response_headers")
        routed = self._routed
        if routed is None:
            return reply
        message = request.response_headers
        headers = _headers_dict(message)
        self._status = int(headers.get(":status", "0") or 0)
        self._served = _upstream(request)
        writes = self._router.answered(routed, self._status, self._served)
        turn = writes[0].turn if writes else routed.turn  # with the worker Envoy used
        if headers.get("content-type", "").startswith("text/event-stream") or not writes:
            # A stream's body goes to the observe filter, unheld; a failure has nothing to read.
            await self._state.apply(writes)
            return reply
        self._observer = ResponseObserver(routed.api, streaming=False)
        if message.end_of_stream:
            await self._state.apply([*writes, *self._router.finished(turn, self._observer.summary)])
            return reply
        self._held = writes
        self._turn = turn
        reply.mode_override.CopyFrom(_BUFFER_RESPONSE)
        return reply

    async def _on_response_body(self, message: ep.HttpBody) -> ep.ProcessingResponse:
        if self._observer is not None and self._turn is not None and self._held:
            self._observer.feed(message.body, end=True)
            writes = [*self._held, *self._router.finished(self._turn, self._observer.summary)]
            self._held = []
            await self._state.apply(writes)
        return _passthrough("response_body")

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


def _passthrough(kind: str | None) -> ep.ProcessingResponse:
    """Continue any phase we did not ask for (trailers, or a body after a mode override)."""
    if kind in ("request_headers", "response_headers"):
        return ep.ProcessingResponse(**{kind: ep.HeadersResponse()})
    if kind in ("request_trailers", "response_trailers"):
        return ep.ProcessingResponse(**{kind: ep.TrailersResponse()})
    if kind in ("request_body", "response_body"):
        return ep.ProcessingResponse(**{kind: ep.BodyResponse()})
    return ep.ProcessingResponse()
