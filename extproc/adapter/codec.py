"""Envoy's ext_proc messages as the exchange's events, and its commands as Envoy's replies.

The only code (with ``contract``) that speaks Envoy's protobuf types: what a message means is
read here once, what a reply must look like is written here once, and the exchange
(``core.exchange``) decides in between without knowing either.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from envoy.config.core.v3 import base_pb2 as core
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2, struct_pb2

from ..core import exchange as ex
from ..core.router import Diagnostics, Issuer, Routed
from ..errors import RoutingError
from ..state.records import Turn
from ..types import Api
from .contract import (
    API_KEY,
    ATTRIBUTES_NAMESPACE,
    DESTINATION_HEADER,
    DIAGNOSTIC_HEADERS,
    ERROR_KEY,
    LB_NAMESPACE,
    METADATA_NAMESPACE,
    MODEL_RETRIES,
    OBSERVE_HEADER,
    PICK_HEADER,
    PREFILL_HEADER,
    PREFILL_PICK_HEADER,
    REPLAY_HEADER,
    SERVED_KEY,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
    TURN_KEY,
    UPSTREAM_ATTRIBUTE,
)

_OVERWRITE = core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_PASS_THROUGH = pm.ProcessingMode(
    request_body_mode=pm.ProcessingMode.NONE, response_header_mode=pm.ProcessingMode.SKIP
)
_BUFFER_RESPONSE = pm.ProcessingMode(response_body_mode=pm.ProcessingMode.BUFFERED)
_DUPLEX = pm.ProcessingMode.FULL_DUPLEX_STREAMED
CHUNK_BYTES = 62_000
"""Streamed body chunks sent back stay under the 64 KiB some proxies allow per message."""
_METADATA_KEYS = tuple(DIAGNOSTIC_HEADERS.values())
_HEADER_NAMES = tuple(DIAGNOSTIC_HEADERS)
assert len(_HEADER_NAMES) == len(Diagnostics._fields), "a diagnostic without a header name"


class Decoder:
    """One stream's messages as events; remembers what the first message said of the stream
    (full duplex, an observe stream)."""

    def __init__(self) -> None:
        self.duplex = False
        self.duplex_response = False
        self.observing = False
        self._observed = False

    def events(self, message: ep.ProcessingRequest) -> Iterator[ex.Event]:
        kind = message.WhichOneof("request")
        if message.observability_mode or self.observing:
            # Envoy leaves observability_mode unset on an observe stream's last message.
            self.observing = True
            if not self._observed:
                self._observed = True
                turn, api = _observed_turn(message)
                yield ex.Observe(turn, api)
            if kind == "response_body":
                body = message.response_body
                yield ex.ResponseBody(body.body, body.end_of_stream)
            return
        if message.HasField("protocol_config"):
            config = message.protocol_config
            self.duplex = config.request_body_mode == _DUPLEX
            self.duplex_response = config.response_body_mode == _DUPLEX
        if kind == "request_headers":
            headers = message.request_headers
            yield ex.RequestHeaders(_headers_dict(headers), headers.end_of_stream,
                                    _subset(message), self.duplex, self.duplex_response)
        elif kind == "request_body":
            yield ex.RequestBody(message.request_body.body, message.request_body.end_of_stream)
        elif kind == "request_trailers":
            yield ex.RequestTrailers()
        elif kind == "response_headers":
            headers = _headers_dict(message.response_headers)
            status = headers.get(":status", "0")
            yield ex.ResponseHeaders(
                int(status) if status.isdigit() else 0,
                headers.get("content-type", "").startswith("text/event-stream"),
                _upstream(message), message.response_headers.end_of_stream)
        elif kind == "response_body":
            yield ex.ResponseBody(message.response_body.body,
                                  message.response_body.end_of_stream)
        elif kind == "response_trailers":
            yield ex.ResponseTrailers()


def replies(command: ex.Command, routing: Routing) -> list[ep.ProcessingResponse]:
    """Envoy's replies for one reply command (``Continue``, ``Route``, ``Chunk``, ``Refuse``)."""
    if isinstance(command, ex.Route):
        if command.duplex:
            return routing.duplex(command)
        return [routing.routed(command.routed)]
    if isinstance(command, ex.Continue):
        return [routing.continued(command)]
    if isinstance(command, ex.Chunk):
        return streamed_body(_BODY_KINDS[command.phase], command.data, end=command.end)
    if isinstance(command, ex.Refuse):
        return [error_response(command.error, command.style)]
    raise TypeError(f"not a reply: {command!r}")


_BODY_KINDS = {ex.Phase.REQUEST_BODY: "request_body", ex.Phase.RESPONSE_BODY: "response_body"}


