"""vLLM's Prometheus metrics (the names a load-aware router scrapes), plus the oracle's counters.

Each simulator owns a ``CollectorRegistry`` so several can run in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from .oracle import VIOLATION_KINDS

MODEL = ("model_name",)


class SimMetrics:
    def __init__(
        self, *, model: str, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int = 0
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.running = Gauge(
            "vllm:num_requests_running", "Requests in model execution batches.", MODEL, registry=r
        ).labels(model)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be processed.", MODEL, registry=r
        ).labels(model)
        self.kv_cache_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage of running requests, 0..1.",
            MODEL,
            registry=r,
        ).labels(model)
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            MODEL,
            registry=r,
        ).labels(model)
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", MODEL, registry=r
        ).labels(model)
        self.external_queries = Counter(
            "vllm:external_prefix_cache_queries",
            "Prompt tokens looked up beyond the device cache (host memory).",
            MODEL,
            registry=r,
        ).labels(model)
        self.external_hits = Counter(
            "vllm:external_prefix_cache_hits",
            "Prompt tokens found in host memory and copied back instead of computed.",
            MODEL,
            registry=r,
        ).labels(model)
        self.cpu_blocks = Gauge(
            "saar_sim_kv_cpu_blocks", "KV blocks held in host memory.", registry=r
        )
        self.hints = Counter(
            "saar_sim_kv_hints",
            "KV hints received from the router, by kind and whether they were applied.",
            ("kind", "outcome"),
            registry=r,
        )
        self.hint_blocks = Counter(
            "saar_sim_kv_hint_blocks", "KV blocks the hints moved, pinned or freed.", ("kind",),
            registry=r,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", MODEL, registry=r
        ).labels(model)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", MODEL, registry=r
        ).labels(model)
        self.request_success = Counter(
            "vllm:request_success",
            "Successfully finished requests.",
            (*MODEL, "finished_reason"),
            registry=r,
        )
        cache_config = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig.",
            ("block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching"),
            registry=r,
        )
        cache_config.labels(str(block_size), str(num_gpu_blocks), str(num_cpu_blocks),
                            "True").set(1)
        self.violations = Counter(
            "saar_sim_continuity_violations",
            "Requests leaning on state this instance never issued, by kind.",
            ("kind",),
            registry=r,
        )
        for kind in VIOLATION_KINDS:
            self.violations.labels(kind)
        self.injected_errors = Counter(
            "saar_sim_injected_errors", "Requests failed on purpose by fault injection.", registry=r
        )
        self.role = Gauge("saar_sim_role_info", "This worker's phase (prefill, decode, both).",
                          ("role",), registry=r)
        self.remote_prefills = Counter(
            "saar_sim_remote_prefills", "Requests this decode worker had a prefill worker "
            "prefill first (llm-d's sidecar), by outcome (ok, failed: prefilled here)",
            ("outcome",), registry=r)
        self.prefill_only = Counter(
            "saar_sim_prefill_only_requests", "Prefill-only calls served for decode workers",
            registry=r)
        self.transferred_tokens = Counter(
            "saar_sim_kv_transferred_tokens", "Prompt tokens whose KV came from a prefill worker",
            registry=r)
        self.lora_info = Gauge(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            ("running_lora_adapters", "waiting_lora_adapters", "max_lora"), registry=r)
        self.adapter_loads = Counter(
            "saar_sim_lora_adapter_loads", "LoRA adapters loaded into a GPU slot", registry=r)
        self._model = model

    def finished(self, reason: str) -> None:
        self.request_success.labels(self._model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
