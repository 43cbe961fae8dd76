from __future__ import annotations

import pytest

from extproc.dev.sim.metrics import SimMetrics
from extproc.scheduling.signals import Signals, parse_metrics
from extproc.scheduling.types import EngineTotals

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",engine_type="unified"} 5.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",engine_type="unified"} 7.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",engine_type="unified"} 0.42
# HELP sglang:max_total_num_tokens Maximum total number of tokens
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="qwen"} 161721.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="qwen"} 3.0
sglang:time_to_first_token_seconds_sum{model_name="qwen"} 0.3
sglang:time_to_first_token_seconds_count{model_name="qwen"} 3.0
"""

OLD_VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 1.0
vllm:num_requests_running{model_name="b"} 2.0
vllm:gpu_cache_usage_perc{model_name="a"} 0.3
vllm:gpu_cache_usage_perc{model_name="b"} 0.6
"""


def sim_page() -> str:
    metrics = SimMetrics(model="m", block_size=16, num_gpu_blocks=2048)
    metrics.running.set(3)
    metrics.waiting.set(2)
    metrics.kv_cache_usage.set(0.25)
    return metrics.render().decode()


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        (sim_page(), Signals(running=3, waiting=2, kv_usage=0.25, block_size=16, num_blocks=2048,
                             engine=EngineTotals(prompt_tokens=0.0, cached_tokens=0.0))),
        (SGLANG, Signals(running=5, waiting=7, kv_usage=0.42, block_size=1, num_blocks=161721)),
        (OLD_VLLM, Signals(running=3, kv_usage=0.6)),
        ("", Signals()),
        ("vllm:kv_cache_usage_perc 1.7\n", Signals(kv_usage=1.0)),
        ('vllm:cache_config_info{block_size="x"} 1\n', Signals()),
    ],
    ids=["vllm-sim", "sglang", "old-vllm-two-models", "empty", "usage-clamped", "bad-label"],
)
def test_parse_metrics(page: str, expected: Signals) -> None:
    assert parse_metrics(page) == expected


VLLM_TOTALS = """\
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 12000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 9000.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 4.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.6
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 5.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 2.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 2.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 100.0
"""


def test_the_engines_running_totals_are_read_once_each() -> None:
    """The prefill time and inter-token gaps the predicted cost form learns from; the older
    name of the gaps does not count them twice, and a histogram's buckets are not read."""
    assert parse_metrics(VLLM_TOTALS).engine == EngineTotals(
        prompt_tokens=12000.0, cached_tokens=9000.0, prefill_seconds=0.6, prefills=5.0,
        itl_seconds=2.0, itls=100.0)
    older = "\n".join(line for line in VLLM_TOTALS.splitlines() if "inter_token" not in line)
    assert parse_metrics(older).engine == EngineTotals(
        prompt_tokens=12000.0, cached_tokens=9000.0, prefill_seconds=0.6, prefills=5.0,
        itl_seconds=2.0, itls=100.0)


def test_a_malformed_page_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_metrics("vllm:num_requests_running{model_name= 1\n")


LORA = """\
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.8e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.6e9
"""


def test_the_lora_gauge_newest_sample_names_the_adapters() -> None:
    signals = parse_metrics(LORA)
    assert signals.adapters_running == frozenset({"a", "b"})
    assert signals.adapters_waiting == frozenset({"c"})
    assert signals.max_lora == 4
    assert parse_metrics("").adapters_running is None  # not reported: unchanged
