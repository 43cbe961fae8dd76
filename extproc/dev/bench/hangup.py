"""``saar bench hangup``: clients that hang up before any answer, and what they leave behind.

A stack (``run_stack``: Envoy, the processor, two simulated workers per model slowed so that
no answer begins within half a second) gets ``--clients`` requests, ``--concurrency`` at a
time. Each client opens a connection to Envoy, sends a whole first request of a new session
(Chat with tools, Chat streamed, Responses or Messages in turn, from 20 tenants), waits
``--linger`` seconds (the processor has routed it by then: Envoy is waiting on the worker) and
closes the connection before any byte of the answer. Envoy resets the upstream request and
ends the ext_proc stream unanswered: the processor must keep nothing of such a request.

The processor's RSS and tables (``saar_table_entries``) are sampled after a warm-up of
``--warmup`` clients (allocator pools and caches filled), half way and at the end: the report
gives the growth over all the clients and over the last half, and the tables at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import yaml

from .. import EXAMPLE_CONFIG
from ..harness import Stack, run_stack
from .soak import (
    CHAT_TOOL,
    HARD,
    MESSAGES_TOOL,
    RESPONSES_TOOL,
    TENANTS,
    metrics_page,
    sample,
)
from .wire import post_request

SIM_ARGS = ("--time-scale", "5000")
"""The simulator's timings slowed so that no answer begins before its client has left: a
streamed answer's headers come after its prefill, which for these prompts (mostly cached: they
share their opening) is ~0.1 ms unscaled, 0.5 s here."""
SETTLE_SECONDS = 1.0
SETTLE_MAX_SECONDS = 15.0
"""Before a sample, at least ``SETTLE_SECONDS`` and until the processor has ended no stream
for half a second (at most ``SETTLE_MAX_SECONDS``): the last clients' streams have ended
there (Envoy resets the upstream request when the client leaves), however busy the machine."""


def requests() -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    """(path, body, headers) of each client's request: a new session's first turn."""
    for n in itertools.count():
        headers = {"authorization": f"Bearer hangup-tenant-{n % TENANTS}",
                   "x-session-id": f"hangup-{n}"}
        task = f"{HARD} Ticket {n}."
        kind = n % 4
        if kind < 2:
            doc: dict[str, Any] = {"model": "auto", "tools": [CHAT_TOOL],
                                   "messages": [{"role": "user", "content": task}]}
            if kind == 1:
                doc.update(stream=True, stream_options={"include_usage": True})
            yield "/v1/chat/completions", doc, headers
        elif kind == 2:
            yield "/v1/responses", {"model": "auto", "input": task,
                                    "tools": [RESPONSES_TOOL]}, headers
        else:
            yield "/v1/messages", {"model": "auto", "max_tokens": 64, "tools": [MESSAGES_TOOL],
                                   "messages": [{"role": "user", "content": task}]}, headers


async def hang_up(url: str, path: str, doc: dict[str, Any], headers: dict[str, str],
                  linger: float) -> bool:
    """Send one request whole, then close before the answer; False if an answer came first
    (the request was not one that hung up)."""
    split = urlsplit(url)
    reader, writer = await asyncio.open_connection(split.hostname, split.port)
    try:
        writer.write(post_request(split.netloc, path, orjson.dumps(doc), headers))
        await writer.drain()
        try:
            await asyncio.wait_for(reader.read(1), linger)
        except TimeoutError:
            return True
        return False
    finally:
        writer.close()


async def drive(url: str, clients: int, concurrency: int, linger: float,
                source: Iterator[tuple[str, dict[str, Any], dict[str, str]]]) -> int:
    """``clients`` hang-ups, ``concurrency`` at a time; how many got an answer first."""
    answered = 0
    remaining = iter(range(clients))

    async def worker() -> None:
        nonlocal answered
        for _ in remaining:
            path, doc, headers = next(source)
            answered += not await hang_up(url, path, doc, headers, linger)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answered


def run(config: dict[str, Any], *, clients: int, warmup: int, concurrency: int,
        linger: float) -> dict[str, Any]:
    source = requests()
    with tempfile.TemporaryDirectory(prefix="saar-hangup-") as tmp, \
            run_stack(config, workers_per_model=2, sim_args=list(SIM_ARGS),
                      workdir=Path(tmp)) as stack:
        answered = asyncio.run(drive(stack.url, warmup, concurrency, linger, source))
        _settle(stack)
        samples = [sample(stack)]
        routed = [_routed(stack)]
        for _ in range(2):
            answered += asyncio.run(drive(stack.url, clients // 2, concurrency, linger, source))
            _settle(stack)
            samples.append(sample(stack))
            routed.append(_routed(stack))
        begun = _counted(stack, "saar_responses_total{")
    rss = [s["rss_mib"] for s in samples]
    return {"clients": clients, "warmup": warmup, "concurrency": concurrency,
            "linger_s": linger, "answered_first": answered, "answers_begun": int(begun),
            "routed": int(routed[2] - routed[0]),
            "rss_mib": rss, "growth_mib": round(rss[2] - rss[0], 1),
            "growth_last_half_mib": round(rss[2] - rss[1], 1),
            "tables": samples[-1]["tables"], "tasks": samples[-1]["tasks"]}


def _settle(stack: Stack) -> None:
    """Wait until the processor has ended the last clients' streams (see ``SETTLE_SECONDS``):
    its overhead histogram counts one observation as each routing stream closes."""
    time.sleep(SETTLE_SECONDS)
    ended = _counted(stack, "saar_router_overhead_seconds_count")
    deadline = time.monotonic() + SETTLE_MAX_SECONDS - SETTLE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _counted(stack, "saar_router_overhead_seconds_count")
        if now == ended:
            return
        ended = now


def _routed(stack: Stack) -> float:
    """Requests the processor has decided (``saar_requests_total``): a client that left before
    its body reached the processor never got that far."""
    return _counted(stack, "saar_requests_total{")


def _counted(stack: Stack, prefix: str) -> float:
    """The sum of a counter's series on the processor's ``/metrics``."""
    return sum(float(line.rpartition(" ")[2]) for line in metrics_page(stack.processor_http)
               .splitlines() if line.startswith(prefix))


def main(config_path: str | None, *, clients: int, warmup: int, concurrency: int,
         linger: float, as_json: bool) -> int:
    config = yaml.safe_load(Path(config_path or EXAMPLE_CONFIG).read_text())
    report = run(config, clients=clients, warmup=warmup, concurrency=concurrency,
                 linger=linger)
    rss = report["rss_mib"]
    tables = ", ".join(f"{k} {v:.0f}" for k, v in sorted(report["tables"].items()))
    print(f"{report['clients']} clients hung up after a warm-up of {report['warmup']} "
          f"({report['concurrency']} at a time, {report['linger_s']} s after sending; "
          f"{report['routed']} routed by the processor, {report['answered_first']} got an "
          f"answer first, {report['answers_begun']} answers begun upstream in all)\n"
          f"processor RSS: {rss[0]} -> {rss[1]} -> {rss[2]} MiB: +{report['growth_mib']} MiB "
          f"(last half +{report['growth_last_half_mib']} MiB)\n"
          f"tables at the end: {tables}; asyncio tasks {report['tasks']:.0f}", flush=True)
    if as_json:
        print(json.dumps(report), flush=True)
    return 0
