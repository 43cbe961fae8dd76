"""The workers every router is put in front of.

A backend is a context manager yielding a ``Pool``: the workers' base URLs, the model they
serve, their KV (what the oversubscribed workload is sized against), how to read each one's
prefix-cache counters (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``,
tokens, from its ``/metrics``: what vLLM and ``saar sim-server`` export) and how to make the
pool fresh again (its caches emptied), which the runner does before each router's turn and
each workload. A pool may also say how saar is to be configured over it (``saar_model``,
``saar_config``: real vLLM's KV events and tokenizer), that saar's precise index is to be
judged there (``precise_block_size``), and what "a worker alone" is for the added latency
(``direct``).

Backends (``BACKENDS``, each built from the run's settings):

- ``sim``: ``saar sim-server`` processes, reset through ``/admin/reset``;
- ``vllm``: two real vLLM servers (``engines.vllm.vllm_pool``, the tiny model, each pinned to
  its own core) with 16k tokens of KV each (``--kv-cache-memory-bytes``; the tiny model's KV is
  2 KiB a token: 256 MiB gave 131,072 tokens in ``vllm:cache_config_info``). Made fresh by
  ``POST /reset_prefix_cache`` (served under ``VLLM_SERVER_DEV_MODE=1``): measured here, the
  same 5.3k-token prompt hit 5,248 tokens before the reset and 0 after, the reset answered in
  4–16 ms where a restart of the two servers takes 20–110 s, and the prefix counters keep
  counting through it. A reset refused while blocks are still held (a request finishing) is
  tried again. saar runs over it in precise mode (vLLM's KV events, the tiny model's
  tokenizer, 128-token blocks);
- ``dynamo``: Dynamo's mockers behind its frontend (``dynamo_backend``), with routers of its
  own (``routers(names)``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from ...harness import Service, free_port, free_ports, wait_http
from .settings import Settings

HITS = "vllm:prefix_cache_hits"
QUERIES = "vllm:prefix_cache_queries"

PrefixCounters = Callable[[], Mapping[str, tuple[float, float]]]
"""Worker → (prefix-cache hit tokens, query tokens) so far: cumulative counters, the runner
takes differences."""


@dataclass(frozen=True)
class Direct:
    """Where the added latency's "worker alone" request goes."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    fresh_connections: bool = False


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
    saar_model: Mapping[str, Any] = field(default_factory=dict)
    """Merged into saar's entry for the model (``workers`` with their KV events replace the
    plain ``endpoints``)."""
    saar_config: Mapping[str, Any] = field(default_factory=dict)
    """Top-level keys of saar's config (``scheduling``: the precise index)."""
    precise_block_size: int | None = None
    """The engines' block size where saar's precise index is judged against their reported
    cached tokens (None: not judged)."""
    direct: Callable[[], Direct] | None = None
    """The "worker alone" of the added latency (default: the first worker's URL)."""
    trace_words_per_block: int = 16
    """Words of the shared-prefix trace's text per hash block: a word is a token to the
    simulator, but four hex digits are 4.3 tokens to the tiny model's tokenizer (6,889 tokens
    for 1,600 words), so its engines take 4 (a block is then about 17 tokens, and a prompt
    2–2.5k tokens rather than 8k against an 8,192-token window)."""

    def direct_target(self) -> Direct:
        return self.direct() if self.direct is not None else Direct(self.workers[0])

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


def _post(url: str, timeout_s: float = 10.0) -> bytes:
    request = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        body: bytes = response.read()
    return body


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


RESET_TIMEOUT_S = 60.0


def reset_prefix_caches(urls: Sequence[str], timeout_s: float = RESET_TIMEOUT_S,
                        post: Callable[[str], bytes] = _post) -> None:
    """``POST /reset_prefix_cache`` to each vLLM server until it says ``success`` (it refuses
    while a request still holds blocks); raises ``RuntimeError`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while True:
            answer = post(f"{url}/reset_prefix_cache")
            if b'"success":true' in answer.replace(b" ", b""):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} refused to reset its prefix cache for "
                                   f"{timeout_s:.0f} s: {answer[:200]!r}")
            time.sleep(0.2)


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """``values`` in this process's environment for the block (what it starts inherits them),
    the old values back after."""
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


VLLM_KV_BYTES_PER_TOKEN = 2048
"""The tiny model's KV per token on vLLM's CPU backend: 4 layers × K and V × 2 KV heads × 64 ×
bf16 (``--kv-cache-memory-bytes`` 256 MiB showed 131,072 tokens)."""
TINY_TRACE_WORDS_PER_BLOCK = 4
"""``Pool.trace_words_per_block`` for engines with the tiny model's tokenizer."""
VLLM_CONTEXT = 8192
"""The tiny model's window (``--max-model-len``), which saar's config gives it too."""


@dataclass(frozen=True)
class VllmBackend:
    """Two real vLLM servers of the tiny model (``engines.vllm``), fresh per router and per
    workload by resetting their prefix caches; saar over them in precise mode."""

    servers: int = 2
    kv_tokens: int = 16384
    """Per server: 3× oversubscribed is then 98k tokens of live context over the pair."""
    name: str = "vllm"

    @contextlib.contextmanager
    def pool(self, workdir: Path) -> Iterator[Pool]:
        from ...engines import vllm

        with contextlib.ExitStack() as stack:
            with environ(VLLM_SERVER_DEV_MODE="1"):  # the servers copy it as they start
                servers = stack.enter_context(vllm.vllm_pool(
                    self.servers, workdir, ports=free_ports(self.servers),
                    kv_cache_bytes=self.kv_tokens * VLLM_KV_BYTES_PER_TOKEN,
                    max_model_len=VLLM_CONTEXT))
            urls = tuple(s.url for s in servers)
            sizes = [kv_tokens(s.metrics()) for s in servers]
            per_worker = min((n for n in sizes if n), default=self.kv_tokens)
            saar_model = {
                "workers": [{"address": s.address, "kv_events": s.kv_events or ""}
                            for s in servers],
                "context_window": VLLM_CONTEXT,
            }
            saar_config = {"scheduling": {"prefix": {
                "mode": "precise", "tokenizer": str(vllm.tiny_model()),
                "block_size": vllm.BLOCK_SIZE}}}
            yield Pool(urls, servers[0].model, per_worker,
                       functools.partial(metrics_counters, urls),
                       functools.partial(reset_prefix_caches, urls),
                       saar_model=saar_model, saar_config=saar_config,
                       precise_block_size=vllm.BLOCK_SIZE,
                       trace_words_per_block=TINY_TRACE_WORDS_PER_BLOCK)


def _sim(settings: Settings) -> Backend:
    return SimBackend(workers=settings.workers)


def _vllm(settings: Settings) -> Backend:
    return VllmBackend()


def _dynamo(settings: Settings) -> Backend:
    from .dynamo_backend import DynamoBackend

    return DynamoBackend()


BACKENDS: dict[str, Callable[[Settings], Backend]] = {
    "sim": _sim, "vllm": _vllm, "dynamo": _dynamo}
"""Backend name → its factory, given the run's settings."""
