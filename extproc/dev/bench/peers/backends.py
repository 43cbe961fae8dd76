"""The workers every router is put in front of.

A backend is a context manager yielding a ``Pool``: the workers' base URLs, the model they
serve, their KV (what the oversubscribed workload is sized against), how to read each one's
prefix-cache counters (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``,
tokens, from its ``/metrics``: what vLLM and ``saar sim-server`` export) and how to make the
pool fresh again (its caches emptied), which the runner does before each router's turn.

To plug in a backend (``vllm``, ``dynamo``): a class with ``name`` and ``pool(workdir)``,
registered in ``BACKENDS``; a backend whose workers are not OpenAI servers of their own
(Dynamo's mockers behind its frontend) also gives ``routers(names)``, the routers that run
in front of it (its own, and saar choosing the worker), else the runner uses the standard set.
Two real vLLM servers (``engines.vllm.vllm_pool``) make a ``Pool`` of their URLs and served
name, ``metrics_counters`` over them, their KV from ``kv_tokens`` (``vllm:cache_config_info``)
and a reset that empties their prefix caches (``POST /reset_prefix_cache``, which vLLM serves
under ``VLLM_SERVER_DEV_MODE=1``) or restarts them on the same ports.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

from ...harness import Service, free_port, wait_http
from .settings import Settings

HITS = "vllm:prefix_cache_hits"
QUERIES = "vllm:prefix_cache_queries"

PrefixCounters = Callable[[], Mapping[str, tuple[float, float]]]
"""Worker → (prefix-cache hit tokens, query tokens) so far: cumulative counters, the runner
takes differences."""


@dataclass(frozen=True)
class Pool:
    workers: tuple[str, ...]
    """Base URLs (``http://host:port``) of OpenAI-compatible servers, as routers take them."""
    model: str
    """The served model name."""
    kv_tokens_per_worker: int
    counters: PrefixCounters
    reset: Callable[[], None]
    """Empty every worker's cache (or restart it on the same address)."""

    @property
    def kv_tokens(self) -> int:
        return self.kv_tokens_per_worker * len(self.workers)


class Backend(Protocol):
    @property
    def name(self) -> str:
        """The name the report gives it."""
        ...

    def pool(self, workdir: Path) -> contextlib.AbstractContextManager[Pool]:
        """Start (or reach) the workers; stop what it started on exit."""
        ...


def metrics_counters(urls: Sequence[str], timeout_s: float = 10.0) -> dict[str, tuple[float,
                                                                                       float]]:
    """Each worker's prefix-cache hits and queries as its ``/metrics`` says now (every
    engine and model label summed)."""
    out = {}
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
        out[url] = prefix_counters(text)
    return out


def prefix_counters(text: str) -> tuple[float, float]:
    """(hits, queries) in a Prometheus exposition (vLLM's names)."""
    totals = {HITS: 0.0, QUERIES: 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples
                                       if s.name == f"{family.name}_total")
    return totals[HITS], totals[QUERIES]


def kv_tokens(text: str) -> int | None:
    """A worker's KV in tokens from its ``vllm:cache_config_info`` (``num_gpu_blocks`` ×
    ``block_size``), or None when it does not say."""
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                blocks, size = sample.labels.get("num_gpu_blocks"), sample.labels.get(
                    "block_size")
                if blocks and size and blocks.isdigit() and size.isdigit():
                    return int(blocks) * int(size)
    return None


def _post(url: str, timeout_s: float = 10.0) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        response.read()


@dataclass(frozen=True)
class SimBackend:
    """``workers`` ``saar sim-server`` processes on loopback, reset (``/admin/reset``: cache,
    issued ids) between routers."""

    workers: int = 4
    model: str = "qwen3-8b"
    kv_blocks: int = 1024
    block_size: int = 16
    output_tokens: int = 64
    name: str = "sim"

    @contextlib.contextmanager
    def pool(self, workdir: Path) -> Iterator[Pool]:
        workdir.mkdir(parents=True, exist_ok=True)
        services = []
        try:
            urls = []
            for index in range(self.workers):
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                service = Service(f"sim-{index}", [
                    sys.executable, "-m", "extproc", "sim-server", "--host", "127.0.0.1",
                    "--port", str(port), "--model", self.model, "--instance-id", f"w{index}",
                    "--num-gpu-blocks", str(self.kv_blocks), "--block-size", str(self.block_size),
                    "--output-tokens", str(self.output_tokens)],
                    workdir, functools.partial(wait_http, f"{url}/health"))
                services.append(service)
                service.start()
                urls.append(url)

            def reset() -> None:
                for url in urls:
                    _post(f"{url}/admin/reset")

            yield Pool(tuple(urls), self.model, self.kv_blocks * self.block_size,
                       functools.partial(metrics_counters, tuple(urls)), reset)
        finally:
            for service in reversed(services):
                service.close()


def _sim(settings: Settings) -> Backend:
    return SimBackend(workers=settings.workers)


BACKENDS: dict[str, Callable[[Settings], Backend]] = {"sim": _sim}
"""Backend name → its factory, given the run's settings. ``vllm`` (two real vLLM instances,
``extproc/dev/engines/vllm.py``) and ``dynamo`` (Dynamo's frontend and mockers,
``extproc/dev/engines/dynamo.py``) plug in here as their engines land."""
