"""The metrics other gateways' dashboards read, scraped from a running endpoint picker (``saar
serve --pool-name``, behind the real Envoy in a gateway's shape) after real requests over the
three APIs, streamed and not, and an upstream failure.

The names, types and label sets below are copied from the upstream sources, not from this
code: the Gateway API Inference Extension (release-1.5 ``pkg/epp/metrics/metrics.go``,
``pkg/epp/metrics/collectors/inference_pool.go``; the same in llm-d-router's
``pkg/epp/metrics/metrics.go``) and Envoy AI Gateway's Prometheus export of the OpenTelemetry
GenAI metrics (``tests/data-plane/vcr/prometheus_metrics_test.go``, ``examples/monitoring/
grafana-dashboard.json``).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest
from anthropic import Anthropic
from openai import APIStatusError, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from extproc.dev.harness import Gateway, run_gateway
from tests.e2e.conftest import e2e_config, post_json

pytestmark = pytest.mark.e2e

MODEL = "qwen3-8b"
_OBJECTIVE = {"model_name", "target_model_name"}
_GENAI = {"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_original_model",
          "gen_ai_request_model", "gen_ai_response_model"}
UPSTREAM: dict[str, tuple[str, set[str]]] = {
    # Gateway API Inference Extension: inference objective (per request)
    "inference_objective_request_total": ("counter", _OBJECTIVE | {"priority"}),
    "inference_objective_request_error_total": ("counter", _OBJECTIVE | {"error_code"}),
    "inference_objective_request_duration_seconds": ("histogram", _OBJECTIVE),
    "inference_objective_input_tokens": ("histogram", _OBJECTIVE),
    "inference_objective_output_tokens": ("histogram", _OBJECTIVE),
    "inference_objective_prompt_cached_tokens": ("histogram", _OBJECTIVE),
    "inference_objective_running_requests": ("gauge", {"model_name"}),
    "inference_objective_normalized_time_per_output_token_seconds": ("histogram", _OBJECTIVE),
    # Gateway API Inference Extension: inference pool
    "inference_pool_average_kv_cache_utilization": ("gauge", {"name"}),
    "inference_pool_average_queue_size": ("gauge", {"name"}),
    "inference_pool_average_running_requests": ("gauge", {"name"}),
    "inference_pool_ready_pods": ("gauge", {"name"}),
    "inference_pool_per_pod_queue_size": ("gauge", {"name", "model_server_pod"}),
    # Envoy AI Gateway's OpenTelemetry GenAI metrics, as Prometheus names them
    "gen_ai_client_token_usage": ("histogram", _GENAI | {"gen_ai_token_type"}),
    "gen_ai_server_request_duration_seconds": ("histogram", _GENAI),
    "gen_ai_server_time_to_first_token_seconds": ("histogram", _GENAI),
    "gen_ai_server_time_per_output_token_seconds": ("histogram", _GENAI),
}
"""Name → (type, label names)."""
STREAMED_ONLY = {"gen_ai_server_time_to_first_token_seconds",
                 "gen_ai_server_time_per_output_token_seconds"}
"""Observed for streamed answers only (Envoy AI Gateway's too): one here, a Chat Completion."""
ON_FAILURE = {"gen_ai_server_request_duration_seconds": {"error_type"}}
"""Labels a series has only when the request failed (Envoy AI Gateway adds ``error.type``)."""
TOKEN_TYPES = {"input", "cached_input", "output"}
"""Envoy AI Gateway's ``gen_ai.token.type`` values (``cached_input``: its proposal, #1959)."""


def scrape(url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return {f.name: f for f in text_string_to_metric_families(response.read().decode())}


def labelled(family, suffix: str = "") -> list[dict[str, str]]:
    """Each sample's labels as Prometheus keeps them: an empty value is no label."""
    return [{k: v for k, v in s.labels.items() if v and k != "le"} for s in family.samples
            if s.name == family.name + suffix]


@pytest.fixture(scope="module")
def picker(tmp_path_factory) -> Iterator[Gateway]:
    with run_gateway(e2e_config(), pools=[MODEL],
                     workdir=tmp_path_factory.mktemp("standard")) as gateway:
        yield gateway


def traffic(gateway: Gateway) -> None:
    chat = OpenAI(base_url=f"{gateway.url}/v1", api_key="key-standard", max_retries=0)
    ask = [{"role": "user", "content": "Summarise the parser module."}]
    chat.chat.completions.create(model=MODEL, messages=ask)
    for _ in chat.chat.completions.create(model=MODEL, messages=ask, stream=True,
                                          stream_options={"include_usage": True}):
        pass
    chat.responses.create(model=MODEL, input="Summarise the parser module.")
    Anthropic(base_url=gateway.url, api_key="key-standard", max_retries=0).messages.create(
        model=MODEL, max_tokens=32, messages=ask)
    for worker in gateway.sims[MODEL]:
        post_json(f"{worker}/admin/faults", {"fail_next": 1})
    with pytest.raises(APIStatusError):
        chat.chat.completions.create(model=MODEL, messages=ask)
    for worker in gateway.sims[MODEL]:
        post_json(f"{worker}/admin/faults", {"fail_next": 0})


def test_a_running_picker_exports_the_upstream_metrics(picker):
    traffic(picker)
    url = picker.pickers[MODEL].http
    deadline = time.monotonic() + 15
    while True:  # the outcomes land off the request path; the workers' scrapes on their own
        families = scrape(url)
        ready = families.get("inference_pool_ready_pods")
        errors = families.get("inference_objective_request_error")
        if (ready is not None and any(s.value > 0 for s in ready.samples)
                and errors is not None and errors.samples):
            break
        assert time.monotonic() < deadline, "the picker never reported its pool and errors"
        time.sleep(0.2)
    missing = []
    for name, (kind, labels) in UPSTREAM.items():
        family = families.get(name.removesuffix("_total") if kind == "counter" else name)
        if family is None or family.type != kind:
            missing.append(name)
            continue
        suffix = {"counter": "_total", "histogram": "_count", "gauge": ""}[kind]
        found = labelled(family, suffix)
        extra = ON_FAILURE.get(name, set())
        assert found and all(set(sample) - extra == labels for sample in found), (name, found)
    assert missing == []
    usage = families["gen_ai_client_token_usage"]
    assert {s["gen_ai_token_type"] for s in labelled(usage, "_count")} == TOKEN_TYPES
    operations = {s["gen_ai_operation_name"] for s in labelled(usage, "_count")}
    assert operations == {"chat", "responses", "messages"}
    codes = {s["error_code"] for s in labelled(families["inference_objective_request_error"],
                                               "_total")}
    assert codes == {"ModelServerError"}
    failed = [s for s in families["gen_ai_server_request_duration_seconds"].samples
              if s.name.endswith("_count") and s.labels.get("error_type")]
    assert failed and all(s.labels["error_type"].isdigit() for s in failed)
    for name in STREAMED_ONLY:
        (streamed,) = labelled(families[name], "_count")
        assert streamed["gen_ai_operation_name"] == "chat", (name, streamed)
        assert sum(s.value for s in families[name].samples if s.name.endswith("_count")) == 1
    pods = {s["model_server_pod"] for s in labelled(families["inference_pool_per_pod_queue_size"])}
    assert pods == {w.removeprefix("http://") for w in picker.sims[MODEL]}
    requests = sum(s.value for s in families["inference_objective_request"].samples
                   if s.name.endswith("_total"))
    assert requests == 5
