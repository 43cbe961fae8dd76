"""Prometheus metrics of the router, in a registry of their own (several routers can share a
process in tests and in the evaluation matrix); beside its own ``saar_*``, the upstream-named
ones other gateways' dashboards read (``standard``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .standard import StandardMetrics

_FAST = (0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01)
_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "saar_requests", "Requests seen by the processor", ["api", "route"], registry=r
        )
        self.errors = Counter(
            "saar_errors", "Requests answered with an error by the processor", ["code"], registry=r
        )
        self.decisions = Counter(
            "saar_decisions", "Routing decisions", ["action", "reason"], registry=r
        )
        self.locks = Counter("saar_locks", "Hard locks applied", ["kind"], registry=r)
        self.resets = Counter("saar_resets", "Reset boundaries crossed", ["kind"], registry=r)
        self.switches = Counter(
            "saar_switches", "Model switches committed", ["from_model", "to_model"], registry=r
        )
        self.stripped_headers = Counter(
            "saar_stripped_headers",
            "Client-supplied routing headers removed before routing (header: a name routing "
            "trusts, else other)",
            ["header"],
            registry=r,
        )
        self.responses = Counter(
            "saar_responses", "Upstream responses observed", ["model", "status_class"], registry=r
        )
        self.decision_seconds = Histogram(
            "saar_decision_seconds",
            "Time to parse a request and decide its route",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1),
            registry=r,
        )
        self.live_sessions = Gauge("saar_live_sessions", "Sessions in router memory", registry=r)
        self.worker_picks = Counter(
            "saar_worker_picks", "Workers picked inside a model's pool", ["model", "worker"],
            registry=r,
        )
        self.pd_decisions = Counter(
            "saar_pd_decisions", "Prefill/decode decisions of requests to pools with prefill "
            "workers, by model and reason (cold, always: split; warm, never, "
            "no_prefill_worker: prefilled on the decode worker)", ["model", "reason"],
            registry=r,
        )
        self.prefill_picks = Counter(
            "saar_prefill_picks", "Prefill workers picked for split requests (the decode pick "
            "is saar_worker_picks)", ["model", "worker"], registry=r,
        )
        self.holds = Counter(
            "saar_holds", "Requests held at the processor, by kind (paused, locked, "
            "large_body) and how the hold ended (ready, timeout)", ["kind", "outcome"],
            registry=r,
        )
        self.paused_sessions = Gauge(
            "saar_admission_paused_sessions", "Sessions paused by admission", registry=r
        )
        self.flow_queued = Gauge(
            "saar_flow_queued", "Requests waiting in flow control's queue, by pool and class",
            ["model", "class"], registry=r,
        )
        self.flow_wait_seconds = Histogram(
            "saar_flow_wait_seconds", "Time requests waited in flow control's queue",
            ["model", "class"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.flow_shed = Counter(
            "saar_flow_shed", "Requests flow control shed, by pool, class and reason",
            ["model", "class", "reason"], registry=r,
        )
        self.prediction_error = Histogram(
            "saar_latency_prediction_error_ratio",
            "Relative error |predicted - observed| / observed of the latency predictor",
            ["kind"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5), registry=r,
        )
        self.worker_utilization = Gauge(
            "saar_admission_utilization", "Admission's KV utilization U per worker", ["worker"],
            registry=r,
        )
        self.scrape_failures = Counter(
            "saar_worker_scrape_failures", "Failed /metrics scrapes of workers", ["worker"],
            registry=r,
        )
        self.stream_failures = Counter(
            "saar_stream_failures", "ext_proc streams that ended with an internal error",
            registry=r,
        )
        self.store_up = Gauge(
            "saar_store_up", "1 while the shared state store answers (always 1 without one)",
            registry=r,
        )
        self.store_errors = Counter(
            "saar_store_errors", "Shared store calls that failed or timed out", ["op", "error"],
            registry=r,
        )
        self.store_seconds = Histogram(
            "saar_store_seconds", "Shared store round trips", ["op"],
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05),
            registry=r,
        )
        self.store_backlog = Gauge(
            "saar_store_backlog", "Write batches waiting for the shared store to come back",
            registry=r,
        )
        self.plugin_seconds = Histogram(
            "saar_scheduling_plugin_seconds",
            "Time each scheduling plugin (filter, scorer, picker, index) took per request",
            ["plugin"], buckets=_FAST, registry=r,
        )
        self.overhead_seconds = Histogram(
            "saar_router_overhead_seconds",
            "Processor time per routed request: every message the routing stream waited on",
            buckets=(0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.05, 0.25, 1.0),
            registry=r,
        )
        self.session_duration = Histogram(
            "saar_session_duration_seconds", "Sessions ended: first request to last answer",
            buckets=(1, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600), registry=r,
        )
        self.session_turns = Histogram(
            "saar_session_turns", "Sessions ended: requests routed", buckets=_COUNTS, registry=r
        )
        self.session_switches = Histogram(
            "saar_session_switches", "Sessions ended: model switches",
            buckets=(0, 1, 2, 3, 5, 8, 13, 21), registry=r,
        )
        self.session_locked_turns = Histogram(
            "saar_session_locked_turns", "Sessions ended: turns a hard lock kept on their model",
            buckets=_COUNTS, registry=r,
        )
        self.session_tool_seconds = Histogram(
            "saar_session_tool_seconds",
            "Tool time between turns: an answer that called tools to the next request",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300), registry=r,
        )
        self.replay_dropped = Counter(
            "saar_replay_shared_dropped",
            "Replay records not written to the shared store (its write queue was full)",
            registry=r,
        )
        self.store_dropped = Counter(
            "saar_store_dropped", "Write batches dropped from a full backlog (kept locally)",
            registry=r,
        )
        self.kv_hints = Counter(
            "saar_kv_hints", "KV hints sent to workers, by kind and outcome (delivered: the "
            "worker answered 2xx; failed: an error or no answer in time; dropped: the queue was "
            "full)", ["kind", "outcome"], registry=r,
        )
        self.standard = StandardMetrics(r)
        """``inference_objective_*``, ``gen_ai_*`` and ``saar_tokens_total``
        (``StandardFigures`` feeds them from the replay records)."""
