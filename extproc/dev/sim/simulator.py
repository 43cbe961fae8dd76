"""One simulated vLLM instance: admission, timing, and the continuity oracle's verdicts.

Order of a request mirrors what routing can observe on a real server: fault injection (an
overloaded or dying pod), body validation (the router's own parser, so both agree on what a
request means), the model check, continuity, then a ``max_num_seqs`` slot, prefill delay
for the uncached part of the prompt, and decode delay spread over the stream.

It takes the router's KV hints (``POST /v1/kv/hints``) and resolves each against what it knows
of the session (its requests' session id, read as the router reads it; ``SessionBlocks``): a
demote moves the session's own blocks to host memory (not while a request of it runs here), a
prefetch brings them back, a release frees its blocks past the prefix to keep, a share pins a
prefix. Any hint it cannot apply is ignored, as an engine may.

Disaggregated (``role``), a decode worker plays llm-d's routing sidecar: a request naming a
prefill worker in ``x-prefiller-host-port`` is sent there first as a prefill-only call (marked
``x-sim-remote-decode``; the prefill worker prefills, caches, answers at once and judges no
continuity: it issues nothing), then the decode worker pays the KV transfer for what it lacks
and answers; ``x-sim-prefilled-by`` names the prefill worker. LoRA adapters
(``lora_modules``) are served names of their own whose prefix cache is their own (their blocks
hash with the adapter's name, as vLLM's do with its id); a request for an adapter not in a GPU
slot loads it (``max_loras`` slots, the least recently used idle one evicted), and the
``vllm:lora_requests_info`` gauge names the adapters running and waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from ...adapter.contract import PREFILL_HEADER
from ...apis import parse_request, render_entries, render_prompt
from ...core.identity import IdentityReader
from ...errors import RoutingError
from ...scheduling.kv_hints import KvHint
from ...scheduling.tokenizer import Tokenizer
from ...types import API_PATHS, Api, RequestSummary
from ..clustersim.ownership import SessionBlocks
from .config import SimConfig
from .formats import FORMATS
from .kv_publisher import KVEventPublisher
from .metrics import SimMetrics
from .oracle import ContinuityOracle
from .prefix_cache import PrefixCache, block_hashes, tokenize
from .reply import Reply, build_reply

_SECRET_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization"})
REMOTE_DECODE_HEADER = "x-sim-remote-decode"
"""Marks the sidecar's prefill-only call to a prefill worker."""
PREFILLED_BY_HEADER = "x-sim-prefilled-by"
"""On a decode worker's answer: the prefill worker's instance that prefilled it."""
STORED_RESPONSES = 4096
"""Responses answers kept for ``GET /v1/responses/{id}`` (the oldest forgotten past it)."""
CHAINED = frozenset({Api.RESPONSES, Api.CHAT})
"""APIs whose answer id a later request may name as ``previous_response_id``: Responses, and
Chat as the Semantic Router's live benchmark chains it. Only Responses resumes the stored
conversation; on Chat the id is judged (issued here, or refused and counted) but the prompt is
the messages alone, as vLLM ignores the field there: a chained turn costs what an unchained
one costs, so the benchmark's router-versus-direct overhead compares like with like."""


@dataclass(frozen=True)
class Prompt:
    """The rendered prompt: text resumed from ``previous_response_id`` (Responses) plus this
    request's."""

    history: str
    new: str
    encode: Callable[[str], Sequence[str] | Sequence[int]]
    counted: Sequence[int] | None = None
    """The engine's own tokens of the request (the model's chat template and tokenizer), where
    the simulator has them: what vLLM computes, caches and counts."""

    @property
    def text(self) -> str:
        return self.history + self.new

    @cached_property
    def tokens(self) -> Sequence[str] | Sequence[int]:
        return self.counted if self.counted is not None else self.encode(self.text)


