"""The Envoy ext_proc adapter: the only module that speaks Envoy's protobuf types.

Two filters in Envoy talk to this one service (see ``envoy/envoy.yaml``):

* ``saar`` (one stream per request): request headers, then the buffered body — the reply sets the
  cluster header, rewrites the model, clears the route cache and emits dynamic metadata that
  Envoy turns into the ``x-saar-*`` response headers; then the response headers (the upstream
  answered: commit the turn) and, for a JSON answer, its buffered body (ids, usage), switched on
  per request with a mode override. Everything on one stream: each extra stream costs a Python
  processor more than an extra message on an open one (see the README's measurements).
* ``saar-observe`` (``observability_mode``: never waits), enabled by route only for streamed
  (SSE) answers, which must not wait on the processor chunk by chunk.

``ExtProcStream`` is sans-IO: feed it ``ProcessingRequest`` messages, it returns the replies.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from envoy.config.core.v3 import base_pb2 as core
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2, struct_pb2

from ..apis.response import ResponseObserver
from ..core.router import DESTINATION_HEADER, Routed, Router, api_for
from ..errors import MalformedRequest, RoutingError, SessionPaused
from ..types import Api
from .bootstrap import OBSERVE_HEADER

log = logging.getLogger(__name__)

METADATA_NAMESPACE = "saar"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
ATTRIBUTES_NAMESPACE = "envoy.filters.http.ext_proc"
UPSTREAM_ATTRIBUTE = "upstream.address"
HOLD_POLL_SECONDS = 0.05
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
    _set_strings(metadata, METADATA_NAMESPACE, _metadata(routed))
    if routed.stream:
        headers.append(_header(OBSERVE_HEADER, "1"))
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


class ExtProcStream:
    """One ext_proc stream (one HTTP request seen by one filter), driven message by message."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._headers: dict[str, str] = {}
        self._subset: frozenset[str] | None = None
        self._body: bytes = b""
        self._api: Api | None = None
        self._observer: ResponseObserver | None = None
        self._replay_id: str | None = None
        self._finished = False
        self._observing = False

    def handle(self, request: ep.ProcessingRequest) -> ep.ProcessingResponse | Hold | None:
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
                return self._on_request_body(request.request_body)
            if kind == "response_headers":
                return self._on_response_headers(request)
            if kind == "response_body":
                return self._on_response_body(request.response_body)
        except SessionPaused as exc:
            admission = self._router.config.scheduling.admission
            if admission.on_paused == "hold":
                return Hold(exc.session_key, admission.hold_timeout_seconds)
            return error_response(exc, self._api)
        except RoutingError as exc:
            return error_response(exc, self._api)
        return _passthrough(kind)

    def resume(self, *, admit_paused: bool) -> ep.ProcessingResponse:
        """Route the held body again: the session was resumed, or the hold timed out."""
        assert self._api is not None
        try:
            routed = self._router.route(
                self._api, self._headers, self._body, subset=self._subset,
                admit_paused=admit_paused,
            )
        except RoutingError as exc:
            return error_response(exc, self._api)
        return self._routed(routed)

    @property
    def observed(self) -> bool:
        """An observe stream with nothing left to learn: ending it now frees Envoy's stream
        (otherwise held for ``deferred_close_timeout`` after the request)."""
        return self._observing and self._finished

    def close(self) -> None:
        """The stream ended; a response that never reached end_of_stream still closes its turn."""
        if self._observer is not None and self._replay_id is not None and not self._finished:
            self._finished = True
            self._router.response_finished(self._replay_id, self._observer.summary)

    # -- request path ----------------------------------------------------------------------

    def _on_request_headers(self, message: ep.HttpHeaders) -> ep.ProcessingResponse:
        self._headers = _headers_dict(message)
        remove = self._router.spoofed(self._headers)
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

    def _on_request_body(self, message: ep.HttpBody) -> ep.ProcessingResponse:
        if self._api is None:
            return _passthrough("request_body")
        self._body = message.body
        return self._routed(
            self._router.route(self._api, self._headers, message.body, subset=self._subset)
        )

    def _routed(self, routed: Routed) -> ep.ProcessingResponse:
        self._replay_id = routed.replay_id
        return routed_response(routed, self._router.config.routing.cluster_header)

    # -- response path ---------------------------------------------------------------------

    def _on_response_headers(self, request: ep.ProcessingRequest) -> ep.ProcessingResponse:
        """The upstream answered (or Envoy did, e.g. no healthy upstream): commit or not, and
        read a JSON answer's body in one more message on this stream."""
        reply = _passthrough("response_headers")
        api = self._router.api_of(self._replay_id) if self._replay_id else None
        if api is None or self._replay_id is None:
            return reply
        message = request.response_headers
        headers = _headers_dict(message)
        self._router.response_started(
            self._replay_id, int(headers.get(":status", "0") or 0), _upstream(request)
        )
        if headers.get("content-type", "").startswith("text/event-stream"):
            return reply  # the observe filter reads the stream without holding it
        self._observer = ResponseObserver(api, streaming=False)
        if message.end_of_stream:
            self._observer.feed(b"", end=True)
            self._finish()
        else:
            reply.mode_override.CopyFrom(_BUFFER_RESPONSE)
        return reply

    def _on_response_body(self, message: ep.HttpBody) -> ep.ProcessingResponse:
        if self._observer is not None and not self._finished:
            self._observer.feed(message.body, end=True)
            self._finish()
        return _passthrough("response_body")

    def _observe(self, request: ep.ProcessingRequest) -> None:
        """An observe stream: the streamed (SSE) body of a routed request, chunk by chunk."""
        if self._observer is None or self._replay_id is None:
            fields = request.metadata_context.filter_metadata.get(METADATA_NAMESPACE)
            replay_id = fields.fields["replay_id"].string_value if fields else ""
            api = self._router.api_of(replay_id) if replay_id else None
            if api is None:
                self._finished = True
                return
            self._replay_id = replay_id
            self._observer = ResponseObserver(api, streaming=True)
        replay_id = self._replay_id
        kind = request.WhichOneof("request")
        if kind == "response_headers":  # only when the observe filter is sent headers too
            headers = _headers_dict(request.response_headers)
            self._router.response_started(replay_id, int(headers.get(":status", "0") or 0))
            self._observer.streaming = headers.get("content-type", "").startswith(
                "text/event-stream"
            )
        elif kind == "response_body" and not self._finished:
            body = request.response_body
            self._observer.feed(body.body, end=body.end_of_stream)
            if self._observer.done:
                self._finish()

    def _finish(self) -> None:
        assert self._observer is not None and self._replay_id is not None
        self._finished = True
        self._router.response_finished(self._replay_id, self._observer.summary)


