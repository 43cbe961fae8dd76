"""The upstream-named metrics from records and from the worker registry, as tables: each row a
request's events in the order they land, and the samples they must leave."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extproc.assembly import assemble
from extproc.config import WorkerSpec
from extproc.core.router import LocalDriver
from extproc.observability.replay import ReplayStore
from extproc.observability.standard import (
    FAIRNESS,
    LLMD_NAMES,
    MAX_RESPONSE_MODELS,
    PoolGauges,
    StandardFigures,
    StandardMetrics,
    pools_of,
)
from extproc.scheduling.workers import WorkerRegistry
from extproc.types import Api, ResponseSummary, Usage
from tests.conftest import FakeClock

MODELS = ("m-small", "m-large")


def record(n: int, *, api: str = "openai_chat", asked: str = "auto", model: str = "m-large",
           stream: bool = False) -> dict[str, Any]:
    return {"replay_id": f"rp-{n}", "time": 1000.0 + n, "model": model,
            "request": {"api": api, "model": asked, "stream": stream},
            "session": {"id": None}}


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "cached_tokens": cached}, "model": "m-large"}


class Run:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.figures = StandardFigures(StandardMetrics(self.registry), models=MODELS,
                                       logical_models=("auto",))
        self.replay = ReplayStore(100, clock=lambda: 1000.0)
        self.replay.subscribe(self.figures)

    def play(self, events: list[tuple[str, Any]]) -> None:
        for kind, value in events:
            if kind == "put":
                self.replay.put(value)
            else:
                self.replay.complete(kind, value)

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


OBJ = {"model_name": "auto", "target_model_name": "m-large"}
GENAI = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai",
         "gen_ai_original_model": "auto", "gen_ai_request_model": "m-large",
         "gen_ai_response_model": "m-large"}
OK = {"status": 200, "served_worker": "10.0.0.1:8000"}


def llmd_twin(name: str, labels: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """llm-d-router's sample of an Inference Extension sample (``LLMD_NAMES``): its request
    figures are labelled by model, target, fairness id and priority."""
    for old, new in LLMD_NAMES.items():
        suffix = name[len(old):]
        if name.startswith(old) and suffix in ("", "_sum", "_count", "_bucket"):
            if not old.startswith("inference_objective_"):
                return new + suffix, labels
            rest = {k: v for k, v in labels.items() if k not in ("model_name", "priority")}
            return new + suffix, {**OBJ, "fairness_id": FAIRNESS, "priority": "0", **rest}
    return None


@pytest.mark.parametrize(("events", "expected", "tracked"), [
    pytest.param(  # a JSON answer: status, then the body and the end together
        [("put", record(1)), ("rp-1", OK), ("rp-1", {**usage(1000, 50, 600), "latency_ms": 2000})],
        {("inference_objective_request_total", (("priority", "0"),)): 1,
         ("inference_objective_running_requests", (("model_name", "auto"),)): 0,
         ("inference_objective_request_duration_seconds_sum", ()): 2.0,
         ("inference_objective_input_tokens_sum", ()): 1000,
         ("inference_objective_output_tokens_sum", ()): 50,
         ("inference_objective_prompt_cached_tokens_sum", ()): 600,
         ("inference_objective_normalized_time_per_output_token_seconds_sum", ()): 0.04,
         ("gen_ai_client_token_usage_sum", (("gen_ai_token_type", "input"),)): 1000,
         ("gen_ai_client_token_usage_sum", (("gen_ai_token_type", "cached_input"),)): 600,
         ("gen_ai_client_token_usage_sum", (("gen_ai_token_type", "output"),)): 50,
         ("gen_ai_server_request_duration_seconds_count", (("error_type", ""),)): 1,
         ("saar_tokens_total", (("model", "m-large"), ("type", "cached_input"))): 600},
        0, id="answered"),
    pytest.param(  # a stream: the routing stream ends first, the observe stream reports later
        [("put", record(2, stream=True)), ("rp-2", OK), ("rp-2", {"latency_ms": 4000}),
         ("rp-2", usage(200, 100, 0)), ("rp-2", usage(200, 100, 0))],
        {("inference_objective_output_tokens_sum", ()): 100,
         ("inference_objective_normalized_time_per_output_token_seconds_sum", ()): 0.04,
         ("saar_tokens_total", (("model", "m-large"), ("type", "output"))): 100,
         ("gen_ai_client_token_usage_count", (("gen_ai_token_type", "output"),)): 1},
        0, id="usage-after-the-end-counted-once"),
    pytest.param(  # a stream whose client asked for no usage: the router's estimate
        [("put", record(8, stream=True)), ("rp-8", OK), ("rp-8", {"latency_ms": 1000}),
         ("rp-8", {"usage": {"prompt_tokens": 300, "completion_tokens": 20,
                             "cached_tokens": None, "source": "estimated"}})],
        {("inference_objective_input_tokens_sum", ()): 300,
         ("inference_objective_output_tokens_sum", ()): 20,
         ("inference_objective_prompt_cached_tokens_count", ()): None,
         ("gen_ai_client_token_usage_count", (("gen_ai_token_type", "cached_input"),)): None,
         ("saar_tokens_total", (("model", "m-large"), ("type", "input"))): 300},
        0, id="estimated-usage-its-cache-unknown"),
    pytest.param(  # the upstream failed
        [("put", record(3)), ("rp-3", {"status": 503, "served_worker": None}),
         ("rp-3", {"latency_ms": 10})],
        {("inference_objective_request_error_total", (("error_code", "ModelServerError"),)): 1,
         ("gen_ai_server_request_duration_seconds_count", (("error_type", "503"),)): 1,
         ("inference_objective_running_requests", (("model_name", "auto"),)): 0,
         ("inference_objective_input_tokens_count", ()): None},
        0, id="upstream-error"),
    pytest.param(  # refused by the processor (a lock's model taken out): it never ends
        [("put", record(4)), ("rp-4", {"status": 503, "refused": "model_unavailable"})],
        {("inference_objective_request_error_total", (("error_code", "ServiceUnavailable"),)): 1,
         ("inference_objective_running_requests", (("model_name", "auto"),)): 0},
        0, id="refused"),
    pytest.param(  # still in flight
        [("put", record(5)), ("rp-5", OK)],
        {("inference_objective_running_requests", (("model_name", "auto"),)): 1,
         ("inference_objective_request_duration_seconds_count", ()): None},
        1, id="running"),
    pytest.param(  # the adapter stamped the first chunk of a streamed answer
        [("put", record(6, stream=True)), ("rp-6", OK), ("rp-6", {"first_chunk_ms": 250}),
         ("rp-6", {**usage(10, 51, 0), "latency_ms": 1250})],
        {("gen_ai_server_time_to_first_token_seconds_sum", ()): 0.25,
         ("gen_ai_server_time_per_output_token_seconds_sum", ()): 0.02},
        0, id="first-chunk"),
    pytest.param(  # a JSON answer has no first token of its own
        [("put", record(7)), ("rp-7", OK), ("rp-7", {"first_chunk_ms": 250}),
         ("rp-7", {**usage(10, 51, 0), "latency_ms": 1250})],
        {("gen_ai_server_time_to_first_token_seconds_count", ()): None},
        0, id="no-ttft-unstreamed"),
])
def test_records_become_the_upstream_metrics(events, expected, tracked):
    run = Run()
    run.play(events)
    for (name, extra), value in expected.items():
        labels = dict(extra)
        if name.startswith("gen_ai"):
            base = {**GENAI, **labels}
        elif name.startswith("saar_"):
            base = labels
        else:
            base = {**({} if "model_name" in labels else OBJ), **labels}
        got = run.value(name, **base)
        assert got == pytest.approx(value) if value is not None else got is None, name
        twin = llmd_twin(name, base)
        if name.startswith("inference_objective_"):
            assert twin is not None, name
        if twin is not None:        # the same figure under llm-d-router's name
            got = run.value(twin[0], **twin[1])
            assert got == pytest.approx(value) if value is not None else got is None, twin
    assert len(run.figures) == tracked  # what is done is forgotten


@pytest.mark.parametrize(("api", "operation", "provider"), [
    ("openai_chat", "chat", "openai"), ("openai_responses", "responses", "openai"),
    ("anthropic_messages", "messages", "anthropic"),
    ("openai_completions", "completion", "openai")])
def test_operation_and_provider_by_api(api, operation, provider):
    run = Run()
    run.play([("put", record(1, api=api, asked="m-small", model="m-small")), ("rp-1", OK),
              ("rp-1", {**usage(5, 5, 0), "model": "m-small", "latency_ms": 100})])
    labels = {**GENAI, "gen_ai_operation_name": operation, "gen_ai_provider_name": provider,
              "gen_ai_original_model": "m-small", "gen_ai_request_model": "m-small",
              "gen_ai_response_model": "m-small", "gen_ai_token_type": "input"}
    assert run.value("gen_ai_client_token_usage_count", **labels) == 1


def test_labels_stay_bounded():
    """A model the config does not know is ``other``; so is every response model name beyond
    the first few an upstream made up."""
    run = Run()
    for n in range(MAX_RESPONSE_MODELS + 10):
        run.play([("put", record(n, asked="who-knows")), (f"rp-{n}", OK),
                  (f"rp-{n}", {**usage(1, 1, 0), "model": f"made-up-{n}", "latency_ms": 1})])
    families = {m.name: m for m in run.registry.collect()}
    responded = {s.labels["gen_ai_response_model"]
                 for s in families["gen_ai_client_token_usage"].samples}
    assert len(responded) == MAX_RESPONSE_MODELS + 1 and "other" in responded
    asked = {s.labels["model_name"] for s in families["inference_objective_request"].samples}
    assert asked == {"other"}
    assert len(run.figures) == 0


def test_a_routed_request_through_the_router_counts(session_config):
    """The records the router really writes (``LocalDriver``: route, answer, end)."""
    clock = FakeClock()
    parts = assemble(session_config, clock=clock)
    parts.replay.subscribe(StandardFigures.from_config(parts.metrics.standard, session_config))
    driver = LocalDriver(parts.router)
    routed = driver.route(Api.CHAT, {"authorization": "Bearer k", "x-session-id": "s"},
                          b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}')
    clock.advance(1.5)
    driver.respond(routed, ResponseSummary(status=200, model=routed.model, finish_reason="stop",
                                           usage=Usage(120, 30, 100)))
    registry = parts.metrics.registry
    objective = {"model_name": "auto", "target_model_name": routed.model}
    assert registry.get_sample_value("inference_objective_request_total",
                                     {**objective, "priority": "0"}) == 1
    assert registry.get_sample_value("inference_objective_request_duration_seconds_sum",
                                     objective) == pytest.approx(1.5)
    assert registry.get_sample_value("inference_objective_normalized_time_per_output_token"
                                     "_seconds_sum", objective) == pytest.approx(0.05)
    for kind, count in (("input", 120), ("cached_input", 100), ("output", 30)):
        assert registry.get_sample_value("saar_tokens_total",
                                         {"model": routed.model, "type": kind}) == count


def scrape(model: str, *, running: int, waiting: int, kv: float) -> str:
    return (f'vllm:num_requests_running{{model_name="{model}"}} {running}\n'
            f'vllm:num_requests_waiting{{model_name="{model}"}} {waiting}\n'
            f'vllm:kv_cache_usage_perc{{model_name="{model}"}} {kv}\n')


def test_pool_gauges_read_the_registry(session_config):
    clock = FakeClock()
    model = "qwen3-32b"
    models = {model: replace(session_config.models[model], endpoints=(), workers=tuple(
        WorkerSpec(address=f"10.0.0.{i}:8000") for i in (1, 2, 3)))}
    workers = WorkerRegistry(models, clock=clock, staleness_seconds=2.0)
    gauges = PoolGauges(workers, {"my-pool": model})
    registry = CollectorRegistry()
    registry.register(gauges)
    assert registry.get_sample_value("inference_pool_ready_pods", {"name": "my-pool"}) == 0
    assert registry.get_sample_value("inference_pool_average_queue_size",
                                     {"name": "my-pool"}) is None  # nothing to average yet
    workers.apply_scrape("10.0.0.1:8000", scrape(model, running=4, waiting=2, kv=0.5), clock())
    workers.apply_scrape("10.0.0.2:8000", scrape(model, running=2, waiting=6, kv=0.3), clock())
    workers.apply_scrape("10.0.0.3:8000", scrape(model, running=9, waiting=9, kv=0.9), clock())
    workers.set_healthy("10.0.0.3:8000", False)  # out of the pool's averages, still listed
    pool = {"name": "my-pool"}
    assert registry.get_sample_value("inference_pool_ready_pods", pool) == 2
    assert registry.get_sample_value("inference_pool_average_kv_cache_utilization",
                                     pool) == pytest.approx(0.4)
    assert registry.get_sample_value("inference_pool_average_queue_size", pool) == 4
    assert registry.get_sample_value("inference_pool_average_running_requests", pool) == 3
    for address, waiting in (("10.0.0.1:8000", 2), ("10.0.0.2:8000", 6), ("10.0.0.3:8000", 9)):
        assert registry.get_sample_value("inference_pool_per_pod_queue_size",
                                         {**pool, "model_server_pod": address}) == waiting
        assert registry.get_sample_value("llm_d_epp_per_endpoint_queue_size",
                                         {**pool, "model_server_endpoint": address}) == waiting
    for upstream in ("inference_pool_ready_pods", "inference_pool_average_kv_cache_utilization",
                     "inference_pool_average_queue_size",
                     "inference_pool_average_running_requests"):
        assert registry.get_sample_value(LLMD_NAMES[upstream], pool) == pytest.approx(
            registry.get_sample_value(upstream, pool)), upstream
    clock.advance(3)  # no scrape within the staleness window: no worker is ready
    assert registry.get_sample_value("inference_pool_ready_pods", pool) == 0
    assert registry.get_sample_value("llm_d_epp_ready_endpoints", pool) == 0


def test_pools_of_a_picker_and_of_a_router(session_config):
    from extproc.config import Discovery
    from extproc.service.roles import pool_config

    picker = pool_config(session_config, "qwen3-8b")
    assert pools_of(picker) == {"qwen3-8b": "qwen3-8b"}
    named = replace(picker, scheduling=replace(
        picker.scheduling, discovery=Discovery(mode="kubernetes", inference_pool="qwen-pool")))
    assert pools_of(named) == {"qwen-pool": "qwen3-8b"}
    assert pools_of(session_config) == {m: m for m in session_config.models}
    off = replace(session_config, scheduling=replace(session_config.scheduling, enabled=False))
    assert pools_of(off) == {}
