"""What the service adds around the router's own records: who may read them (``AdminAuth``),
where they are read from (``ReplayLookup``: this replica, then the shared store), the metrics
derived from them (``Figures``; the upstream-named ``StandardFigures``, and ``PoolGauges`` read
from the worker registry at each scrape), the shared store's writer, OpenTelemetry spans when
configured, and the router-overhead timer on the ext_proc stream. ``app`` starts and stops it
whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from ..assembly import Parts
from ..config import Config
from ..observability.figures import Figures
from ..observability.metrics import Metrics
from ..observability.replay import RecordListener
from ..observability.shared_replay import ReplayLookup, SharedReplay
from ..observability.standard import PoolGauges, StandardFigures, pools_of
from ..state.cluster import connect
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
                   (parts.metrics.registry, gauges))

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
