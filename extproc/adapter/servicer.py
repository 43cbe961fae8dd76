"""The gRPC servicer: a thin loop around ``ExtProcStream`` that never lets a stream crash."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import duration_pb2

from ..core.router import Router
from ..errors import RoutingError
from ..state.layer import StateLayer
from .gate import LargeBodies, ParseThread
from .stream import ExtProcStream, Hold, StreamOptions, error_response

log = logging.getLogger(__name__)

class ExternalProcessor(ep_grpc.ExternalProcessorServicer):
    def __init__(
        self, router: Router, state: StateLayer, options: StreamOptions | None = None
    ) -> None:
        self._router = router
        self._state = state
        self._options = options or StreamOptions(router.config.routing.model_header,
                                                 router.config.scheduling.pool_name)
        limits = router.config.limits
        self.bodies = LargeBodies(limits.large_body_bytes, limits.large_bodies_per_tenant,
                                  limits.large_body_wait_seconds,
                                  limits.large_body_bytes_per_second,
                                  limits.large_body_bytes_per_second_total)
        self._parser = ParseThread()

    def close(self) -> None:
        """Stop the parse thread (the service is stopping)."""
        self._parser.close()

    async def _held(self, hold: Hold) -> bool:
        """Wait for what the hold waits for; count how it ended."""
        ready = await hold.wait()
        self._router.metrics.holds.labels(hold.kind, "ready" if ready else "timeout").inc()
        return ready

    async def Process(
        self,
        request_iterator: AsyncIterator[ep.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ep.ProcessingResponse]:
        stream = ExtProcStream(self._router, self._state, self._options,
                               bodies=self.bodies, parser=self._parser)
        try:
            async for request in request_iterator:
                try:
                    reply = await stream.handle(request)
                    while isinstance(reply, Hold):
                        # Tell Envoy to wait longer for this message, then wait.
                        yield ep.ProcessingResponse(
                            override_message_timeout=duration_pb2.Duration(
                                seconds=math.ceil(reply.timeout) + 1
                            )
                        )
                        reply = await stream.resume(reply, await self._held(reply))
                except Exception:
                    log.exception("ext_proc message failed")
                    self._router.metrics.stream_failures.inc()
                    if request.observability_mode:
                        continue
                    reply = error_response(
                        RoutingError("the router failed on this request; see its logs"),
                        stream.style,
                    )
                if isinstance(reply, ep.ProcessingResponse):
                    yield reply
                elif reply is not None:
                    for one in reply:
                        yield one
                if stream.observed:
                    return
        finally:
            stream.close()
