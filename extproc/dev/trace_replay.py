"""``saar replay-trace``: a Mooncake trace sent to a live endpoint with its timing and sessions.

The same trace drives ``saar simulate --trace`` offline (``scripts_from_trace`` turns rows into
sessions for both): each session's calls run in order, the first at its timestamp, a later one
``delay`` after the previous answer ended (or at its timestamp), every wait divided by
``speed``. A row becomes a streamed Chat Completions request whose prompt is its hash ids
spelled as text — ``block_size`` one-token words per id, so rows that share leading ids share a
prompt prefix exactly as the trace says, and the prefix caches see what the trace's did — with
``max_tokens`` its output length and the session's id in ``x-session-id``.

It reports what the client saw (TTFT, request and token throughput, errors) and what the
workers saw, read from their own ``/metrics`` before and after: each one's prefix-cache hit
rate over the replay (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, as vLLM and
the simulator export them).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from .clustersim.trace import TraceRow, scripts_from_trace
from .clustersim.workload import Script, Step

HITS = "vllm:prefix_cache_hits"
QUERIES = "vllm:prefix_cache_queries"


@dataclass(frozen=True, slots=True)
class Settings:
    url: str
    """The endpoint (Envoy's listener): ``/v1/chat/completions`` is appended."""
    speed: float = 1.0
    block_size: int = 16
    model: str = "auto"
    api_key: str = "replay-trace"
    worker_metrics: tuple[str, ...] = ()
    """``/metrics`` URLs of the workers whose prefix-cache hit rate to report."""
    timeout_s: float = 300.0


@dataclass(slots=True)
class _Tally:
    ttft_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    requests: int = 0


def prompt(hash_ids: Sequence[int], input_length: int, block_size: int, salt: str) -> str:
    """The prompt a row stands for: ``block_size`` words per hash id (a word of four hex
    characters is one token to the simulator), then words of this row alone up to
    ``input_length`` tokens."""
    words = [f"{(block * 7919 + i) & 0xFFFF:04x}" for block in hash_ids for i in range(block_size)]
    tail = max(0, input_length - len(words))
    words += [f"{salt}{i:x}"[-4:] for i in range(tail)]
    return " ".join(words[:max(input_length, 1)])


async def replay(rows: Sequence[TraceRow], settings: Settings) -> dict[str, Any]:
    scripts = scripts_from_trace(rows)
    timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        before = await _worker_counters(http, settings.worker_metrics)
        tally = _Tally()
        started = time.monotonic()
        await asyncio.gather(*(_session(http, s, n, started, settings, tally)
                               for n, s in enumerate(scripts)))
        elapsed = time.monotonic() - started
        after = await _worker_counters(http, settings.worker_metrics)
    return _report(tally, elapsed, len(scripts), before, after)


async def _session(http: aiohttp.ClientSession, script: Script, number: int, started: float,
                   settings: Settings, tally: _Tally) -> None:
    await _until(started + script.start_s / settings.speed)
    for index, step in enumerate(script.steps):
        if index:
            await asyncio.sleep(step.delay_s / settings.speed)
            await _until(started + step.not_before_s / settings.speed)
        await _call(http, script, number, index, step, settings, tally)


async def _until(deadline: float) -> None:
    wait = deadline - time.monotonic()
    if wait > 0:
        await asyncio.sleep(wait)


async def _call(http: aiohttp.ClientSession, script: Script, number: int, index: int,
                step: Step, settings: Settings, tally: _Tally) -> None:
    body = {
        "model": settings.model,
        "messages": [{"role": "user", "content": prompt(
            step.hash_ids or (), step.prompt_tokens, settings.block_size, f"{number:x}{index:x}")}],
        "max_tokens": max(1, step.output_tokens),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": f"Bearer {settings.api_key}", "content-type": "application/json",
               "x-session-id": f"trace-{script.key}"}
    tally.requests += 1
    sent = time.monotonic()
    first: float | None = None
    try:
        async with http.post(f"{settings.url.rstrip('/')}/v1/chat/completions",
                             data=orjson.dumps(body), headers=headers) as response:
            if response.status != 200:
                key = f"http {response.status}"
                tally.errors[key] = tally.errors.get(key, 0) + 1
                await response.read()
                return
            async for line in response.content:
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                chunk = orjson.loads(line[5:])
                if first is None and any((c.get("delta") or {}).get("content")
                                         for c in chunk.get("choices") or ()):
                    first = time.monotonic()
                if chunk.get("usage"):
                    tally.output_tokens += int(chunk["usage"].get("completion_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError) as exc:
        key = type(exc).__name__
        tally.errors[key] = tally.errors.get(key, 0) + 1
        return
    if first is not None:
        tally.ttft_ms.append((first - sent) * 1000)


async def _worker_counters(
    http: aiohttp.ClientSession, urls: Sequence[str]
) -> dict[str, tuple[float, float]]:
    """url → (prefix-cache hits, queries) as the worker reports them now."""
    out = {}
    for url in urls:
        async with http.get(url) as response:
            text = await response.text()
        totals = {HITS: 0.0, QUERIES: 0.0}
        for family in text_string_to_metric_families(text):
            if family.name in totals:
                totals[family.name] += sum(s.value for s in family.samples
                                           if s.name.endswith("_total"))
        out[url] = (totals[HITS], totals[QUERIES])
    return out


def _percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)


def _report(tally: _Tally, elapsed: float, sessions: int,
            before: dict[str, tuple[float, float]],
            after: dict[str, tuple[float, float]]) -> dict[str, Any]:
    workers = {}
    for url, (hits, queries) in after.items():
        hits -= before[url][0]
        queries -= before[url][1]
        workers[url] = {"prefix_hit_tokens": hits, "prefix_query_tokens": queries,
                        "prefix_hit_rate": round(hits / queries, 4) if queries else None}
    ok = tally.requests - sum(tally.errors.values())
    return {
        "sessions": sessions,
        "requests": tally.requests,
        "ok": ok,
        "errors": tally.errors,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(ok / elapsed, 3) if elapsed else None,
        "output_tokens_per_s": round(tally.output_tokens / elapsed, 3) if elapsed else None,
        "ttft_ms": {"p50": _percentile(tally.ttft_ms, 50), "p90": _percentile(tally.ttft_ms, 90),
                    "p99": _percentile(tally.ttft_ms, 99)},
        "workers": workers,
    }


def table(report: dict[str, Any]) -> str:
    ttft = report["ttft_ms"]
    lines = [
        f"{report['requests']} requests in {report['sessions']} sessions, {report['ok']} ok, "
        f"errors {report['errors'] or 0}, {report['seconds']} s",
        f"throughput {report['requests_per_s']} req/s, {report['output_tokens_per_s']} "
        "output tok/s",
        f"TTFT p50 {ttft['p50']} ms, p90 {ttft['p90']} ms, p99 {ttft['p99']} ms",
    ]
    for url, worker in report["workers"].items():
        rate = worker["prefix_hit_rate"]
        shown = "no prefix queries" if rate is None else f"{rate:.1%}"
        lines.append(f"worker {url}: prefix-cache hit rate {shown} "
                     f"({worker['prefix_hit_tokens']:.0f} of "
                     f"{worker['prefix_query_tokens']:.0f} prompt tokens)")
    return "\n".join(lines)
