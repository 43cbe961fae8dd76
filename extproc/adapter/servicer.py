"""The gRPC servicer: one ``Stream`` (an exchange and the loop around it) per ext_proc stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from ..core.exchange import Exchange
from .contract import RENDERS_KEY
from .stream import Io, Stream, process

RESET_WAIT_SECONDS = 0.05
"""How long a stream whose client half-closed waits for the reset that follows (see
``ExternalProcessor.Process``) before it sends its status."""


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):
    def __init__(self, exchange: Callable[[], Exchange], io: Io) -> None:
        """``exchange`` makes a new exchange (one per stream)."""
        self._exchange = exchange
        self._io = io
        self.streams = 0
        """Streams open now (routing, picking and observing alike): what a drain waits for."""

    def close(self) -> None:
        """Stop the parse thread (the service is stopping)."""
        if self._io.parser is not None:
            self._io.parser.close()

    async def Process(
        self,
        request_iterator: AsyncIterator[ep.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ep.ProcessingResponse]:
        # An async generator itself: gRPC tells a streaming handler by its function's kind.
        rendered = any(key == RENDERS_KEY for key, _ in context.invocation_metadata() or ())
        stream = Stream(self._exchange(), self._io, rendered=rendered)
        self.streams += 1
        try:
            async for reply in process(stream, request_iterator, self._io.metrics):
                yield reply
            if not stream.done:
                # Envoy ends every stream with a half-close and a reset at once
                # (ExternalProcessorStreamImpl::close). A status sent now fails on the reset
                # stream, and grpc.aio leaks a failed batch's ops (grpc/grpc#43360): ~80 bytes
                # a request, the soak's creep. The reset cancels this wait, and the handler
                # ends without a status; a client that half-closes and waits gets it a little
                # later.
                await asyncio.sleep(RESET_WAIT_SECONDS)
        finally:
            self.streams -= 1