class Simulator:
    """State of one instance: cache, oracle, metrics, admission slots and fault plan."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.tokenizer = Tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        """The model's tokenizer (a model directory: its chat template too, as vLLM renders)."""
        self.encode: Callable[[str], Sequence[str] | Sequence[int]] = (
            self.tokenizer.encode if self.tokenizer else tokenize
        )
        self.kv_events = (
            KVEventPublisher(cfg.kv_events_endpoint, cfg.kv_events_topic, block_size=cfg.block_size)
            if cfg.kv_events_endpoint
            else None
        )
        self.cache = PrefixCache(
            block_size=cfg.block_size, num_gpu_blocks=cfg.num_gpu_blocks,
            num_cpu_blocks=cfg.num_cpu_blocks, share_blocks=cfg.num_gpu_blocks // 5,
            listener=self.kv_events,
        )
        self.oracle = ContinuityOracle(cfg.instance_id)
        self.metrics = SimMetrics(
            model=cfg.model, block_size=cfg.block_size, num_gpu_blocks=cfg.num_gpu_blocks,
            num_cpu_blocks=cfg.num_cpu_blocks,
        )
        self.identity = IdentityReader()
        self.sessions = SessionBlocks()
        self._running: dict[str, int] = {}
        """Requests of each session in flight here: its KV is in use, not to be demoted."""
        self.fail_every = cfg.fail_every
        self.fail_next = 0
        self.requests = 0
        self.scrapes = 0
        """``GET /metrics`` answered, ever (what a router's scrape pacing costs this server)."""
        self.last_request_headers: dict[str, str] = {}
        self.running = 0
        self.waiting = 0
        self._kv_blocks = 0
        self._slots = asyncio.Semaphore(cfg.max_num_seqs)
        self._client: Any = None
        self._adapters: OrderedDict[str, None] = OrderedDict()
        """Adapters in GPU slots, least recently used first."""
        self._stored: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """Responses answers as ``GET /v1/responses/{id}`` returns them, newest last."""
        self._adapter_use: Counter[str] = Counter()
        self._adapter_waiting: Counter[str] = Counter()
        self.adapter_loads = 0
        self.metrics.role.labels(cfg.role).set(1)
        self._lora_gauge()

    async def handle_api(self, request: web.Request) -> web.StreamResponse:
        api = API_PATHS[request.path]
        self.requests += 1
        self.last_request_headers = _visible_headers(request)
        if self.cfg.record_dir is not None:
            self._record(request, await request.read())
        if self._take_fault():
            self.metrics.injected_errors.inc()
            return openai_error(503, "injected fault", kind="service_unavailable", code=503)
        try:
            summary = parse_request(
                api, await request.read(), max_body_bytes=self.cfg.max_body_bytes
            )
        except RoutingError as exc:
            return web.Response(
                body=exc.body(api.error_style), status=exc.status, headers=exc.headers()
            )
        if summary.model not in self.cfg.served_names:
            message = f"The model `{summary.model}` does not exist."
            return openai_error(404, message, kind="NotFoundError", code=404)
        if request.headers.get(REMOTE_DECODE_HEADER):
            return await self._prefill_only(summary)
        verdict = self.oracle.judge(summary)
        for kind in verdict.violations:
            self.metrics.violations.labels(kind).inc()
        headers = {"x-sim-continuity-violations": str(len(verdict.violations))}
        if verdict.unknown_previous_response:
            message = f"Previous response with id '{summary.previous_response_id}' not found."
            return openai_error(
                400,
                message,
                kind="invalid_request_error",
                param="previous_response_id",
                code="previous_response_not_found",
                headers=headers,
            )
        counted = (self.tokenizer.prompt_tokens(summary) if self.tokenizer is not None
                   and summary.model not in self.cfg.lora_modules else None)
        prompt = Prompt(
            self.oracle.transcript(summary.previous_response_id) if api is Api.RESPONSES else "",
            render_prompt(summary),
            self._encoder(summary.model),
            counted,
        )
        if len(prompt.tokens) > self.cfg.max_model_len:
            message = (
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. "
                f"However, your request has {len(prompt.tokens)} input tokens."
            )
            return openai_error(400, message, kind="BadRequestError", code=400, headers=headers)
        session = self.identity.read(
            {k.lower(): v for k, v in request.headers.items()}, summary).session_id
        prefiller = request.headers.get(PREFILL_HEADER)
        remote = None
        if prefiller and self.cfg.role != "prefill":
            remote = await self._remote_prefill(prefiller, request)
            if remote is not None:
                headers[PREFILLED_BY_HEADER] = remote
        adapter = summary.model if summary.model in self.cfg.lora_modules else None
        async with self._slot(len(prompt.tokens) + self.cfg.output_tokens), \
                self._adapter(adapter):
            if session is not None:
                self._running[session] = self._running.get(session, 0) + 1
            try:
                return await self._answer(request, api, summary, prompt, headers, session,
                                          remote is not None)
            finally:
                if session is not None:
                    self._running[session] -= 1
                    if not self._running[session]:
                        del self._running[session]

    def _record(self, request: web.Request, body: bytes) -> None:
        folder = Path(self.cfg.record_dir or ".")
        folder.mkdir(parents=True, exist_ok=True)
        doc = {"path": request.path_qs, "headers": self.last_request_headers,
               "body": body.decode(errors="replace")}
        (folder / f"{self.cfg.instance_id}-{self.requests:05d}.json").write_bytes(orjson.dumps(doc))

    def _encoder(self, model: str) -> Callable[[str], Sequence[str] | Sequence[int]]:
        """The base model's tokens; an adapter's lead with its name, so its blocks (and its
        prefix cache) are its own."""
        if model not in self.cfg.lora_modules:
            return self.encode
        encode = self.encode
        return lambda text: encode(f"<lora:{model}> {text}")

    async def _prefill_only(self, summary: RequestSummary) -> web.Response:
        """The sidecar's call on a prefill worker: prefill (what is not cached), cache, answer."""
        tokens = self._encoder(summary.model)(render_prompt(summary))
        adapter = summary.model if summary.model in self.cfg.lora_modules else None
        async with self._slot(len(tokens) + 1), self._adapter(adapter):
            cached = self.cache.lookup_and_insert(tokens)
            self.metrics.prefill_only.inc()
            self.metrics.prompt_tokens.inc(len(tokens))
            await self._sleep((len(tokens) - cached) / self.cfg.prefill_tokens_per_s)
        return _json_response({"prefilled_tokens": len(tokens) - cached, "cached_tokens": cached,
                               "instance": self.cfg.instance_id})

    async def _remote_prefill(self, prefiller: str, request: web.Request) -> str | None:
        """The sidecar: the same request to ``prefiller`` first; its instance id, or None when
        it failed (then this worker prefills itself, as llm-d's sidecar falls back)."""
        import aiohttp

        if self._client is None:
            self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        forwarded = {k: v for k, v in request.headers.items()
                     if k.lower() not in ("host", "content-length", "transfer-encoding",
                                          PREFILL_HEADER)}
        forwarded[REMOTE_DECODE_HEADER] = "1"
        try:
            async with self._client.post(f"http://{prefiller}{request.path}",
                                         data=await request.read(), headers=forwarded) as answer:
                found = await answer.json() if answer.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            found = None
        if not isinstance(found, dict) or not isinstance(found.get("instance"), str):
            self.metrics.remote_prefills.labels("failed").inc()
            return None
        self.metrics.remote_prefills.labels("ok").inc()
        return str(found["instance"])

    @contextlib.asynccontextmanager
    async def _adapter(self, adapter: str | None) -> AsyncIterator[None]:
        """Hold ``adapter`` in a GPU slot while the request runs, loading it if it must."""
        if adapter is None:
            yield
            return
        self._adapter_waiting[adapter] += 1
        self._lora_gauge()
        try:
            while adapter not in self._adapters and len(self._adapters) >= self.cfg.max_loras:
                idle = next((a for a in self._adapters if not self._adapter_use[a]), None)
                if idle is not None:
                    del self._adapters[idle]
                    break
                await asyncio.sleep(0.001)  # every slot busy: wait for one
            if adapter not in self._adapters:
                self.adapter_loads += 1
                self.metrics.adapter_loads.inc()
                self._adapters[adapter] = None
                self._adapter_use[adapter] += 1
                await self._sleep(self.cfg.lora_load_seconds)
            else:
                self._adapter_use[adapter] += 1
            self._adapters.move_to_end(adapter)
        finally:
            self._adapter_waiting[adapter] -= 1
        self._lora_gauge()
        try:
            yield
        finally:
            self._adapter_use[adapter] -= 1
            self._lora_gauge()

    def _lora_gauge(self) -> None:
        """vLLM's gauge: one series, valued with the time of the change."""
        if not self.cfg.lora_modules:
            return
        running = ",".join(sorted(a for a, n in self._adapter_use.items() if n))
        waiting = ",".join(sorted(a for a, n in self._adapter_waiting.items() if n))
        self.metrics.lora_info.clear()
        self.metrics.lora_info.labels(running, waiting, str(self.cfg.max_loras)).set(time.time())

    def hint(self, hint: KvHint) -> bool:
        """Apply one router hint if it can; False: ignored (an unknown session, nothing to
        move, no host tier, or a demote of a session with a request running here)."""
        blocks = self.sessions.blocks(hint.session)
        keep = hint.prefix_tokens // self.cfg.block_size
        moved = 0
        if blocks:
            match hint.kind:
                case "share":
                    moved = self.cache.share(blocks[:keep])
                case "demote" if hint.session not in self._running:
                    moved = self.cache.demote(self.sessions.unique(hint.session))
                case "prefetch":
                    moved = self.cache.prefetch(blocks)
                case "release":
                    moved = self.cache.release(self.sessions.forget(hint.session, keep))
        self.metrics.hints.labels(hint.kind, "applied" if moved else "ignored").inc()
        self.metrics.hint_blocks.labels(hint.kind).inc(moved)
        self.metrics.cpu_blocks.set(self.cache.cpu_blocks)
        return bool(moved)

    async def _answer(
        self,
        request: web.Request,
        api: Api,
        summary: RequestSummary,
        prompt: Prompt,
        headers: dict[str, str],
        session: str | None,
        remote: bool = False,
    ) -> web.StreamResponse:
        fmt = FORMATS[api]
        tokens = prompt.tokens
        cached = self.cache.lookup_and_insert(tokens)
        if remote:  # the prefill worker computed the rest: its KV comes over, not computed
            moved = max(len(tokens) - cached - 1, 0)
            self.metrics.transferred_tokens.inc(moved)
            headers["x-sim-transferred-tokens"] = str(moved)
            await self._sleep(moved / self.cfg.kv_transfer_tokens_per_s)
            cached += moved
        loaded = self.cache.loaded * self.cfg.block_size
        self.metrics.prefix_queries.inc(len(tokens))
        self.metrics.prefix_hits.inc(cached - loaded)
        self.metrics.external_queries.inc(len(tokens) - (cached - loaded))
        self.metrics.external_hits.inc(loaded)
        self.metrics.cpu_blocks.set(self.cache.cpu_blocks)
        self.metrics.prompt_tokens.inc(len(tokens))
        reply = build_reply(
            summary,
            prompt=prompt.text,
            prompt_tokens=len(tokens),
            cached_tokens=cached,
            output_tokens=self.cfg.output_tokens,
            style=fmt.ids,
            reasoning=fmt.wants_reasoning(summary.body),
            oracle=self.oracle,
        )
        headers["x-sim-cached-tokens"] = str(cached)
        headers["x-sim-loaded-tokens"] = str(loaded)
        await self._sleep((len(tokens) - cached) / self.cfg.prefill_tokens_per_s
                          + loaded / self.cfg.cpu_tokens_per_s)
        decode_seconds = reply.output_tokens / self.cfg.decode_tokens_per_s
        if summary.stream:
            events = list(fmt.events(reply, summary))
            response = web.StreamResponse(
                headers={
                    **headers,
                    "content-type": "text/event-stream",
                    "cache-control": "no-cache",
                }
            )
            await response.prepare(request)
            try:
                for event in events:
                    await response.write(event.encode())
                    await self._sleep(decode_seconds / len(events))
            finally:
                # Generated whatever the client does: a client that stops reading at the
                # terminal event (the openai SDK does) still finds its response stored, as
                # on vLLM and OpenAI.
                self._finish(api, summary, prompt, reply, session)
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
            return response
        else:
            await self._sleep(decode_seconds)
            response = web.Response(
                body=orjson.dumps(fmt.document(reply, summary)),
                content_type="application/json",
                headers=headers,
            )
        self._finish(api, summary, prompt, reply, session)
        return response

    def _finish(self, api: Api, summary: RequestSummary, prompt: Prompt, reply: Reply,
                session: str | None) -> None:
        """Remember the turn: output blocks join the cache (as vLLM's do), the session's
        context is what hints resolve against, and the answer's id becomes resumable."""
        reply_text = render_entries(api, FORMATS[api].history(reply))
        context = prompt.encode(prompt.text + reply_text)
        self.cache.lookup_and_insert(context)
        if session is not None:
            self.sessions.update(session, block_hashes(context, self.cfg.block_size))
        if api is Api.RESPONSES:
            turn_text = prompt.new + reply_text
            self.oracle.record_response(reply.id, summary.previous_response_id, turn_text)
            if summary.body.get("store") is not False:
                self._stored[reply.id] = FORMATS[api].document(reply, summary)
                while len(self._stored) > STORED_RESPONSES:
                    self._stored.popitem(last=False)
        elif api in CHAINED:
            self.oracle.record_response(reply.id, None, "")
        self.metrics.generation_tokens.inc(reply.output_tokens)
        self.metrics.finished("length" if reply.truncated else "stop")

    # -- admission, timing, faults ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _slot(self, tokens: int) -> AsyncIterator[None]:
        """A ``max_num_seqs`` slot plus the KV blocks the request occupies while it runs."""
        self.waiting += 1
        self.metrics.waiting.set(self.waiting)
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
            self.metrics.waiting.set(self.waiting)
        blocks = -(-tokens // self.cfg.block_size)
        self._set_running(1, blocks)
        try:
            yield
        finally:
            self._set_running(-1, -blocks)
            self._slots.release()

    def _set_running(self, requests: int, blocks: int) -> None:
        self.running += requests
        self._kv_blocks += blocks
        self.metrics.running.set(self.running)
        self.metrics.kv_cache_usage.set(min(self._kv_blocks / self.cfg.num_gpu_blocks, 1.0))

    async def _sleep(self, seconds: float) -> None:
        if seconds * self.cfg.time_scale > 0:
            await asyncio.sleep(seconds * self.cfg.time_scale)

    def _take_fault(self) -> bool:
        if self.fail_next > 0:
            self.fail_next -= 1
            return True
        return self.fail_every > 0 and self.requests % self.fail_every == 0

    # -- operations ------------------------------------------------------------------------

    def plan_faults(self, *, fail_next: int | None = None, fail_every: int | None = None) -> None:
        """Fail the next ``fail_next`` API requests, and/or every ``fail_every``-th one."""
        if fail_next is not None:
            self.fail_next = fail_next
        if fail_every is not None:
            self.fail_every = fail_every

    def stored(self, response_id: str) -> dict[str, Any] | None:
        """A Responses answer this instance stored (``GET /v1/responses/{id}``), if it did:
        vLLM keeps them in its own process, so only the worker that answered has it."""
        return self._stored.get(response_id)

    def reset(self) -> None:
        """Forget issued ids, cache and fault plan; Prometheus counters stay monotonic."""
        self.oracle.reset()
        self._stored.clear()
        self.cache.clear()
        self.requests = 0
        self.last_request_headers = {}
        self.fail_next = 0
        self.fail_every = self.cfg.fail_every

    async def close(self) -> None:
        """Release the KV-event socket and the sidecar's client when the app shuts down."""
        if self.kv_events is not None:
            self.kv_events.close()
        if self._client is not None:
            await self._client.close()

    def state(self) -> dict[str, Any]:
        return {
            "instance": self.cfg.instance_id,
            "model": self.cfg.model,
            "served_names": list(self.cfg.served_names),
            "requests": self.requests,
            "scrapes": self.scrapes,
            "last_request_headers": self.last_request_headers,
            "running": self.running,
            "waiting": self.waiting,
            "violations": dict(self.oracle.violations),
            "continued": dict(self.oracle.continued),
            "issued": self.oracle.issued_counts(),
            "cache": {
                "blocks": len(self.cache),
                "capacity": self.cache.num_gpu_blocks,
                "usage": self.cache.usage_fraction,
                "cpu_blocks": self.cache.cpu_blocks,
                "cpu_capacity": self.cache.num_cpu_blocks,
            },
            "faults": {"fail_next": self.fail_next, "fail_every": self.fail_every},
            "role": self.cfg.role,
            "adapters": {"loaded": list(self._adapters), "loads": self.adapter_loads},
        }


def _json_response(doc: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


def _visible_headers(request: web.Request) -> dict[str, str]:
    """What the router forwarded upstream, for tests of header rewriting; secrets redacted."""
    return {
        name.lower(): "<redacted>" if name.lower() in _SECRET_HEADERS else value
        for name, value in request.headers.items()
    }


def openai_error(
    status: int,
    message: str,
    *,
    kind: str,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error body in the OpenAI shape, which vLLM uses on every endpoint."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )
