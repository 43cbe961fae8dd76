"""The worker side of routing: inside the model SAAR chose, which worker serves the request.

``Pools`` wires the scheduling core together for the live router, the evaluation and the
simulators alike: the worker registry (load signals), the prefix index (approximate, learnt from
routing; or precise, from the servers' KV events), the scheduler (filters, weighted scorers,
picker) and session-aware admission. A ``Prompt`` is one request's rendered prompt, hashed into
blocks at most once per model and only when something asks.

With ``scheduling.hints.enabled`` it also turns placements, tool boundaries, admission's ticks
and sessions' ends into KV hints for the engines (``kv_hints``), queued in ``hints_out`` for the
service to deliver, and keeps the session-prefix index (``session_prefix``) that tells a
session's own blocks from the prefix it shares with others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..apis import Preambles, render_prompt
from ..config import Config
from ..errors import ModelUnavailable, RateLimited
from ..state.table import Entry, SessionTable
from ..types import RequestSummary, SessionIdentity, Usage
from . import (
    AdmissionController,
    AdmissionTick,
    ApproximatePrefixIndex,
    Scheduler,
    ScheduleResult,
    SchedulingRequest,
    Worker,
    WorkerRegistry,
)
from .disaggregation import Disaggregator, Split
from .flow import FlowController
from .kv_events import PreciseKVIndex
from .kv_hints import KvHint, KvHintEmitter
from .latency import Features, LatencyPredictor
from .memo import BlockMemo
from .session_prefix import SessionPrefixIndex
from .shared_pool import SharedKVPool

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

WINDOW_BYTES_PER_TOKEN = 8
"""Bytes of rendered prompt a context window's token stands for at most, when bounding what is
hashed (real tokenizers average about 4 on English and code)."""


@dataclass(slots=True)
class Prompt:
    """One request's prompt: rendered lazily, hashed into blocks once per model (only what is
    new since the session's previous prompt), matched against each worker once per model."""

    request: RequestSummary
    session: str | None = None
    _text: str | None = None
    tokens: Sequence[int] | None = None
    """The prompt's token ids, when ``Pools.prepare`` has tokenised it."""
    counted: bool = False
    """``tokens`` are the engine's own (its chat template and tokenizer): their number is the
    context's, not an estimate."""
    _blocks: dict[str, tuple[Sequence[int], int]] = field(default_factory=dict)
    """model → (block hashes, how many lead with the session's previous prompt's)."""
    _matched: dict[str, dict[str, float]] = field(default_factory=dict)
    preambles: Preambles | None = None
    """Volatile preambles the rendering leaves out (what changes per session is no prefix)."""
    limit: int | None = None
    """Characters past which the turns need not be rendered (``Pools.render_limit``)."""

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = render_prompt(self.request, self.preambles, self.limit)
        return self._text


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes inside its model's pool: best worker first, then fallbacks."""

    workers: tuple[str, ...]
    result: ScheduleResult | None = None
    blocks: Sequence[int] = ()
    final: bool = False
    """The session's last request (``x-dynamo-session-final``): it ends when this one does."""
    split: Split | None = None
    """The prefill/decode decision (None: no disaggregation configured); ``workers`` are the
    decode worker and its fallbacks."""
    features: Features | None = None
    """What the picked worker looked like (flow control on): its latency is learnt from them."""

    @property
    def worker(self) -> str | None:
        return self.workers[0] if self.workers else None

    @property
    def prefill(self) -> str | None:
        """The prefill worker the decode worker's sidecar calls first (None: local prefill)."""
        return None if self.split is None else self.split.prefill