class Routing:
    """How a route is written for this gateway: the cluster header Envoy's route reads and the
    model header HTTPRoute rules match (none: not set); ``diagnostic_headers``: the response
    headers carry the diagnostics too (Envoy does not render them from the metadata)."""

    def __init__(self, cluster_header: str, model_header: str | None, *,
                 diagnostic_headers: bool = True) -> None:
        self.cluster_header = cluster_header
        self.model_header = model_header
        self.diagnostic_headers = diagnostic_headers
        self._rendered: Routing | None = None

    def rendered(self) -> Routing:
        """The same routing for an Envoy that renders the diagnostics itself."""
        if not self.diagnostic_headers:
            return self
        if self._rendered is None:
            self._rendered = Routing(self.cluster_header, self.model_header,
                                     diagnostic_headers=False)
        return self._rendered

    def routed(self, routed: Routed) -> ep.ProcessingResponse:
        """The reply to a buffered body: the route, the pick and the rewritten body in one."""
        common, metadata = self._routing(routed)
        if routed.body is not None:
            # Envoy answers 500 when content-length disagrees with a mutated body.
            common.header_mutation.set_headers.append(
                _header("content-length", str(len(routed.body))))
        reply = ep.ProcessingResponse(
            request_body=ep.BodyResponse(response=common), dynamic_metadata=metadata)
        if routed.body is not None:  # set in place: a message passed in is copied, body too
            reply.request_body.response.body_mutation.body = routed.body
        return reply

    def duplex(self, command: ex.Route) -> list[ep.ProcessingResponse]:
        """Full duplex: the headers reply carries the route and the pick (a header mutation on
        a body reply would be ignored), then the body goes back in chunks. Envoy drops
        content-length itself in this mode; the client's routing headers the reply does not
        overwrite are removed."""
        common, metadata = self._routing(command.routed)
        mutation = common.header_mutation
        if command.path is not None:
            mutation.set_headers.append(_header(":path", command.path))
        mine = {h.header.key for h in mutation.set_headers}
        mutation.remove_headers.extend(h for h in command.remove if h not in mine)
        out = [ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common),
                                     dynamic_metadata=metadata)]
        out += streamed_body("request_body", command.body or b"", end=not command.trailers)
        if command.trailers:
            out.append(ep.ProcessingResponse(request_trailers=ep.TrailersResponse()))
        return out

    def continued(self, command: ex.Continue) -> ep.ProcessingResponse:
        phase = command.phase
        if phase is ex.Phase.REQUEST_HEADERS:
            if not (command.remove or command.path is not None or command.skip
                    or command.issuer is not None):
                return _PLAIN[phase]
            reply = ep.ProcessingResponse(request_headers=ep.HeadersResponse(
                response=ep.CommonResponse(status=ep.CommonResponse.CONTINUE)))
            common = reply.request_headers.response  # set in place: a message passed is copied
            mutation = common.header_mutation
            if command.issuer is not None:
                self._to_issuer(command.issuer, reply)
            if command.path is not None:
                mutation.set_headers.append(_header(":path", command.path))
            mine = {h.header.key for h in mutation.set_headers}
            mutation.remove_headers.extend(h for h in command.remove if h not in mine)
            common.clear_route_cache = bool(mutation.remove_headers or mutation.set_headers)
            if command.skip:
                reply.mode_override.CopyFrom(_PASS_THROUGH)
            return reply
        if phase is ex.Phase.RESPONSE_HEADERS:
            headers = []
            if command.routed is not None:
                headers = _pick_headers(command.routed)
                if self.diagnostic_headers:
                    headers += _diagnostic_headers(command.routed)
            if not (headers or command.read_body):
                return _PLAIN[phase]
            reply = ep.ProcessingResponse(response_headers=ep.HeadersResponse())
            if headers:
                reply.response_headers.response.header_mutation.set_headers.extend(headers)
            if command.read_body:
                reply.mode_override.CopyFrom(_BUFFER_RESPONSE)
            return reply
        return _PLAIN[phase]

    def _to_issuer(self, issuer: Issuer, reply: ep.ProcessingResponse) -> None:
        """A request about a stored response, sent as a hard lock sends a turn: the issuer's
        cluster, and its worker for every attempt."""
        mutation = reply.request_headers.response.header_mutation
        mutation.set_headers.append(_named(self.cluster_header, issuer.cluster))
        if self.model_header:
            mutation.set_headers.append(_named(self.model_header, issuer.model))
        if issuer.worker is not None:
            mutation.set_headers.append(_named(DESTINATION_HEADER, issuer.worker))
            lb = reply.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
            lb[DESTINATION_HEADER].string_value = ",".join(
                (issuer.worker,) * (MODEL_RETRIES + 1))

    def _routing(self, routed: Routed) -> tuple[ep.CommonResponse, struct_pb2.Struct]:
        common = ep.CommonResponse(status=ep.CommonResponse.CONTINUE, clear_route_cache=True)
        headers = [_named(self.cluster_header, routed.cluster)]
        if self.model_header:
            headers.append(_named(self.model_header, routed.model))
        metadata = struct_pb2.Struct()
        fields = metadata.fields[METADATA_NAMESPACE].struct_value.fields
        for key, value in zip(_METADATA_KEYS, routed.diagnostics, strict=True):
            fields[key].string_value = value
        if routed.stream:
            headers.append(_named(OBSERVE_HEADER, "1"))
            fields[TURN_KEY].string_value = routed.turn.to_wire()
            fields[API_KEY].string_value = routed.api.value
        workers = routed.workers
        if workers:
            # The Gateway API Inference Extension's contract: the pick in the header, the pick
            # and its fallbacks (for Envoy's retries) in envoy.lb metadata. Each attempt takes
            # the next host of the list: a hard lock's retries stay with its issuer's worker.
            if routed.locked:
                workers = (workers[0],) * (MODEL_RETRIES + 1)
            headers.append(_named(DESTINATION_HEADER, routed.workers[0]))
            prefill = routed.placement.prefill
            if prefill is not None:
                headers.append(_named(PREFILL_HEADER, prefill))
            lb = metadata.fields[LB_NAMESPACE].struct_value.fields
            lb[DESTINATION_HEADER].string_value = ",".join(workers)
        common.header_mutation.set_headers.extend(headers)
        return common, metadata


