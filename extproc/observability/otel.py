"""OpenTelemetry spans of routed requests, exported over OTLP/gRPC (opt-in: only the service
imports this module, and only when ``observability.otlp.enabled``).

The core measures and the record carries (``timings_us``, ``traceparent``); this listener turns
each decision record into spans with explicit start and end times, so nothing of OpenTelemetry
runs inside the policy core. Building a tree costs the SDK some 0.4 ms of CPU, so the request
path only queues the record (bounded: a full queue drops it) and a thread of its own builds the
spans:

    saar.route                      continues the client's W3C traceparent
    ├── saar.parse
    ├── saar.identity
    ├── saar.state.load
    ├── saar.policy                 SAAR: locks, resets, switch pricing
    └── saar.scheduling
        ├── saar.scheduling.healthy      one span per plugin the scheduler ran, in order:
        ├── saar.scheduling.prefix       filters, the prefix index, each scorer, the picker
        └── ...
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..config import Otlp
from .replay import Record

_PROPAGATOR = TraceContextTextMapPropagator()
QUEUED = 10_000
_PARTS = (("parse", "saar.parse"), ("identity", "saar.identity"),
          ("load", "saar.state.load"), ("saar", "saar.policy"))


class RouteSpans:
    """A ``RecordListener``: one span tree per decision record."""

    def __init__(self, config: Otlp, exporter: SpanExporter | None = None) -> None:
        """``exporter`` replaces the OTLP one (tests)."""
        self._provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
            resource=Resource.create({"service.name": config.service_name}),
            shutdown_on_exit=False,
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(
            endpoint=config.endpoint, insecure=not config.endpoint.startswith("https://"),
            headers=dict(config.headers), timeout=config.timeout_seconds,
        )))
        self._tracer = self._provider.get_tracer("saar-extproc")
        self._queue: queue.Queue[Record | None] = queue.Queue(QUEUED)
        self._thread = threading.Thread(target=self._run, name="otel-spans", daemon=True)
        self._thread.start()

    def recorded(self, record: Record) -> None:
        if record.get("timings_us") is not None:
            with contextlib.suppress(queue.Full):  # dropped: spans are best effort
                self._queue.put_nowait(record)

    def completed(self, record: Record) -> None:
        return None

    def close(self) -> None:
        """Build what is queued, export it and stop."""
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._provider.shutdown()

    def _run(self) -> None:
        while (record := self._queue.get()) is not None:
            self._spans(record)

    def _spans(self, record: Record) -> None:
        timings = record["timings_us"]
        parts = [float(timings.get(name, 0.0)) for name, _ in _PARTS]
        scheduling = float(timings.get("scheduling", 0.0))
        end = int(record["time"] * 1e9)
        start = end - int((sum(parts) + scheduling) * 1000)
        carrier = {"traceparent": record["traceparent"]} if record.get("traceparent") else {}
        root = self._tracer.start_span(
            "saar.route", context=_PROPAGATOR.extract(carrier), kind=trace.SpanKind.SERVER,
            start_time=start, attributes=_attributes(record),
        )
        inside = trace.set_span_in_context(root)
        at = start
        for (_, name), micros in zip(_PARTS, parts, strict=True):
            at = self._child(name, inside, at, micros)
        span = self._tracer.start_span("saar.scheduling", context=inside, start_time=at)
        within = trace.set_span_in_context(span)
        plugin_at = at
        for plugin, micros in (timings.get("plugins") or {}).items():
            plugin_at = self._child(f"saar.scheduling.{plugin}", within, plugin_at, micros)
        finished = max(plugin_at, at + int(scheduling * 1000))
        span.end(end_time=finished)
        # The plugins' times are rounded one by one in the record: their sum may pass the
        # scheduling total by a few nanoseconds, and a child must not outlast its parent.
        root.end(end_time=max(end, finished))

    def _child(self, name: str, parent: Any, start: int, micros: float) -> int:
        end = start + int(micros * 1000)
        self._tracer.start_span(name, context=parent, start_time=start).end(end_time=end)
        return end


def _attributes(record: Record) -> dict[str, Any]:
    session = record.get("session") or {}
    worker = record.get("worker") or {}
    values = {
        "saar.replay_id": record.get("replay_id"),
        "saar.session.id": session.get("id"),
        "saar.session.tenant": session.get("tenant"),
        "saar.model": record.get("model"),
        "saar.decision": record.get("decision"),
        "saar.action": record.get("action"),
        "saar.phase": record.get("phase"),
        "saar.reason": record.get("reason"),
        "saar.lock": record.get("lock"),
        "saar.reset": record.get("reset"),
        "saar.worker": worker.get("picked"),
        "saar.context_tokens": (record.get("request") or {}).get("context_tokens"),
    }
    return {k: v for k, v in values.items() if v is not None}
