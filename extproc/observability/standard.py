"""The metrics other gateways' dashboards read, under their upstream names and label sets.

* The Gateway API Inference Extension's endpoint-picker metrics (``pkg/epp/metrics/metrics.go``
  and ``collectors/inference_pool.go``; the same in llm-d-router, where they are kept beside its
  ``llm_d_epp_*`` names), which its stock Grafana dashboard (``tools/dashboards/
  inference_gateway.json``) reads: ``inference_objective_*`` per request, ``inference_pool_*``
  per pool and worker. Each also under llm-d-router's own name (``LLMD_NAMES``), which that
  router exports beside them and which upstream now marks the deprecated ones in favour of:
  ``llm_d_epp_*`` (``pkg/epp/metrics/llm_d_router_metrics.go``), its request metrics labelled
  with a ``fairness_id`` too (``default-flow``, llm-d's for a request that names none).
* The OpenTelemetry GenAI metrics as Envoy AI Gateway exports them to Prometheus (dots become
  underscores, the unit ``s`` a ``_seconds`` suffix, the token histogram keeps its name):
  ``gen_ai_client_token_usage`` by ``gen_ai_token_type`` (``input``, ``cached_input``,
  ``output``), ``gen_ai_server_request_duration_seconds``, ``gen_ai_server_time_to_first_token
  _seconds``, ``gen_ai_server_time_per_output_token_seconds``.

``StandardFigures`` is a ``RecordListener``: it reads the replay records as they land (the
decision, then the outcome as it grows: the status, what the answer carried, the latency), each
part once. ``PoolGauges`` is a collector that reads the worker registry at every scrape. Every
label value is bounded: models from the config (a response's model name beyond a few distinct
ones is ``other``), workers from the registry, fixed token types, error codes and status codes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from .replay import Record

if TYPE_CHECKING:
    from ..config import Config
    from ..scheduling.workers import WorkerRegistry

OBJECTIVE = ("model_name", "target_model_name")
"""Upstream's ``modelLabels``: the model the client named, the model it was sent to."""
GENAI = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_original_model",
         "gen_ai_request_model", "gen_ai_response_model")
"""Envoy AI Gateway's base attributes, as Prometheus labels."""

_LATENCY = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
            15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
_INPUT = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072,
          262144, 524288, 1048576)
_OUTPUT = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
           67108864)
_DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
             81.92)
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
         10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)

OPERATIONS = {"openai_chat": "chat", "openai_responses": "responses",
              "anthropic_messages": "messages", "openai_completions": "completion"}
"""``gen_ai.operation.name`` per API, Envoy AI Gateway's values."""
PROVIDERS = {"openai_chat": "openai", "openai_responses": "openai",
             "anthropic_messages": "anthropic", "openai_completions": "openai"}
"""``gen_ai.provider.name`` by the API schema the upstream speaks, as Envoy AI Gateway does."""
TOKEN_TYPES = ("input", "cached_input", "output")
"""``input`` counts every prompt token, the cached ones included (``cached_input``)."""
PRIORITY = "0"
"""The Inference Extension's default priority (a request no InferenceObjective names)."""
FAIRNESS = "default-flow"
"""llm-d's fairness id of a request that names none (``x-gateway-inference-fairness-id``)."""
LLMD = (*OBJECTIVE, "fairness_id", "priority")
"""llm-d-router's labels of its ``llm_d_epp_request_*`` metrics."""
LLMD_NAMES = {
    "inference_objective_request_total": "llm_d_epp_request_total",
    "inference_objective_request_error_total": "llm_d_epp_request_error_total",
    "inference_objective_request_duration_seconds": "llm_d_epp_request_duration_seconds",
    "inference_objective_input_tokens": "llm_d_epp_request_input_tokens",
    "inference_objective_output_tokens": "llm_d_epp_request_output_tokens",
    "inference_objective_prompt_cached_tokens": "llm_d_epp_request_cached_tokens",
    "inference_objective_running_requests": "llm_d_epp_request_running",
    "inference_objective_normalized_time_per_output_token_seconds":
        "llm_d_epp_request_ntpot_seconds",
    "inference_pool_average_kv_cache_utilization": "llm_d_epp_average_kv_cache_utilization",
    "inference_pool_average_queue_size": "llm_d_epp_average_queue_size",
    "inference_pool_average_running_requests": "llm_d_epp_average_running_requests",
    "inference_pool_ready_pods": "llm_d_epp_ready_endpoints",
    "inference_pool_per_pod_queue_size": "llm_d_epp_per_endpoint_queue_size",
}
"""The Inference Extension's name of each figure → llm-d-router's (both are exported)."""
OTHER = "other"
MAX_RESPONSE_MODELS = 32
"""Distinct model names from responses kept as labels (beyond the config's); then ``other``."""
MAX_RUNNING = 100_000
"""Requests tracked until they end; the oldest beyond are forgotten (and no longer running)."""
MAX_AWAITING = 4096
"""Requests that ended before their usage arrived (a streamed answer's observe stream may
report after the routing stream ended): the oldest beyond are forgotten."""


