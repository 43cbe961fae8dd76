"""The floor for a Python ext_proc: a grpc.aio processor that answers every phase with an empty
CONTINUE, so the benchmark can tell the price of gRPC from the price of routing.

Run as ``python -m extproc.dev.bench.passthrough --port N [--echo] [--busy-us N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def reply_for(request: ep.ProcessingRequest, *, echo: bool = False) -> ep.ProcessingResponse:
    """An empty response of the same phase: Envoy reads it as CONTINUE, unchanged. With
    ``echo`` a buffered request body comes back as a body mutation, byte for byte: the floor of
    a processor that must return the body (one that rewrites the model)."""
    kind = request.WhichOneof("request")
    if echo and kind == "request_body":
        body = request.request_body.body
        common = ep.CommonResponse(body_mutation=ep.BodyMutation(body=body))
        return ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
    if kind in ("request_headers", "response_headers"):
        return ep.ProcessingResponse(**{kind: ep.HeadersResponse()})
    if kind in ("request_body", "response_body"):
        return ep.ProcessingResponse(**{kind: ep.BodyResponse()})
    if kind in ("request_trailers", "response_trailers"):
        return ep.ProcessingResponse(**{kind: ep.TrailersResponse()})
    return ep.ProcessingResponse()


BUSY_PREFIX = "busy-"
"""``busy-<N>``: the pass-through that spends N microseconds of CPU on each request body."""


class PassThrough(ep_grpc.ExternalProcessorServicer):
    def __init__(self, *, echo: bool = False, busy_seconds: float = 0.0) -> None:
        """``busy_seconds``: CPU spent on each request body before its reply (what routing
        costs in process), so a bench can tell saar's own work from what any processor that
        works as much would pay to gRPC, Envoy and the machine."""
        self._echo = echo
        self._busy = busy_seconds

    async def Process(
        self,
        request_iterator: AsyncIterator[ep.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ep.ProcessingResponse]:
        async for request in request_iterator:
            if self._busy and request.HasField("request_body"):
                end = time.thread_time() + self._busy  # CPU, as routing spends it
                while time.thread_time() < end:
                    pass
            yield reply_for(request, echo=self._echo)


async def serve(host: str, port: int, *, echo: bool = False, busy_seconds: float = 0.0) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # A second server on a reused free port would silently take half the streams.
            ("grpc.so_reuseport", 0),
        ]
    )
    servicer = PassThrough(echo=echo, busy_seconds=busy_seconds)
    ep_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=0.5)


def command(variant: str) -> Callable[[int], list[str]] | None:
    """How a bench starts the processor of ``variant`` on a port: None for saar's own (the
    stack's ``saar serve``), this module for ``passthrough``, ``echo`` and ``busy-<N>``."""
    if variant.startswith("saar"):
        return None
    extra = ["--echo"] if variant == "echo" else []
    if variant.startswith(BUSY_PREFIX):
        extra = ["--busy-us", variant.removeprefix(BUSY_PREFIX)]
    return lambda port: [sys.executable, "-m", "extproc.dev.bench.passthrough", "--port",
                         str(port), *extra]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--echo", action="store_true",
                        help="return a buffered request body unchanged, as a body mutation")
    parser.add_argument("--busy-us", type=float, default=0.0,
                        help="microseconds of CPU spent on each request body")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, echo=args.echo, busy_seconds=args.busy_us / 1e6))


if __name__ == "__main__":
    main()
