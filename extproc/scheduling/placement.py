"""The worker side of routing: inside the model SAAR chose, which worker serves the request.

``Pools`` wires the scheduling core together for the live router, the evaluation and the
simulators alike: the worker registry (load signals), the prefix index (approximate, learnt from
routing; or precise, from the servers' KV events), the scheduler (filters, weighted scorers,
picker) and session-aware admission. A ``Prompt`` is one request's rendered prompt, hashed into
blocks at most once per model and only when something asks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..apis import render_prompt
from ..config import Config
from ..errors import ModelUnavailable, RateLimited
from ..types import Clock, RequestSummary
from . import (
    AdmissionController,
    ApproximatePrefixIndex,
    ScheduleResult,
    SchedulingRequest,
    Worker,
    WorkerRegistry,
    from_config,
)
from .kv_events import PreciseKVIndex
from .memo import BlockMemo

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

PRECISE_BLOCK_SIZE = 16
"""vLLM's default KV block size, in tokens, for the precise index."""


@dataclass(slots=True)
class Prompt:
    """One request's prompt: rendered lazily, hashed into blocks once per model (only what is
    new since the session's previous prompt), matched against each worker once per model."""

    request: RequestSummary
    session: str | None = None
    _text: str | None = None
    _blocks: dict[str, tuple[Sequence[int], int]] = field(default_factory=dict)
    """model → (block hashes, how many lead with the session's previous prompt's)."""
    _matched: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = render_prompt(self.request)
        return self._text


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes inside its model's pool: best worker first, then fallbacks."""

    workers: tuple[str, ...]
    result: ScheduleResult | None = None
    blocks: Sequence[int] = ()

    @property
    def worker(self) -> str | None:
        return self.workers[0] if self.workers else None


class Pools:
    def __init__(self, config: Config, *, clock: Clock, rng: random.Random | None = None) -> None:
        scheduling = config.scheduling
        self.enabled = scheduling.enabled
        self.registry = WorkerRegistry(
            config.models, clock=clock, staleness_seconds=scheduling.staleness_seconds
        )
        prefix = scheduling.prefix
        self.tokenizer: Tokenizer | None = None
        self.index: ApproximatePrefixIndex | PreciseKVIndex
        if prefix.mode == "precise":
            assert prefix.tokenizer is not None  # config validation guarantees it
            from .tokenizer import Tokenizer  # the tokenizers library only when precise

            self.tokenizer = Tokenizer(prefix.tokenizer)
            self.index = PreciseKVIndex(block_size=PRECISE_BLOCK_SIZE)
            self.tokens_per_block = PRECISE_BLOCK_SIZE
        else:
            self.index = ApproximatePrefixIndex.from_config(prefix)
            self.tokens_per_block = max(1, prefix.chars_per_block // 4)
        self._chars_per_block = prefix.chars_per_block
        self.memo = BlockMemo(prefix.chars_per_block)
        self.admission = AdmissionController(
            scheduling.admission, clock=clock, max_programs=config.memory.max_sessions
        )
        self.scheduler = from_config(
            scheduling, index=self.index, rng=rng or random.Random(),
            max_sessions=config.memory.max_sessions, prefer=self.admission.preferred_worker,
        )
        self._models = tuple(config.models)
        self.required = scheduling.pool_name is not None
        """An endpoint picker always sends a pick (the Endpoint Picker Protocol), also from a
        pool of one; no eligible worker is a 503 there, never a request left to the proxy."""

    def blocks(self, prompt: Prompt, model: str) -> Sequence[int]:
        return self._hashed(prompt, model)[0]

    def _hashed(self, prompt: Prompt, model: str) -> tuple[Sequence[int], int]:
        found = prompt._blocks.get(model)
        if found is None:
            if self.tokenizer is not None:
                assert isinstance(self.index, PreciseKVIndex)
                found = (self.index.hash_tokens(self.tokenizer.encode(prompt.text)), 0)
            else:
                found = self.memo.blocks(prompt.session, model, prompt.text)
            prompt._blocks[model] = found
        return found

    def matched(self, prompt: Prompt, model: str, pool: Sequence[Worker]) -> dict[str, int]:
        """Blocks of the prompt each worker of ``pool`` holds, measured once per model."""
        found = prompt._matched.get(model)
        if found is None:
            blocks = self.blocks(prompt, model)
            found = {w.address: self.index.matched_blocks(w.address, blocks) for w in pool}
            prompt._matched[model] = found
        return found

    def cached_tokens(self, prompt: Prompt, model: str) -> int | None:
        """Tokens of this prompt already cached on ``model``'s best worker (None: no pool
        to measure, e.g. scheduling off or a model with a single unscored worker)."""
        pool = self._scored_pool(model)
        if not pool:
            return None
        return max(self.matched(prompt, model, pool).values()) * self.tokens_per_block

    def place(
        self,
        prompt: Prompt,
        model: str,
        session_key: str | None,
        subset: frozenset[str] | None = None,
        *,
        bound: str | None = None,
        pinned: str | None = None,
    ) -> Placement:
        """Score ``model``'s workers; 503 when none is eligible, 429 when all are overloaded.
        ``bound`` is the session's worker (affinity), ``pinned`` a hard lock's worker, first
        while eligible. A single-worker pool with no subset hint is left to Envoy (nothing to
        choose), unless this process is an endpoint picker (``required``)."""
        pool = self.registry.pool(model)
        if not self.enabled or (len(pool) <= 1 and subset is None and not self.required):
            return Placement(())
        blocks, reused = self._hashed(prompt, model)
        request = SchedulingRequest(
            model, session_key, blocks, prompt.request.context_tokens,
            subset, bound, pinned, reused, prompt._matched.get(model),
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
        return Placement(result.ordered, result, request.prompt_blocks)

    def started(self, placement: Placement, session_key: str | None, tokens: int) -> None:
        if placement.worker is None:
            return
        self.registry.started(placement.worker)
        self.admission.turn_started(session_key, placement.worker, tokens)

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
    ) -> None:
        """The response ended: a tool boundary for admission, one fewer in flight."""
        if placement.worker is None:
            return
        self.registry.finished(placement.worker)
        self.admission.turn_finished(
            session_key, placement.worker, prompt_tokens, completion_tokens
        )

    def scrape_targets(self) -> dict[str, str]:
        """address → metrics URL of the workers whose load matters: those scored (pools of more
        than one) and, with admission on, every worker (admission needs its KV capacity)."""
        if not self.enabled:
            return {}
        everyone = self.admission.config.enabled
        return {
            w.address: w.metrics_url or ""
            for model in self._models
            for w in (self.registry.pool(model) if everyone else self._scored_pool(model))
        }

    def all_workers(self) -> list[Worker]:
        return [w for model in self._models for w in self.registry.pool(model)]

    def _scored_pool(self, model: str) -> Sequence[Worker]:
        pool = self.registry.pool(model)
        return pool if self.enabled and (len(pool) > 1 or self.required) else ()