def error_code(status: int, refused: str | None) -> str | None:
    """The Inference Extension's canonical error code of an outcome; None for a success. Any
    upstream answer but a 2xx is ``ModelServerError`` (upstream: any status but 200); a
    refusal of the processor's own is named by its status."""
    if refused is not None:
        return {429: "ResourceExhausted", 503: "ServiceUnavailable", 400: "BadRequest",
                404: "NotFound"}.get(status, "Internal")
    return None if 200 <= status < 300 else "ModelServerError"


def error_type(status: int) -> str:
    """``error.type`` of a failed request: its status code (the convention's example), every
    code outside the HTTP range ``_OTHER``."""
    return str(status) if 100 <= status <= 599 else "_OTHER"


class StandardMetrics:
    """The instruments, in ``registry`` (their names and label sets are the upstream ones)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "inference_objective_request_total", "Counter of inference objective requests "
            "broken out for each model and target model.", [*OBJECTIVE, "priority"], registry=r)
        self.errors = Counter(
            "inference_objective_request_error_total", "Counter of inference objective "
            "requests errors broken out for each model and target model.",
            [*OBJECTIVE, "error_code"], registry=r)
        self.duration = Histogram(
            "inference_objective_request_duration_seconds", "Inference objective response "
            "latency distribution in seconds for each model and target model.", OBJECTIVE,
            buckets=_LATENCY, registry=r)
        self.input_tokens = Histogram(
            "inference_objective_input_tokens", "Inference objective input token count "
            "distribution for requests in each model.", OBJECTIVE, buckets=_INPUT, registry=r)
        self.output_tokens = Histogram(
            "inference_objective_output_tokens", "Inference objective output token count "
            "distribution for requests in each model.", OBJECTIVE, buckets=_OUTPUT, registry=r)
        self.cached_tokens = Histogram(
            "inference_objective_prompt_cached_tokens", "Inference objective prompt cached "
            "token count distribution for requests in each model.", OBJECTIVE, buckets=_INPUT,
            registry=r)
        self.running = Gauge(
            "inference_objective_running_requests", "Inference objective number of running "
            "requests in each model.", ["model_name"], registry=r)
        self.ntpot = Histogram(
            "inference_objective_normalized_time_per_output_token_seconds", "Inference "
            "objective latency divided by number of output tokens in seconds for each model "
            "and target model.", OBJECTIVE, buckets=_NTPOT, registry=r)
        self.token_usage = Histogram(
            "gen_ai_client_token_usage", "Number of tokens processed.",
            [*GENAI, "gen_ai_token_type"], buckets=_TOKENS, registry=r)
        self.request_duration = Histogram(
            "gen_ai_server_request_duration_seconds", "Generative AI server request duration "
            "such as time-to-last byte or last output token.", [*GENAI, "error_type"],
            buckets=_DURATION, registry=r)
        self.time_to_first_token = Histogram(
            "gen_ai_server_time_to_first_token_seconds", "Time to receive first token in "
            "streaming responses.", GENAI, buckets=_TTFT, registry=r)
        self.time_per_output_token = Histogram(
            "gen_ai_server_time_per_output_token_seconds", "Time per output token generated "
            "after the first token for successful responses.", GENAI, buckets=_TPOT,
            registry=r)
        # llm-d-router's names of the same figures (``LLMD_NAMES``), with its label sets.
        self.llmd_requests = Counter(
            "llm_d_epp_request_total", "Total number of processed requests.", LLMD, registry=r)
        self.llmd_errors = Counter(
            "llm_d_epp_request_error_total", "Total number of request errors.",
            [*LLMD, "error_code"], registry=r)
        self.llmd_duration = Histogram(
            "llm_d_epp_request_duration_seconds", "End-to-end request latency distribution "
            "in seconds.", LLMD, buckets=_LATENCY, registry=r)
        self.llmd_input_tokens = Histogram(
            "llm_d_epp_request_input_tokens", "Input token count distribution per request.",
            LLMD, buckets=_INPUT, registry=r)
        self.llmd_output_tokens = Histogram(
            "llm_d_epp_request_output_tokens", "Output token count distribution per request.",
            LLMD, buckets=_OUTPUT, registry=r)
        self.llmd_cached_tokens = Histogram(
            "llm_d_epp_request_cached_tokens", "Distribution of prompt tokens read from cache "
            "per request, as reported by the model server in the response.", LLMD,
            buckets=_INPUT, registry=r)
        self.llmd_running = Gauge(
            "llm_d_epp_request_running", "Current number of active running requests.", LLMD,
            registry=r)
        self.llmd_ntpot = Histogram(
            "llm_d_epp_request_ntpot_seconds", "Normalized time per output token in seconds "
            "(end-to-end latency divided by output token count).", LLMD, buckets=_NTPOT,
            registry=r)
        self.tokens = Counter(
            "saar_tokens", "Tokens the upstreams reported, by the model that served them and "
            "type (input includes cached_input)", ["model", "type"], registry=r)


@dataclass(slots=True)
class _Request:
    """What has been counted of one request so far."""

    model_name: str
    target: str
    api: str
    stream: bool
    status: bool = False
    usage: bool = False
    latency: bool = False
    ttft: bool = False
    tpot: bool = False
    ntpot: bool = False
    running: bool = True


class StandardFigures:
    """A ``RecordListener`` feeding ``StandardMetrics`` from the replay records."""

    def __init__(self, metrics: StandardMetrics, *, models: Iterable[str],
                 logical_models: Iterable[str] = ()) -> None:
        self._metrics = metrics
        self._models = frozenset((*models, *logical_models))
        self._responded: set[str] = set()
        """Model names seen in responses beyond the config's (at most ``MAX_RESPONSE_MODELS``)."""
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._requests: OrderedDict[str, _Request] = OrderedDict()
        """Requests still running."""
        self._awaiting: OrderedDict[str, _Request] = OrderedDict()
        """Requests that ended successfully and may still report their usage."""

    @classmethod
    def from_config(cls, metrics: StandardMetrics, config: Config) -> StandardFigures:
        return cls(metrics, models=config.models, logical_models=config.routing.logical_models)

    def __len__(self) -> int:
        return len(self._requests) + len(self._awaiting)

    def recorded(self, record: Record) -> None:
        request = record.get("request") or {}
        state = _Request(self._known(request.get("model")), self._known(record.get("model")),
                         str(request.get("api")), bool(request.get("stream")))
        self._child(self._metrics.requests, state.model_name, state.target, PRIORITY).inc()
        self._child(self._metrics.llmd_requests, *self._llmd(state)).inc()
        self._child(self._metrics.running, state.model_name).inc()
        self._child(self._metrics.llmd_running, *self._llmd(state)).inc()
        self._requests[record["replay_id"]] = state
        while len(self._requests) > MAX_RUNNING:
            self._stop_running(self._requests.popitem(last=False)[1])

    def completed(self, record: Record) -> None:
        replay_id = record["replay_id"]
        state = self._requests.get(replay_id) or self._awaiting.get(replay_id)
        if state is None:
            return
        outcome = record.get("outcome") or {}
        status = int(outcome["status"]) if outcome.get("status") is not None else None
        genai = self._genai(state, record, outcome)
        if status is not None and not state.status:
            self._answered(state, status, outcome.get("refused"))
        usage = outcome.get("usage")
        if usage and not state.usage:
            self._used(state, genai, usage)
        latency = outcome.get("latency_ms")
        if latency is not None and not state.latency:
            self._ended(state, genai, latency / 1000, status)
        self._timed(state, genai, latency, outcome.get("first_chunk_ms"),
                    int(usage["completion_tokens"]) if usage else 0)
        if not state.running and replay_id in self._requests:
            del self._requests[replay_id]
            if not state.usage and status is not None and 200 <= status < 300:
                self._awaiting[replay_id] = state  # its usage may still come
                while len(self._awaiting) > MAX_AWAITING:
                    self._awaiting.popitem(last=False)
        elif state.usage and replay_id in self._awaiting:
            del self._awaiting[replay_id]

    def _answered(self, state: _Request, status: int, refused: str | None) -> None:
        state.status = True
        code = error_code(status, refused)
        if code is not None:
            self._child(self._metrics.errors, state.model_name, state.target, code).inc()
            self._child(self._metrics.llmd_errors, *self._llmd(state), code).inc()
        if refused is not None:  # refused at the processor: it never ran, it will not end
            self._stop_running(state)

    def _used(self, state: _Request, genai: tuple[str, ...], usage: Record) -> None:
        state.usage = True
        m, objective = self._metrics, (state.model_name, state.target)
        prompt, output = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        cached = usage.get("cached_tokens")  # None: estimated usage, its cache unknown
        llmd = self._llmd(state)
        self._child(m.input_tokens, *objective).observe(prompt)
        self._child(m.llmd_input_tokens, *llmd).observe(prompt)
        self._child(m.output_tokens, *objective).observe(output)
        self._child(m.llmd_output_tokens, *llmd).observe(output)
        if cached is not None:
            self._child(m.cached_tokens, *objective).observe(int(cached))
            self._child(m.llmd_cached_tokens, *llmd).observe(int(cached))
        for kind, count in zip(TOKEN_TYPES, (prompt, cached, output), strict=True):
            if count is not None:
                self._child(m.token_usage, *genai, kind).observe(int(count))
                self._child(m.tokens, state.target, kind).inc(int(count))

    def _ended(self, state: _Request, genai: tuple[str, ...], seconds: float,
               status: int | None) -> None:
        state.latency = True
        self._stop_running(state)
        self._child(self._metrics.duration, state.model_name, state.target).observe(seconds)
        self._child(self._metrics.llmd_duration, *self._llmd(state)).observe(seconds)
        failed = status is not None and not 200 <= status < 300
        kind = error_type(status) if failed and status is not None else ""
        self._child(self._metrics.request_duration, *genai, kind).observe(seconds)

    def _timed(self, state: _Request, genai: tuple[str, ...], latency_ms: float | None,
               first_ms: float | None, output: int) -> None:
        """The per-token figures, once what each needs has arrived (in whatever order):
        NTPOT (latency / output tokens, upstream's), and for a streamed answer whose first
        chunk was stamped, TTFT and TPOT ((latency - TTFT) / (output - 1), the convention's)."""
        m = self._metrics
        if latency_ms is not None and output > 0 and not state.ntpot:
            state.ntpot = True
            ntpot = latency_ms / 1000 / output
            self._child(m.ntpot, state.model_name, state.target).observe(ntpot)
            self._child(m.llmd_ntpot, *self._llmd(state)).observe(ntpot)
        if first_ms is None or not state.stream:
            return
        if not state.ttft:
            state.ttft = True
            self._child(m.time_to_first_token, *genai).observe(first_ms / 1000)
        if latency_ms is not None and output > 1 and latency_ms > first_ms and not state.tpot:
            state.tpot = True
            self._child(m.time_per_output_token, *genai).observe(
                (latency_ms - first_ms) / 1000 / (output - 1))

    def _genai(self, state: _Request, record: Record, outcome: Record) -> tuple[str, ...]:
        request = record.get("request") or {}
        return (OPERATIONS.get(state.api, OTHER), PROVIDERS.get(state.api, OTHER),
                self._known(request.get("model")), state.target,
                self._responded_as(outcome.get("model")) or state.target)

    @staticmethod
    def _llmd(state: _Request) -> tuple[str, str, str, str]:
        """A request's ``LLMD`` label values."""
        return state.model_name, state.target, FAIRNESS, PRIORITY

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once (the values are bounded)."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _known(self, model: object) -> str:
        return model if isinstance(model, str) and model in self._models else OTHER

    def _responded_as(self, model: object) -> str | None:
        if not isinstance(model, str) or not model:
            return None
        if model in self._models or model in self._responded:
            return model
        if len(self._responded) < MAX_RESPONSE_MODELS:
            self._responded.add(model)
            return model
        return OTHER

    def _stop_running(self, state: _Request) -> None:
        if state.running:
            state.running = False
            self._child(self._metrics.running, state.model_name).dec()
            self._child(self._metrics.llmd_running, *self._llmd(state)).dec()


