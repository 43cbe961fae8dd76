"""Load signals read from a model server's Prometheus ``/metrics`` page (vLLM or SGLang).

A server's page is mostly histograms the scheduler never reads: lines are picked by name with
plain string tests, and only the few picked are parsed, here (a sample line of the text
format: name, optional labels, value). With prometheus_client's parser a 6 KB page took
350 µs though only its 6 picked lines were given to it; this takes about 100 µs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from .types import EngineTotals

_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
_VLLM_CACHE_CONFIG = "vllm:cache_config_info"
_SGLANG_CAPACITY = "sglang:max_total_num_tokens"
_LORA = "vllm:lora_requests_info"
"""One sample per change, valued with its time; the newest says which adapters are running
and waiting (comma lists) and ``max_lora``."""
_TOTALS = {
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:prefix_cache_hits_total": "cached_tokens",
    "vllm:request_prefill_time_seconds_sum": "prefill_seconds",
    "vllm:request_prefill_time_seconds_count": "prefills",
    "vllm:inter_token_latency_seconds_sum": "itl_seconds",
    "vllm:inter_token_latency_seconds_count": "itls",
    "vllm:time_per_output_token_seconds_sum": "tpot_seconds",
    "vllm:time_per_output_token_seconds_count": "tpots",
}
"""The engine's running totals the predicted cost form learns its rates from (a histogram's
``_sum`` and ``_count`` only: its buckets are never parsed)."""
_NAMES = (*_RUNNING, *_WAITING, *_KV_USAGE, _VLLM_CACHE_CONFIG, _SGLANG_CAPACITY, _LORA,
          *_TOTALS)


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
    engine: EngineTotals | None = None
    """The engine's running totals, when the page has any of them."""


def parse_metrics(text: str) -> Signals:
    """The load signals in a Prometheus text page; counts sum over series (one per model
    served), KV usage takes the fullest. Raises ``ValueError`` on a malformed page."""
    running = waiting = 0.0
    kv_usage: float | None = None
    block_size = num_blocks = cpu_blocks = None
    seen: set[str] = set()
    lora: tuple[float, dict[str, str]] | None = None
    totals: dict[str, float] = {}
    for name, labels, value in _samples(text):
        seen.add(name)
        if name in _TOTALS:
            field = _TOTALS[name]
            totals[field] = totals.get(field, 0.0) + value
        elif name in _RUNNING:
            running += value
        elif name in _WAITING:
            waiting += value
        elif name in _KV_USAGE:
            kv_usage = max(value, kv_usage or 0.0)
        elif name == _VLLM_CACHE_CONFIG:
            block_size = _int_label(labels, "block_size")
            num_blocks = _int_label(labels, "num_gpu_blocks")
            cpu_blocks = _int_label(labels, "num_cpu_blocks")
        elif name == _SGLANG_CAPACITY:
            block_size, num_blocks = 1, int(value)
        elif name == _LORA and (lora is None or value >= lora[0]):
            lora = (value, labels)
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
        engine=_engine(totals),
    )


_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line whose name is one read here. Raises
    ``ValueError`` on a malformed one."""
    for line in text.splitlines():
        if not line.startswith(_NAMES):
            continue
        brace = line.find("{")
        if brace < 0:
            name, _, rest = line.partition(" ")
            labels: dict[str, str] = {}
        else:
            end = line.rfind("}")
            if end < brace:
                raise ValueError(f"unclosed labels: {line[:200]!r}")
            name, labels, rest = line[:brace], _labels(line[brace + 1:end]), line[end + 1:]
        value = rest.split()
        if not value:
            raise ValueError(f"no value: {line[:200]!r}")
        yield name.strip(), labels, float(value[0])


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    at = 0
    while at < len(text) and not text[at:].isspace():
        match = _LABEL.match(text, at)
        if match is None:
            raise ValueError(f"malformed labels: {text[:200]!r}")
        value = match[2]
        if "\\" in value:
            value = re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m[0]], value)
        labels[match[1]] = value
        at = match.end()
    return labels


def _engine(totals: dict[str, float]) -> EngineTotals | None:
    """The totals found; the older name of the inter-token latency only when the newer one is
    missing (a release that sends both counts the same gaps twice)."""
    tpot = totals.pop("tpot_seconds", None), totals.pop("tpots", None)
    if "itl_seconds" not in totals and tpot[0] is not None:
        totals["itl_seconds"], totals["itls"] = tpot[0], tpot[1] or 0.0
    return EngineTotals(**totals) if totals else None


def _names(labels: dict[str, str], name: str) -> frozenset[str]:
    return frozenset(n for n in labels.get(name, "").split(",") if n)


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(labels[name])
    except (KeyError, ValueError):
        return None