class Pools:
    def __init__(
        self,
        config: Config,
        *,
        registry: WorkerRegistry,
        index: ApproximatePrefixIndex | PreciseKVIndex,
        memo: BlockMemo,
        admission: AdmissionController,
        scheduler: Scheduler,
        table: SessionTable,
        flow: FlowController,
        tokenizer: Tokenizer | None = None,
        shared_pool: SharedKVPool | None = None,
        hints: KvHintEmitter | None = None,
        sessions: SessionPrefixIndex | None = None,
        disaggregation: Disaggregator | None = None,
        predictor: LatencyPredictor | None = None,
    ) -> None:
        """The parts come from ``extproc.assembly``; every per-session slot hangs on
        ``table``, whose leaving sessions this object lets go of (``left``)."""
        scheduling = config.scheduling
        self.enabled = scheduling.enabled
        self.registry = registry
        self.index = index
        self.tokenizer = tokenizer
        self.tokens_per_block = (scheduling.prefix.block_size if isinstance(index, PreciseKVIndex)
                                 else max(1, scheduling.prefix.chars_per_block // 4))
        self.memo = memo
        self.admission = admission
        self.scheduler = scheduler
        self.shared_pool = shared_pool
        self.hints = hints
        self.sessions = sessions
        self.disaggregation = disaggregation
        """Prefill/decode splitting, when the pool has prefill workers to split to."""
        self.flow = flow
        """The queue in front of the pick, while a pool is saturated (``flow_control``)."""
        self.predictor = predictor
        """The workers' TTFT and inter-token latency, learnt online (flow control on)."""
        self.table = table
        self.hints_out: deque[KvHint] = deque(maxlen=scheduling.hints.max_pending)
        """Hints made and not yet delivered, oldest first (the oldest dropped past the bound,
        counted in ``hints_dropped``)."""
        self.hints_dropped = 0
        self._models = tuple(config.models)
        self._window_blocks = {
            name: -(-m.context_window * WINDOW_BYTES_PER_TOKEN
                    // scheduling.prefix.chars_per_block)
            for name, m in config.models.items()}
        """Blocks a prompt of each model is hashed to at most: past its context window no
        worker can hold a prompt (the engine refuses it), so a body larger than that (an 8 MiB
        upload) costs no more hashing than one that fills the window."""
        self.render_limit = max(self._window_blocks.values(), default=0) * \
            scheduling.prefix.chars_per_block
        """Characters of a prompt worth rendering: the largest window's blocks' worth (a
        character is at least a byte)."""
        self.required = scheduling.pool_name is not None
        """An endpoint picker always sends a pick (the Endpoint Picker Protocol), also from a
        pool of one; no eligible worker is a 503 there, never a request left to the proxy."""

    def left(self, key: str, entry: Entry) -> None:
        """A session left the session table (idle, the bound, its end): its KV is released on
        the workers it used, then every scheduling slot of it goes."""
        if self.hints is not None and self.sessions is not None:
            self._ended(key)
            self.sessions.left(key, entry)
            self.hints.left(key, entry)
        self.memo.left(key, entry)
        self.admission.left(key, entry)
        for scorer in self.scheduler.session_slots:
            scorer.left(key, entry)

    def blocks(self, prompt: Prompt, model: str) -> Sequence[int]:
        return self._hashed(prompt, model)[0]

    def prepare(self, prompt: Prompt) -> None:
        """The work on a prompt that reads no shared state — rendering it, and in precise mode
        tokenising it — done where the body is parsed (a worker thread for a large body), so
        it never holds the event loop."""
        if self.tokenizer is not None and prompt.tokens is None:
            # the engine's own tokens, where the router can render the request as it does:
            # they count the context against the windows, and key the precise index
            prompt.tokens = self.tokenizer.prompt_tokens(prompt.request)
            prompt.counted = prompt.tokens is not None
        if self.enabled and (self.required or any(
                len(self.registry.pool(model)) > 1 for model in self._models)):
            text = prompt.text  # pools of one are Envoy's to balance: nothing to render for
            if isinstance(self.index, PreciseKVIndex) and prompt.tokens is None:
                assert self.tokenizer is not None
                prompt.tokens = self.tokenizer.encode(text)

    def _hashed(self, prompt: Prompt, model: str) -> tuple[Sequence[int], int]:
        found = prompt._blocks.get(model)
        if found is None:
            if isinstance(self.index, PreciseKVIndex):
                assert self.tokenizer is not None
                if prompt.tokens is None:
                    prompt.tokens = self.tokenizer.encode(prompt.text)
                found = (self.index.hash_tokens(prompt.tokens), 0)
            else:
                found = self.memo.blocks(prompt.session, model, prompt.text,
                                         self._window_blocks.get(model))
            prompt._blocks[model] = found
        return found

    def matched(self, prompt: Prompt, model: str, pool: Sequence[Worker]) -> dict[str, float]:
        """Blocks of the prompt each worker of ``pool`` holds (device-equivalent, lower tiers
        weighted), measured once per model."""
        found = prompt._matched.get(model)
        if found is None:
            blocks = self.blocks(prompt, model)
            found = {w.address: self.index.matched_blocks(w.address, blocks) for w in pool}
            prompt._matched[model] = found
        return found

    def cached_tokens(self, prompt: Prompt, model: str) -> int | None:
        """Tokens of this prompt already cached on ``model``'s best worker, lower tiers
        weighted as placement weighs them (None: no pool to measure, e.g. scheduling off or a
        model with a single unscored worker)."""
        pool = self._scored_pool(model)
        if not pool:
            return None
        return int(max(self.matched(prompt, model, pool).values()) * self.tokens_per_block)

    def place(
        self,
        prompt: Prompt,
        model: str,
        session_key: str | None,
        subset: frozenset[str] | None = None,
        *,
        bound: str | None = None,
        pinned: str | None = None,
        identity: SessionIdentity | None = None,
        ttft: float | None = None,
        tpot: float | None = None,
        request_id: str | None = None,
    ) -> Placement:
        """Score ``model``'s workers; 503 when none is eligible, 429 when all are overloaded.
        ``bound`` is the session's worker (affinity), ``pinned`` a hard lock's worker, first
        while eligible; ``identity`` names the session's parent (a sub-agent goes where its
        parent is) and its id on the wire (KV hints); ``ttft`` and ``tpot`` its latency
        targets (the SLO scorer's); ``request_id`` names it to the predicted cost form until
        ``first_token`` / ``finished``. A single-worker pool with no subset hint is left to
        Envoy (nothing to choose), unless this process is an endpoint picker (``required``)."""
        pool = self.registry.pool(model)
        if not self.enabled or (len(pool) <= 1 and subset is None and not self.required):
            return Placement(())
        blocks, reused = self._hashed(prompt, model)
        parent = None
        if identity is not None and identity.parent_session_id is not None:
            parent = SessionIdentity(identity.tenant, identity.parent_session_id).key
        request = SchedulingRequest(
            model, session_key, blocks, prompt.request.context_tokens,
            subset, bound, pinned, reused, prompt._matched.get(model), parent,
            adapter=model if self.registry.is_adapter(model) else None, ttft=ttft, tpot=tpot,
            request_id=request_id,
        )
        result = self.scheduler.schedule(request, pool)
        if result.shed:
            raise RateLimited(
                f"every worker of {model} is overloaded; retry shortly", retry_after=1
            )
        if not result.ordered:
            raise ModelUnavailable(
                f"no eligible worker of {model}"
                + (" in the proxy's subset hint" if subset is not None else ""),
                retry_after=1,
            )
        final = identity is not None and identity.final
        if self.hints is not None and self.sessions is not None and session_key is not None:
            worker = result.ordered[0]
            self.sessions.placed(session_key, blocks, worker, parent=parent)
            matched = result.matched_blocks.get(worker, 0.0) * self.tokens_per_block
            self._queue(self.hints.routed(
                session_key, worker, matched_tokens=int(matched),
                prompt_tokens=prompt.request.context_tokens, parent=parent,
                name=None if identity is None else identity.session_id))
        split = None
        if self.disaggregation is not None:  # the decode worker is picked: split or not
            split = self.disaggregation.decide(request, result.ordered[0],
                                               result.matched_blocks, pool)
        features = None
        if self.predictor is not None and self.flow.enabled:
            picked = next(w for w in pool if w.address == result.ordered[0])
            matched = result.matched_blocks.get(picked.address, 0.0) * self.tokens_per_block
            features = Features.of(picked, max(0.0, prompt.request.context_tokens - matched))
        return Placement(result.ordered, result, request.prompt_blocks, final, split, features)

    def dispatch(self, model: str) -> list[str]:
        """Flow control's tickets of ``model``'s queue that may go now."""
        return self.flow.dispatch(model, self._scored_pool(model)) if self.flow.enabled else []

    def scored(self, model: str) -> Sequence[Worker]:
        """The workers of ``model`` this process picks among (none: Envoy balances)."""
        return self._scored_pool(model)

    def started(self, placement: Placement, session_key: str | None, tokens: int) -> None:
        if placement.worker is None:
            return
        self.registry.started(placement.worker)
        if placement.prefill is not None:
            self.registry.started(placement.prefill)
        self.admission.turn_started(session_key, placement.worker, tokens)

    def first_token(self, request_id: str) -> None:
        """A streamed answer's first token passed: its prefill no longer waits ahead of others
        on its worker (the predicted cost form)."""
        predicted = self.scheduler.predicted
        if predicted is not None:
            predicted.first_token(request_id)

    def answered(self, request_id: str, usage: Usage | None) -> None:
        """An answer is complete, with what it used: the predicted cost form learns its
        timings (its cached tokens, when the engine reported them)."""
        predicted = self.scheduler.predicted
        if predicted is None or usage is None:
            return
        cached = usage.cached_tokens if not usage.estimated and usage.cached_tokens else None
        predicted.answered(request_id, usage.prompt_tokens, cached, usage.completion_tokens)

    def prefilled(self, placement: Placement) -> None:
        """The answer began: the decode worker's sidecar is past its prefill worker's call."""
        if placement.prefill is not None:
            self.registry.finished(placement.prefill)

    def served(self, placement: Placement, address: str) -> None:
        """Envoy served the request from ``address``: when that is not the pick (a fallback, or
        the pick was gone), the prefix index learns where the prompt really went."""
        if placement.worker is not None and address != placement.worker:
            self.index.routed(address, placement.blocks)

    def finished(
        self,
        placement: Placement,
        session_key: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        answered: bool = True,
        request_id: str | None = None,
    ) -> None:
        """The response ended: a tool boundary for admission, one fewer in flight (and on
        the prefill worker too when no answer began: ``prefilled`` was never told), nothing
        more of it ahead of others in the predicted cost form."""
        if placement.worker is None:
            return
        self.registry.finished(placement.worker)
        predicted = self.scheduler.predicted
        if request_id is not None and predicted is not None:
            predicted.finished(request_id)
        if not answered:
            self.prefilled(placement)
        self.admission.turn_finished(
            session_key, placement.worker, prompt_tokens, completion_tokens
        )
        if self.hints is not None:
            paused = self.admission.is_paused(session_key)
            self._queue(self.hints.turn_finished(session_key, paused=paused))
            if placement.final:
                self._ended(session_key)

    def tick(self, workers: Sequence[Worker]) -> AdmissionTick:
        """One admission step; its pauses, resumes and forgotten sessions become KV hints."""
        tick = self.admission.tick(workers)
        if self.hints is not None and self.sessions is not None:
            for key in tick.paused:
                self.sessions.paused(key)
            for key in tick.resumed:
                self.sessions.resumed(key)
            self._queue(self.hints.ticked(
                AdmissionTick(tick.paused, tick.resumed)))
            for key in tick.forgotten:
                self._ended(key)
        return tick

    def _queue(self, hints: Iterable[KvHint]) -> None:
        for hint in hints:
            self.hints_dropped += len(self.hints_out) == self.hints_out.maxlen
            self.hints_out.append(hint)

    def _ended(self, session_key: str | None) -> None:
        """The session is over: release its blocks past the prefix it shares with open
        sessions (a sub-agent's parent resends that context), measured by the session-prefix
        index rather than assumed."""
        assert self.hints is not None and self.sessions is not None
        if session_key is None:
            return
        keep = self.sessions.shared(session_key) * self.tokens_per_block
        self.sessions.finished(session_key)
        self._queue(
            KvHint(h.kind, h.session, h.worker, keep) for h in self.hints.ended(session_key))

    def scrape_targets(self) -> dict[str, str]:
        """address → metrics URL of the workers whose load matters (``scrape_workers``)."""
        return {w.address: w.metrics_url or "" for w in self.scrape_workers()}

    def scrape_workers(self) -> list[Worker]:
        """The workers whose load matters: those scored (pools of more than one) and, with
        admission on, every worker (admission needs its KV capacity). An address serving
        several models comes once per model."""
        if not self.enabled:
            return []
        everyone = self.admission.config.enabled
        return [w for model in self._models
                for w in (self.registry.pool(model) if everyone else self._scored_pool(model))]

    def view(self) -> list[dict[str, object]]:
        """Every worker as the router sees it now (the admin's ``GET /v1/workers``)."""
        count = self.index.block_count if isinstance(self.index, PreciseKVIndex) else None
        return [{
            "model": w.model, "address": w.address, "running": w.running, "waiting": w.waiting,
            "kv_usage": w.kv_usage, "block_size": w.block_size, "num_blocks": w.num_blocks,
            "in_flight": w.in_flight, "requests": w.requests, "scraped_at": w.scraped_at,
            "stale": w.stale, "healthy": w.healthy,
            "indexed_blocks": None if count is None else count(w.address),
        } for w in self.all_workers()]

    def all_workers(self) -> list[Worker]:
        return [w for model in self._models for w in self.registry.pool(model)]

    def _scored_pool(self, model: str) -> Sequence[Worker]:
        pool = self.registry.pool(model)
        return pool if self.enabled and (len(pool) > 1 or self.required) else ()
