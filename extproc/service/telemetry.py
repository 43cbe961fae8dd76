"""What the service adds around the router's own records: who may read them (``AdminAuth``),
where they are read from (``ReplayLookup``: this replica, then the shared store), the metrics
derived from them (``Figures``; the upstream-named ``StandardFigures``, and ``PoolGauges`` read
from the worker registry at each scrape), the shared store's writer, OpenTelemetry spans when
configured, and the router-overhead timer on the ext_proc stream. ``app`` starts and stops it
whole."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from ..assembly import Parts
from ..config import Config
from ..observability.figures import Figures
from ..observability.metrics import Metrics
from ..observability.replay import RecordListener
from ..observability.shared_replay import ReplayLookup, SharedReplay, connect
from ..observability.standard import PoolGauges, StandardFigures, pools_of
from .admin import AdminAuth

PROCESS_METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


@dataclass
class Telemetry:
    auth: AdminAuth
    lookup: ReplayLookup
    figures: Figures
    shared: SharedReplay | None = None
    spans: Any = None
    """``RouteSpans`` when OpenTelemetry is on (typed loosely: never imported otherwise)."""
    interceptors: list[grpc.aio.ServerInterceptor] = field(default_factory=list)
    gauges: tuple[CollectorRegistry, PoolGauges] | None = None
    """(the metrics registry, the pool gauges registered in it until ``stop``)."""

    @classmethod
    def start(cls, config: Config, parts: Parts) -> Telemetry:
        """Subscribe the listeners to the router's records; start the shared writer (call from
        the running event loop)."""
        listeners: list[RecordListener] = []
        router = parts.router
        figures = Figures(parts.metrics, clock=router.clock,
                          idle_seconds=config.observability.session_idle_seconds,
                          table=parts.table)
        parts.table.leaving(figures.left)
        listeners.append(figures)
        listeners.append(StandardFigures.from_config(parts.metrics.standard, config))
        gauges = PoolGauges(parts.pools.registry, pools_of(config))
        parts.metrics.registry.register(gauges)
        shared = _shared(config, parts.metrics)
        if shared is not None:
            listeners.append(shared)
            shared.start()
        spans = None
        if config.observability.otlp.enabled:
            from ..observability.otel import RouteSpans  # OpenTelemetry only when asked for

            spans = RouteSpans(config.observability.otlp)
            listeners.append(spans)
        for listener in listeners:
            parts.replay.subscribe(listener)
        auth = AdminAuth.from_config(config.admin, router.identity.tenant)
        return cls(auth, ReplayLookup(parts.replay, shared), figures, shared, spans,
                   [OverheadTimer(parts.metrics)], (parts.metrics.registry, gauges))

    async def stop(self) -> None:
        if self.gauges is not None:
            registry, gauges = self.gauges
            registry.unregister(gauges)
            self.gauges = None
        if self.shared is not None:
            await self.shared.stop()
        if self.spans is not None:
            self.spans.close()


def _shared(config: Config, metrics: Metrics) -> SharedReplay | None:
    settings = config.observability.shared_replay
    if config.state.store != "redis" or not settings.enabled:
        return None
    return SharedReplay(
        connect(config.state.redis_url), metrics,
        prefix=config.state.key_prefix, ttl_seconds=settings.ttl_seconds,
        session_records=settings.session_records, flush_seconds=settings.flush_seconds,
        max_pending=settings.max_pending,
    )


class OverheadTimer(grpc.aio.ServerInterceptor):
    """``saar_router_overhead_seconds``: per routing stream (one HTTP request), the time from
    each message Envoy sent to the processor's reply, summed; what the processor added to the
    request. Observe streams (Envoy never waits on them) and admission holds are left out."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if details.method != PROCESS_METHOD or handler is None or handler.stream_stream is None:
            return handler
        behaviour = handler.stream_stream
        histogram = self._metrics.overhead_seconds

        async def timed(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            clock = _StreamClock()
            async for reply in behaviour(clock.received(requests), context):
                clock.replied()
                yield reply
            if clock.routing and clock.total:
                histogram.observe(clock.total)

        return grpc.stream_stream_rpc_method_handler(
            timed, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class _StreamClock:
    def __init__(self) -> None:
        self.total = 0.0
        self.routing = True
        self._since: float | None = None

    async def received(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in requests:
            if message.observability_mode:
                self.routing = False
            self._since = time.perf_counter()
            yield message

    def replied(self) -> None:
        """A reply went out; a second one to the same message (after a hold) is not timed."""
        if self._since is not None:
            self.total += time.perf_counter() - self._since
            self._since = None
