"""The client every router is measured with: streamed Chat Completions
(``stream_options.include_usage``), the time to the first content chunk, the usage chunk's
tokens; sessions run as an agent runs them (each answer resent in the next turn, sub-agents
awaited), and the tiny request of the overhead cells at concurrency 1 and 16. An answer that
names its replay record (saar's ``x-replay-id``) is noted with the worker that served it
(``x-saar-worker``) and the cached tokens the engine reported
(``usage.prompt_tokens_details.cached_tokens``): what the precise index is judged against."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from .stats import percentile
from .workloads import Session, Workload

CHAT_PATH = "/v1/chat/completions"
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: a router's (or a worker's) base URL and the ``model`` to ask for."""

    url: str
    model: str
    fresh_connections: bool = False
    """A new connection per request (a server that stalls on reused keep-alive ones)."""
    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every request (Dynamo's frontend: the worker it is pinned to)."""


REPLAY_HEADER = "x-replay-id"
WORKER_HEADER = "x-saar-worker"


@dataclass(frozen=True, slots=True)
class Observed:
    """An answer saar routed: its replay record, the worker that served it, and the prompt
    tokens the engine found cached (None where the usage did not say)."""

    replay_id: str
    worker: str | None
    cached_tokens: int | None


@dataclass(slots=True)
class Tally:
    ttfts_s: list[float] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    observed: list[Observed] = field(default_factory=list)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def body(model: str, messages: list[dict[str, str]], max_tokens: int) -> bytes:
    return orjson.dumps({
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    })


async def call(http: aiohttp.ClientSession, target: Target, payload: bytes,
               headers: dict[str, str], tally: Tally) -> str | None:
    """Send one streamed request; its answer's text, or None when it failed (counted)."""
    tally.requests += 1
    sent = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    cached: int | None = None
    try:
        async with http.post(f"{target.url}{CHAT_PATH}", data=payload, headers={
                "content-type": "application/json", **dict(target.headers),
                **headers}) as response:
            if response.status != 200:
                tally.error(_error_kind(response.status, await response.read()))
                return None
            replay_id = response.headers.get(REPLAY_HEADER)
            worker = response.headers.get(WORKER_HEADER)
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = orjson.loads(data)
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        first = first or time.perf_counter()
                        pieces.append(text)
                usage = chunk.get("usage")
                if usage:
                    tally.output_tokens += int(usage.get("completion_tokens") or 0)
                    cached = cached_tokens(usage)
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        tally.error(type(exc).__name__)
        return None
    if replay_id:
        tally.observed.append(Observed(replay_id, worker, cached))
    tally.latencies_s.append(time.perf_counter() - sent)
    if first is not None:
        tally.ttfts_s.append(first - sent)
    return "".join(pieces)


def cached_tokens(usage: dict[str, object]) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (vLLM with
    ``--enable-prompt-tokens-details``, Dynamo), or None."""
    details = usage.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_kind(status: int, payload: bytes) -> str:
    """``http STATUS``, and the error's ``code`` when the body is an OpenAI error."""
    try:
        code = orjson.loads(payload).get("error", {}).get("code")
    except (orjson.JSONDecodeError, AttributeError):
        code = None
    return f"http {status}" + (f" {code}" if isinstance(code, str) and code else "")


def _connector(target: Target) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(limit=0, force_close=target.fresh_connections)


async def _until(deadline: float) -> None:
    wait = deadline - time.perf_counter()
    if wait > 0:
        await asyncio.sleep(wait)


async def run_workload(workload: Workload, target: Target) -> tuple[Tally, float]:
    """Every session of ``workload`` through ``target``; the tally and the wall time."""
    tally = Tally()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=_connector(target)) as http:
        started = time.perf_counter()

        async def session(s: Session, start: float) -> str:
            await _until(start + s.start_s)
            headers = workload.headers(s)
            history: list[dict[str, str]] = []
            if s.system is not None:
                history.append({"role": "system", "content": s.system})
            answer = ""
            for call_ in s.calls:
                if call_.delay_s > 0:
                    await asyncio.sleep(call_.delay_s)
                await _until(started + call_.not_before_s)
                text = call_.text
                if call_.children:
                    now = time.perf_counter()
                    answers = await asyncio.gather(*(session(c, now) for c in call_.children))
                    text = "".join(f"sub-agent answer: {a}\n" for a in answers) + text
                user = {"role": "user", "content": text}
                messages = [*history, user] if s.grows else [*history[:1], user]
                reply = await call(http, target, body(target.model, messages, call_.max_tokens),
                                   headers, tally)
                answer = reply or ""
                if s.grows:
                    history += [user, {"role": "assistant", "content": answer}]
            return answer

        await asyncio.gather(*(session(s, started) for s in workload.sessions))
        wall = time.perf_counter() - started
    return tally, wall


# -- the overhead cells ----------------------------------------------------------------------

TINY_WORDS = ("the quick look at this file shows a test that fails when the path is "
              "empty so we fix it and run the test again ") * 8
TINY_MAX_TOKENS = 1


def tiny(target: Target) -> bytes:
    return body(target.model, [{"role": "user", "content": TINY_WORDS}], TINY_MAX_TOKENS)


async def added_latency(router: Target, direct: Target, pairs: int,
                        warmup: int = 5) -> tuple[float, int]:
    """What ``router`` adds to the tiny request at concurrency 1, in ms: each request through
    it is sent right after the same one straight to a worker (``direct``), and the median of
    the pairs' differences is taken (a neighbour's burst moves both of a pair); and the
    failures."""
    headers = {"x-session-id": "bench-peers-c1"}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    differences: list[float] = []
    failed = 0
    async with aiohttp.ClientSession(timeout=timeout, connector=_connector(router)) as a, \
            aiohttp.ClientSession(timeout=timeout, connector=_connector(direct)) as b:
        for index in range(warmup + pairs):
            straight, through = Tally(), Tally()
            await call(b, direct, tiny(direct), headers, straight)
            await call(a, router, tiny(router), headers, through)
            failed += sum(straight.errors.values()) + sum(through.errors.values())
            if index >= warmup and through.latencies_s and straight.latencies_s:
                differences.append(through.latencies_s[0] - straight.latencies_s[0])
    added = percentile(differences, 50)
    return (math.nan if added is None else added * 1000), failed


async def closed_loop(target: Target, concurrency: int, seconds: float) -> tuple[int, int, float]:
    """``concurrency`` loops sending the tiny request (each its own session) for ``seconds``:
    answered requests, failed ones, and the time until the last one ended."""
    tally = Tally()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=_connector(target)) as http:
        started = time.perf_counter()
        stop = started + seconds

        async def loop(index: int) -> None:
            headers = {"x-session-id": f"bench-peers-c16-{index}"}
            while time.perf_counter() < stop:
                await call(http, target, tiny(target), headers, tally)

        await asyncio.gather(*(loop(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    failed = sum(tally.errors.values())
    return tally.requests - failed, failed, elapsed
