"""Wires the router into a running service: the gRPC ext_proc server with gRPC health, and the
HTTP port. The only module that owns sockets and background tasks."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .._proto import replay_pb2_grpc
from ..adapter.servicer import ExternalProcessor
from ..config import Config
from ..core.router import Router
from ..observability.metrics import Metrics
from ..state.layer import StateLayer
from .http_api import build_http_app
from .replay_service import ReplayService
from .tasks import Background

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
HEALTH_SERVICES = ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")


@dataclass
class RunningService:
    router: Router
    state: StateLayer
    grpc_server: grpc.aio.Server
    http_runner: web.AppRunner
    grpc_port: int
    http_port: int
    background: Background
    health: health.aio.HealthServicer

    async def drain(self, seconds: float) -> None:
        """Say not ready (Envoy's health check stops sending new streams here), then give
        the streams in flight time to end: a rolling update loses no request."""
        await self.health.set("readiness", health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.sleep(seconds)

    async def stop(self) -> None:
        await self.background.stop()
        await self.grpc_server.stop(grace=1.0)
        await self.http_runner.cleanup()
        await self.state.stop()
        self.router.close()


async def start(config: Config, router: Router | None = None) -> RunningService:
    """Start both ports (port 0 picks a free one) and return once they accept connections."""
    metrics = router.metrics if router is not None else Metrics()
    state = StateLayer.from_config(config, clock=time.time, metrics=metrics)
    router = router or Router(config, metrics=metrics, secret=await state.tenant_secret(config))
    state.start()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Never share a port with another process that happens to bind it too.
            ("grpc.so_reuseport", 0),
        ]
    )
    ep_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(router, state), server)
    replay_pb2_grpc.add_ReplayServicer_to_server(ReplayService(router.replay), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    grpc_port = server.add_insecure_port(f"{config.server.host}:{config.server.grpc_port}")
    await server.start()
    for name in HEALTH_SERVICES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    runner = web.AppRunner(build_http_app(router), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.http_port)
    await site.start()
    http_port = runner.addresses[0][1]
    background = Background(router)
    background.start()
    return RunningService(router, state, server, runner, grpc_port, http_port, background,
                          health_servicer)


async def serve_forever(config: Config) -> None:
    service = await start(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"saar: ext_proc on {config.server.host}:{service.grpc_port}, "
          f"http on {config.server.host}:{service.http_port}", flush=True)
    await stop.wait()
    await service.drain(config.server.drain_seconds)
    await service.stop()
