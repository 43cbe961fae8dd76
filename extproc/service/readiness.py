"""Whether this replica takes new streams, said the same way on every port: gRPC health
(``readiness`` and the ext_proc service's own name, what Envoy's health check and the Endpoint
Picker Protocol ask) and HTTP ``/readyz`` (kubelet's HTTP probe). ``liveness`` and
``/healthz`` are the process's, and serve while it does.

    starting ──ready()──► ready ──drain()──► draining
        └──────────────drain()──────────────────┘

A replica is ready once its config is loaded and what it waits for has come (the workers
listed, the shared store answering: ``app``); it never becomes ready again once draining.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from grpc_health.v1 import health, health_pb2

HEALTH_SERVICES = ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")
READY_SERVICES = ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

State = Literal["starting", "ready", "draining"]


class Readiness:
    def __init__(self, servicer: health.aio.HealthServicer) -> None:
        self._servicer = servicer
        self.state: State = "starting"
        self.ready = asyncio.Event()
        """Set when the replica became ready (never set when it drained first)."""

    @property
    def serving(self) -> bool:
        return self.state == "ready"

    async def start(self) -> None:
        """Every health service as it is before the replica is ready."""
        for name in HEALTH_SERVICES:
            if name not in READY_SERVICES:
                await self._servicer.set(name, SERVING)
        await self._publish()

    async def set_ready(self) -> None:
        if self.state == "starting":
            self.state = "ready"
            await self._publish()
            if self.serving:
                self.ready.set()

    async def drain(self) -> None:
        self.state = "draining"
        await self._publish()

    async def _publish(self) -> None:
        # The state is read for each service: a drain that comes in between wins.
        for name in READY_SERVICES:
            await self._servicer.set(name, SERVING if self.serving else NOT_SERVING)
