"""Load signals read from a model server's Prometheus ``/metrics`` page (vLLM or SGLang).

A server's page is mostly histograms the scheduler never reads, so lines are pre-filtered by
name with plain string tests before prometheus_client's parser sees them: a scrape every 50 ms
per worker must cost microseconds, not the milliseconds a full parse of a vLLM page takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
_VLLM_CACHE_CONFIG = "vllm:cache_config_info"
_SGLANG_CAPACITY = "sglang:max_total_num_tokens"
_LORA = "vllm:lora_requests_info"
"""One sample per change, valued with its time; the newest says which adapters are running
and waiting (comma lists) and ``max_lora``."""
_NAMES = (*_RUNNING, *_WAITING, *_KV_USAGE, _VLLM_CACHE_CONFIG, _SGLANG_CAPACITY, _LORA)


@dataclass(frozen=True, slots=True)
class Signals:
    """What one scrape said; ``None`` where the page did not say it."""

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    """Fraction of the KV cache in use by running requests, 0..1."""
    block_size: int | None = None
    num_blocks: int | None = None
    cpu_blocks: int | None = None
    adapters_running: frozenset[str] | None = None
    adapters_waiting: frozenset[str] | None = None
    max_lora: int | None = None


def parse_metrics(text: str) -> Signals:
    """The load signals in a Prometheus text page; counts sum over series (one per model
    served), KV usage takes the fullest. Raises ``ValueError`` on a malformed page."""
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_NAMES))
    running = waiting = 0.0
    kv_usage: float | None = None
    block_size = num_blocks = cpu_blocks = None
    seen: set[str] = set()
    lora: tuple[float, dict[str, str]] | None = None
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            name, value = sample.name, sample.value
            seen.add(name)
            if name in _RUNNING:
                running += value
            elif name in _WAITING:
                waiting += value
            elif name in _KV_USAGE:
                kv_usage = max(value, kv_usage or 0.0)
            elif name == _VLLM_CACHE_CONFIG:
                block_size = _int_label(sample.labels, "block_size")
                num_blocks = _int_label(sample.labels, "num_gpu_blocks")
                cpu_blocks = _int_label(sample.labels, "num_cpu_blocks")
            elif name == _SGLANG_CAPACITY:
                block_size, num_blocks = 1, int(value)
            elif name == _LORA and (lora is None or value >= lora[0]):
                lora = (value, sample.labels)
    return Signals(
        running=int(running) if seen.intersection(_RUNNING) else None,
        waiting=int(waiting) if seen.intersection(_WAITING) else None,
        kv_usage=None if kv_usage is None else min(max(kv_usage, 0.0), 1.0),
        block_size=block_size,
        num_blocks=num_blocks,
        cpu_blocks=cpu_blocks or None,
        adapters_running=None if lora is None else _names(lora[1], "running_lora_adapters"),
        adapters_waiting=None if lora is None else _names(lora[1], "waiting_lora_adapters"),
        max_lora=None if lora is None else _int_label(lora[1], "max_lora"),
    )


def _names(labels: dict[str, str], name: str) -> frozenset[str]:
    return frozenset(n for n in labels.get(name, "").split(",") if n)


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(labels[name])
    except (KeyError, ValueError):
        return None