def _passthrough(kind: str | None) -> ep.ProcessingResponse:
    """Continue any phase we did not ask for (trailers, or a body after a mode override)."""
    if kind in ("request_headers", "response_headers"):
        return ep.ProcessingResponse(**{kind: ep.HeadersResponse()})
    if kind in ("request_trailers", "response_trailers"):
        return ep.ProcessingResponse(**{kind: ep.TrailersResponse()})
    if kind in ("request_body", "response_body"):
        return ep.ProcessingResponse(**{kind: ep.BodyResponse()})
    return ep.ProcessingResponse()


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):
    """The gRPC servicer: a thin loop around ``ExtProcStream`` that never lets a stream crash."""

    def __init__(self, router: Router) -> None:
        self._router = router

    async def _held(self, hold: Hold) -> bool:
        """Wait until admission resumes the session (True) or the hold times out (False). No
        request in flight is touched: only this one, not yet sent upstream, waits."""
        admission = self._router.pools.admission
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold.timeout
        while admission.is_paused(hold.session_key):
            if loop.time() >= deadline:
                self._router.metrics.held_requests.labels("timeout").inc()
                return False
            await asyncio.sleep(HOLD_POLL_SECONDS)
        self._router.metrics.held_requests.labels("resumed").inc()
        return True

    async def Process(
        self,
        request_iterator: AsyncIterator[ep.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ep.ProcessingResponse]:
        stream = ExtProcStream(self._router)
        try:
            async for request in request_iterator:
                try:
                    reply = stream.handle(request)
                    if isinstance(reply, Hold):
                        # Tell Envoy to wait longer for this message, then wait for the resume.
                        yield ep.ProcessingResponse(
                            override_message_timeout=duration_pb2.Duration(
                                seconds=math.ceil(reply.timeout) + 1
                            )
                        )
                        reply = stream.resume(admit_paused=not await self._held(reply))
                except Exception:
                    log.exception("ext_proc message failed")
                    self._router.metrics.stream_failures.inc()
                    if request.observability_mode:
                        continue
                    reply = error_response(
                        RoutingError("the router failed on this request; see its logs"), None
                    )
                if reply is not None:
                    yield reply
                if stream.observed:
                    return
        finally:
            stream.close()
