"""Wires the router into a running service: the gRPC ext_proc server with gRPC health (TLS when
``server.tls.enabled``), an optional plaintext health port, and the HTTP port. The only module
that owns sockets and background tasks.

Health (``readiness``): ``liveness`` and ``/healthz`` serve while the process does.
``readiness`` (and the ext_proc service's own name, as the Endpoint Picker Protocol asks) and
``/readyz`` say not ready until the workers are known — Kubernetes discovery has listed the
pool's pods — and the shared store has answered once; then ready until the drain
(``RunningService.drain``). A store outage later does not take readiness down: the state layer
serves from local state meanwhile, and every replica turning unready at once would fail all
traffic closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health, health_pb2_grpc

from .._proto import replay_pb2_grpc
from ..adapter.codec import Routing
from ..adapter.gate import ParseThread
from ..adapter.servicer import ExternalProcessor
from ..adapter.stream import Io
from ..adapter.waker import Waker
from ..assembly import Parts, assemble
from ..config import Config, ConfigError, WorkerSpec
from ..observability.metrics import Metrics
from ..state.layer import StateLayer
from . import runtime
from .http_api import build_http_app
from .readiness import Readiness
from .reload import Reloader
from .replay_service import ReplayService
from .roles import pool_config
from .tasks import Background
from .telemetry import Telemetry
from .tls import CertificateFiles, server_credentials

if TYPE_CHECKING:
    from ..scheduling.discovery import KubernetesDiscovery

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
READY_POLL_SECONDS = 0.1


@dataclass
class RunningService:
    parts: Parts
    state: StateLayer
    grpc_server: grpc.aio.Server
    http_runner: web.AppRunner
    grpc_port: int
    http_port: int
    background: Background
    health: health.aio.HealthServicer
    readiness: Readiness
    health_server: grpc.aio.Server | None = None
    health_port: int | None = None
    discovery: KubernetesDiscovery | None = None
    certificates: CertificateFiles | None = None
    telemetry: Telemetry | None = None
    processor: ExternalProcessor | None = None
    _gate: asyncio.Task[None] | None = None

    @property
    def ready(self) -> asyncio.Event:
        """Set once the replica is ready (``readiness``)."""
        return self.readiness.ready

    async def drain(self, notice: float, timeout: float) -> None:
        """The drain of a rolling update, which loses no request (``config.Drain``): not
        ready at once; new streams still taken for ``notice`` seconds, while Envoy's health
        check (or a gateway's endpoints) moves them to the other replicas; then new streams
        refused, what flow control holds let go to the engines' queues, and the streams in
        flight — routing, picking, observing: a long prefill, a streamed answer, a held
        request — awaited, at most ``timeout`` seconds, the rest cut. The gRPC
        port is closed when this returns; the HTTP port still answers (``/readyz``: 503)."""
        await self.readiness.drain()
        log.info("draining: not ready; new streams taken for %.1f s more", notice)
        await asyncio.sleep(notice)
        self.background.release_queues()  # they would starve behind the other replicas
        open_now = self.processor.streams if self.processor is not None else 0
        log.info("draining: new streams refused; waiting up to %.1f s for the %d in flight",
                 timeout, open_now)
        began = time.monotonic()
        await self.grpc_server.stop(grace=timeout)
        took = time.monotonic() - began
        if took >= timeout and open_now:
            log.warning("drained: the streams still open after %.1f s were cut", timeout)
        else:
            log.info("drained: every stream ended (%.1f s)", took)

    async def _readiness(self) -> None:
        """Serve ``readiness`` once the workers are synced and the store has answered. The
        store is asked every poll; its silence is logged once, then every ``log_every``
        seconds with the count of failed pings, and its answer once (a store down for an hour
        writes 360 lines, not 36,000)."""
        log_every = 10.0
        shared = self.state.shared
        failures, since, logged = 0, time.monotonic(), -log_every
        while True:
            synced = self.discovery is None or self.discovery.synced
            store = shared is None
            if synced and shared is not None:
                try:
                    await asyncio.wait_for(shared.ping(), 1.0)
                    store = True
                except Exception as exc:  # unreachable yet: try again
                    failures += 1
                    now = time.monotonic()
                    if now - logged >= log_every:
                        logged = now
                        log.warning("not ready: the shared store does not answer (%s); %d "
                                    "pings failed in %.0f s, trying every %.1f s", exc or
                                    type(exc).__name__, failures, now - since,
                                    READY_POLL_SECONDS)
            if synced and store:
                break
            await asyncio.sleep(READY_POLL_SECONDS)
        if failures:
            log.info("ready: the shared store answers (after %d failed pings, %.0f s)",
                     failures, time.monotonic() - since)
        await self.readiness.set_ready()

    async def stop(self) -> None:
        if self._gate is not None:
            self._gate.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gate
        if self.discovery is not None:
            self.discovery.stop()
        await self.background.stop()
        if self.health_server is not None:
            await self.health_server.stop(grace=0.5)
        await self.grpc_server.stop(grace=1.0)
        if self.processor is not None:
            self.processor.close()
        runtime.release(self.parts)
        await self.http_runner.cleanup()
        await self.state.stop()
        if self.telemetry is not None:
            await self.telemetry.stop()
        self.parts.close()


async def start(config: Config, parts: Parts | None = None) -> RunningService:
    """Start the ports (port 0 picks a free one) and return once they accept connections
    (``readiness`` may follow later: see the module's docstring). With
    ``scheduling.pool_name`` the service is that pool's endpoint picker (``pool_config``)."""
    if config.scheduling.pool_name is not None:
        config = pool_config(config, config.scheduling.pool_name,
                             source="scheduling.pool_name")
    elif config.scheduling.discovery.mode == "kubernetes":
        raise ConfigError("scheduling.discovery: kubernetes discovery finds one pool's workers: "
                          "give the pool (--pool-name / scheduling.pool_name)")
    metrics = parts.metrics if parts is not None else Metrics()
    state = StateLayer.from_config(config, clock=time.time, metrics=metrics)
    parts = parts or assemble(config, metrics=metrics, secret=await state.tenant_secret(config),
                              shared=state.shared is not None)
    telemetry = Telemetry.start(config, parts)
    state.start()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Never share a port with another process that happens to bind it too.
            ("grpc.so_reuseport", 0),
        ]
    )
    waker = Waker()
    io = Io(state, waker, metrics, Routing(config.routing.cluster_header,
                                           config.routing.model_header), ParseThread())
    processor = ExternalProcessor(parts.exchange, io)
    ep_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    runtime.register(parts, state, waker, telemetry.figures)
    replay_pb2_grpc.add_ReplayServicer_to_server(
        ReplayService(telemetry.lookup, telemetry.auth), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    readiness = Readiness(health_servicer)
    await readiness.start()
    address = f"{config.server.host}:{config.server.grpc_port}"
    certificates = None
    if config.server.tls.enabled:
        credentials, certificates = server_credentials(config.server.tls)
        grpc_port = server.add_secure_port(address, credentials)
    else:
        grpc_port = server.add_insecure_port(address)
    await server.start()
    health_server, health_port = None, None
    if config.server.health_port is not None:
        # kubelet's gRPC probes speak plaintext: health only, nothing else on this port.
        health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        health_port = health_server.add_insecure_port(
            f"{config.server.host}:{config.server.health_port}")
        await health_server.start()

    runner = web.AppRunner(build_http_app(parts, telemetry, readiness), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.server.http_host, config.server.http_port)
    await site.start()
    http_port = runner.addresses[0][1]
    background = Background(config, parts.pools, metrics, waker, parts.router.clock)
    background.start()
    discovery = _discovery(config, parts)
    running = RunningService(parts, state, server, runner, grpc_port, http_port, background,
                             health_servicer, readiness, health_server, health_port,
                             discovery, certificates, telemetry, processor)
    if discovery is None and state.shared is None:
        await readiness.set_ready()  # nothing to wait for
    else:
        running._gate = asyncio.create_task(running._readiness(), name="readiness-gate")
    return running


def _discovery(config: Config, parts: Parts) -> KubernetesDiscovery | None:
    """Kubernetes discovery of the pool's workers, published onto this loop."""
    found = config.scheduling.discovery
    model = config.scheduling.pool_name
    if found.mode != "kubernetes" or model is None:
        return None
    assert found.inference_pool is not None  # the config's schema guarantees it
    from ..scheduling.discovery import KubernetesDiscovery, default_namespace

    loop = asyncio.get_running_loop()
    pools = parts.pools

    def apply(specs: tuple[WorkerSpec, ...]) -> None:
        for address in pools.registry.set_source("kubernetes", {model: specs}):
            pools.index.forget(address)

    def publish(endpoints: tuple[str, ...]) -> None:
        # On the watching thread: the pods' roles are read there, with the endpoints.
        loop.call_soon_threadsafe(apply, discovery.specs)

    discovery = KubernetesDiscovery(
        found.namespace or default_namespace(), found.inference_pool, publish,
        role_label=found.role_label)
    discovery.start()
    return discovery


async def serve_forever(config: Config, reload: Callable[[], Config] | None = None) -> None:
    """Serve until SIGTERM or SIGINT. ``reload`` reads the config again on SIGHUP
    (``service.reload``: what can change without a restart is applied, the rest named)."""
    service = await start(config)
    # What the start made (modules, the config, the servers) lives as long as the process:
    # out of the collector's sight, a full collection (which stops the event loop) scans only
    # what the traffic made — about 55 ms less per collection on the soak's machine.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloader = Reloader(service, reload or (lambda: config))
    loop.add_signal_handler(signal.SIGHUP, reloader.request)
    tls = " (TLS)" if config.server.tls.enabled else ""
    if config.server.tls.client_ca_file:
        tls = " (mutual TLS)"
    health_port = f", health on {service.health_port}" if service.health_port else ""
    pool = service.parts.config.scheduling.pool_name
    role = f", endpoint picker of {pool}" if pool else ""
    print(f"saar: ext_proc on {config.server.host}:{service.grpc_port}{tls}, "
          f"http on {config.server.http_host}:{service.http_port}{health_port}{role}",
          flush=True)
    await stop.wait()
    loop.remove_signal_handler(signal.SIGHUP)
    await reloader.stop()
    await service.drain(config.server.notice_seconds, config.server.drain.timeout_seconds)
    await service.stop()