class PoolGauges:
    """The Inference Extension's pool gauges, read from the worker registry at each scrape:
    per pool the workers ready (healthy, scraped within the staleness window) and their
    average KV-cache use, queue and running requests (over the ready ones, as upstream), and
    each worker's queue; each under llm-d-router's name too (``LLMD_NAMES``)."""

    def __init__(self, registry: WorkerRegistry, pools: Mapping[str, str]) -> None:
        """``pools``: pool name (the ``name`` label: the InferencePool's) → its model."""
        self._registry = registry
        self._pools = dict(pools)

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        named = families[:5], families[5:]       # upstream's names, llm-d's
        for name, model in self._pools.items():
            workers = self._registry.pool(model)
            fresh = [w for w in workers if w.healthy and not w.stale]
            for kv, queue, running, ready, per_pod in named:
                ready.add_metric([name], len(fresh))
                if fresh:
                    kv.add_metric([name], sum(w.kv_usage for w in fresh) / len(fresh))
                    queue.add_metric([name], sum(w.waiting for w in fresh) / len(fresh))
                    running.add_metric([name], sum(w.running for w in fresh) / len(fresh))
                for worker in workers:
                    per_pod.add_metric([name, worker.address], worker.waiting)
        yield from families

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        """Upstream's five families, then the same five under llm-d-router's names."""
        return (
            GaugeMetricFamily("inference_pool_average_kv_cache_utilization",
                              "The average kv cache utilization for an inference server pool.",
                              labels=["name"]),
            GaugeMetricFamily("inference_pool_average_queue_size", "The average number of "
                              "requests pending in the model server queue.", labels=["name"]),
            GaugeMetricFamily("inference_pool_average_running_requests", "The average number "
                              "of running requests across model servers in the pool.",
                              labels=["name"]),
            GaugeMetricFamily("inference_pool_ready_pods", "The number of ready pods in the "
                              "inference server pool.", labels=["name"]),
            GaugeMetricFamily("inference_pool_per_pod_queue_size", "The total number of "
                              "requests pending in the model server queue for each underlying "
                              "pod.", labels=["name", "model_server_pod"]),
            GaugeMetricFamily("llm_d_epp_average_kv_cache_utilization", "The average kv "
                              "cache utilization for an inference server pool.",
                              labels=["name"]),
            GaugeMetricFamily("llm_d_epp_average_queue_size", "The average number of "
                              "requests pending in the model server queue.", labels=["name"]),
            GaugeMetricFamily("llm_d_epp_average_running_requests", "The average number of "
                              "running requests across model servers in the pool.",
                              labels=["name"]),
            GaugeMetricFamily("llm_d_epp_ready_endpoints", "The number of ready endpoints in "
                              "the inference server pool.", labels=["name"]),
            GaugeMetricFamily("llm_d_epp_per_endpoint_queue_size", "The total number of "
                              "requests pending in the model server queue for each underlying "
                              "endpoint.", labels=["name", "model_server_endpoint"]),
        )


def pools_of(config: Config) -> dict[str, str]:
    """Pool name → model of the pools this service schedules: an endpoint picker's one (named
    as its InferencePool when discovery names one), else every model's when it schedules."""
    scheduling = config.scheduling
    if scheduling.pool_name is not None:
        name = scheduling.discovery.inference_pool or scheduling.pool_name
        return {name: scheduling.pool_name}
    if not scheduling.enabled:
        return {}
    return {model: model for model in config.models}