def _diagnostic_headers(routed: Routed) -> list[core.HeaderValueOption]:
    """The diagnostics as response headers too, for gateways that do not render the ``saar``
    metadata (an Envoy configured by ``bootstrap`` renders the same values from it)."""
    return [_header(name, value)
            for name, value in zip(_HEADER_NAMES, routed.diagnostics, strict=True)]


def _pick_headers(routed: Routed) -> list[core.HeaderValueOption]:
    """The endpoints the processor picked, which no Envoy renders: the worker first (where the
    lock or the score sent it), and the prefill worker when it split the request."""
    out = []
    if routed.workers:
        out.append(_named(PICK_HEADER, routed.workers[0]))
    if routed.placement.prefill is not None:
        out.append(_named(PREFILL_PICK_HEADER, routed.placement.prefill))
    return out


def error_response(error: RoutingError, style: str = "openai") -> ep.ProcessingResponse:
    """An immediate response in the client's format (``openai`` or ``anthropic``). It carries
    ``saar.error`` metadata, so Envoy's local reply mappers leave it as it is, and the replay id
    of the decision it answers, when one was recorded."""
    metadata = struct_pb2.Struct()
    fields = metadata.fields[METADATA_NAMESPACE].struct_value.fields
    fields[ERROR_KEY].string_value = error.code
    headers = [_header(k, v) for k, v in error.headers().items()]
    if error.replay_id is not None:
        fields[DIAGNOSTIC_HEADERS[REPLAY_HEADER]].string_value = error.replay_id
        headers.append(_header(REPLAY_HEADER, error.replay_id))
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),
            headers=ep.HeaderMutation(set_headers=headers),
            body=error.body(style),
            details=f"saar_{error.code}",
        ),
        dynamic_metadata=metadata,
    )


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


def hold_reply(timeout: float) -> ep.ProcessingResponse:
    """Tell Envoy to wait up to ``timeout`` (rounded up, plus a second) for this message."""
    return ep.ProcessingResponse(override_message_timeout=duration_pb2.Duration(
        seconds=int(-(-timeout // 1)) + 1))


_PLAIN = {
    ex.Phase.REQUEST_HEADERS: ep.ProcessingResponse(request_headers=ep.HeadersResponse(
        response=ep.CommonResponse(status=ep.CommonResponse.CONTINUE))),
    ex.Phase.REQUEST_BODY: ep.ProcessingResponse(request_body=ep.BodyResponse()),
    ex.Phase.REQUEST_TRAILERS: ep.ProcessingResponse(request_trailers=ep.TrailersResponse()),
    ex.Phase.RESPONSE_HEADERS: ep.ProcessingResponse(response_headers=ep.HeadersResponse()),
    ex.Phase.RESPONSE_BODY: ep.ProcessingResponse(response_body=ep.BodyResponse()),
    ex.Phase.RESPONSE_TRAILERS: ep.ProcessingResponse(response_trailers=ep.TrailersResponse()),
}
"""Each phase's reply that changes nothing, made once: gRPC only serializes a reply, so one
message serves every stream (never change one)."""


def _header(key: str, value: str) -> core.HeaderValueOption:
    # Envoy reads ``raw_value``; a value in ``value`` arrives empty.
    return core.HeaderValueOption(
        header=core.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE
    )


_named = functools.lru_cache(maxsize=4096)(_header)
"""A header whose value is one of few (a cluster, a model, a worker), made once: appending it
to a reply copies it."""


def _headers_dict(message: ep.HttpHeaders) -> dict[str, str]:
    return {
        h.key: (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
        for h in message.headers.headers
    }


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


def _observed_turn(message: ep.ProcessingRequest) -> tuple[Turn | None, Api | None]:
    """The turn an observe stream completes, from the metadata the routing stream emitted."""
    fields = message.metadata_context.filter_metadata.get(METADATA_NAMESPACE)
    if fields is None or TURN_KEY not in fields.fields or API_KEY not in fields.fields:
        return None, None
    try:
        return (Turn.from_wire(fields.fields[TURN_KEY].string_value),
                Api(fields.fields[API_KEY].string_value))
    except ValueError:
        return None, None
