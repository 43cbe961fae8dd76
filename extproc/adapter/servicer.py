"""The gRPC servicer: a thin loop around ``ExtProcStream`` that never lets a stream crash."""

from __future__ import annotations

import asyncio
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
from .stream import ExtProcStream, Hold, StreamOptions, error_response

log = logging.getLogger(__name__)

HOLD_POLL_SECONDS = 0.05


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):
    def __init__(
        self, router: Router, state: StateLayer, options: StreamOptions | None = None
    ) -> None:
        self._router = router
        self._state = state
        self._options = options or StreamOptions(router.config.routing.model_header,
                                                 router.config.scheduling.pool_name)

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
        stream = ExtProcStream(self._router, self._state, self._options)
        try:
            async for request in request_iterator:
                try:
                    reply = await stream.handle(request)
                    if isinstance(reply, Hold):
                        # Tell Envoy to wait longer for this message, then wait for the resume.
                        yield ep.ProcessingResponse(
                            override_message_timeout=duration_pb2.Duration(
                                seconds=math.ceil(reply.timeout) + 1
                            )
                        )
                        reply = await stream.resume(admit_paused=not await self._held(reply))
                except Exception:
                    log.exception("ext_proc message failed")
                    self._router.metrics.stream_failures.inc()
                    if request.observability_mode:
                        continue
                    reply = error_response(
                        RoutingError("the router failed on this request; see its logs"),
                        stream.api,
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
