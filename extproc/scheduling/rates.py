"""The rates the ``predicted`` cost form prices a worker at, learnt online: its prefill rate
and fixed overhead (time to first token against the tokens prefilled), its decode step's fixed
time and cost per decoding request (inter-token latency against the batch).

Each is a least-squares line over the recent observations (each older one weighs ``DECAY`` of
the next). Per model (the pool) the line is pulled toward ``Priors`` (worth
``Priors.strength`` observations), and gives the intercepts, the same on every worker of a pool
(the network, a step's fixed cost: they never decide between workers); per (model, worker) the
slopes move from the pool's (``WORKER_STRENGTH``). A new worker starts from what its pool has
measured, a new pool from the priors. Observations come from the answers (``observe_ttft``,
``observe_itl``) and from the engine's own counters between two scrapes (``scraped``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .types import EngineTotals, Worker

DECAY = 0.98
"""Weight an observation keeps per newer one (about the last 50 count)."""
WORKER_STRENGTH = 8.0
"""How many observations (of a thousand tokens, or of one decoding request) a worker's own
slopes need before they move as far from its pool's as halfway."""


@dataclass(frozen=True, slots=True)
class Priors:
    """What a worker is assumed to do before it is measured: on the slow side (a small GPU or
    a CPU engine), so a cached prefix is worth more, not less, than it turns out to be."""

    prefill_tokens_per_s: float = 5_000.0
    overhead_s: float = 0.005
    """The network and the engine's scheduling, per request."""
    step_s: float = 0.02
    """A decode step's fixed time (reading the weights)."""
    seq_s: float = 0.0005
    """What each decoding request adds to a step."""
    chunk_tokens: int = 2048
    """Prefill tokens an engine step takes (vLLM's ``max_num_batched_tokens``)."""
    uncached_tokens: float = 1024.0
    """A waiting request's prefill, before the model's average is known."""
    adapter_load_s: float = 0.25
    """Loading a LoRA adapter into a free GPU slot."""
    slot_wait_s: float = 1.0
    """Waiting for a slot when every one holds an adapter in use."""
    session_tokens: float = 0.0
    """A new session's expected KV at its largest, before sessions of the model have been
    seen end (0: its prompt; a prior larger than the prompts of one-shot requests would
    spread them from the worker holding their shared prefix)."""
    strength: float = 1.0
    """Observations the priors weigh."""


@dataclass(slots=True)
class _Fit:
    """``y ~ a + b x`` by least squares over decayed observations, regularised toward a
    prior ``(a0, b0)`` with weights ``(s0, s1)`` (the solve is two by two), neither
    negative."""

    n: float = 0.0
    sx: float = 0.0
    sxx: float = 0.0
    sy: float = 0.0
    sxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        self.n = self.n * DECAY + 1.0
        self.sx = self.sx * DECAY + x
        self.sxx = self.sxx * DECAY + x * x
        self.sy = self.sy * DECAY + y
        self.sxy = self.sxy * DECAY + x * y

    def slope(self, a: float, b0: float, weight: float) -> float:
        """The slope through intercept ``a``, regularised toward ``b0``; never negative."""
        return max(0.0, (self.sxy - a * self.sx + weight * b0) / (self.sxx + weight))

    def solve(self, prior: tuple[float, float], weight: tuple[float, float]
              ) -> tuple[float, float]:
        a11, a12, a22 = self.n + weight[0], self.sx, self.sxx + weight[1]
        b1, b2 = self.sy + weight[0] * prior[0], self.sxy + weight[1] * prior[1]
        det = a11 * a22 - a12 * a12
        if det <= 0:
            return prior
        a, b = (b1 * a22 - a12 * b2) / det, (a11 * b2 - a12 * b1) / det
        if a < 0:  # no time is negative: the best fit through the origin
            return 0.0, max(0.0, b2 / a22)
        if b < 0:
            return max(0.0, b1 / a11), 0.0
        return a, b


@dataclass(frozen=True, slots=True)
class Rates:
    """One worker's rates as fitted now."""

    overhead_s: float
    s_per_token: float
    step_s: float
    seq_s: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return 1.0 / self.s_per_token


@dataclass(slots=True)
class _Lines:
    """One (model, worker)'s lines, or one pool's, and the worker's last engine totals."""

    ttft: _Fit = field(default_factory=_Fit)
    """Time to first token less its decode steps, against thousands of tokens prefilled (the
    queue ahead and its own)."""
    itl: _Fit = field(default_factory=_Fit)
    """Inter-token latency against the requests decoding."""
    engine: EngineTotals | None = None
    scraped_at: float | None = None


class RateBook:
    """Every worker's rates, per model."""

    def __init__(self, priors: Priors | None = None) -> None:
        self._priors = priors or Priors()
        self._workers: dict[tuple[str, str], _Lines] = {}
        self._pooled: dict[str, _Lines] = {}
        self._rates: dict[tuple[str, str], Rates] = {}
        """The lines solved, until the next observation."""

    @property
    def priors(self) -> Priors:
        return self._priors

    @priors.setter
    def priors(self, priors: Priors) -> None:
        self._priors = priors
        self._rates.clear()

    def rates(self, model: str, address: str) -> Rates:
        """``address``'s rates for ``model``: its own observations, pulled toward its pool's."""
        found = self._rates.get((model, address))
        if found is None:
            found = self._rates[(model, address)] = self._fitted(model, address)
        return found

    def _fitted(self, model: str, address: str) -> Rates:
        """The pool's fits (pulled toward the priors) give the intercepts, the same on every
        worker (the network, a step's fixed cost); a worker's own observations move its
        slopes (its prefill rate, its cost per decoding request) from the pool's."""
        p = self._priors
        pooled = self._pooled.get(model)
        overhead, per_k = p.overhead_s, 1000.0 / p.prefill_tokens_per_s
        step, seq = p.step_s, p.seq_s
        if pooled is not None:
            overhead, per_k = pooled.ttft.solve((overhead, per_k), (p.strength, p.strength))
            step, seq = pooled.itl.solve((step, seq), (p.strength, p.strength * 16.0))
        own = self._workers.get((model, address))
        if own is not None:
            per_k = own.ttft.slope(overhead, per_k, WORKER_STRENGTH)
            seq = own.itl.slope(step, seq, WORKER_STRENGTH * 16.0)
        return Rates(min(max(overhead, 0.0), 1.0), min(max(per_k / 1000.0, 1e-7), 1e-2),
                     min(max(step, 0.0), 1.0), min(max(seq, 0.0), 0.1))

    def _lines(self, model: str, address: str) -> _Lines:
        found = self._workers.get((model, address))
        if found is None:
            found = self._workers[(model, address)] = _Lines()
        return found

    def observe_ttft(self, model: str, address: str, thousands: float, seconds: float) -> None:
        """A request's first token ``seconds`` after the pick, less its decode steps, for
        ``thousands`` of tokens prefilled (the queue ahead of it and its own)."""
        if seconds <= 0 or not math.isfinite(seconds) or thousands < 0:
            return
        self._lines(model, address).ttft.add(thousands, seconds)
        self._pooled.setdefault(model, _Lines()).ttft.add(thousands, seconds)
        self._rates.clear()

    def observe_itl(self, model: str, address: str, decoding: float, seconds: float) -> None:
        """``seconds`` between two output tokens with ``decoding`` requests decoding."""
        if seconds <= 0 or not math.isfinite(seconds):
            return
        self._lines(model, address).itl.add(decoding, seconds)
        self._pooled.setdefault(model, _Lines()).itl.add(decoding, seconds)
        self._rates.clear()

    def scraped(self, worker: Worker) -> None:
        """Learn from the engine's totals, once per scrape: the mean prefill time of the
        requests it prefilled since the previous one against their mean uncached prompt, and
        the mean inter-token gap against the requests it was running."""
        state = self._lines(worker.model, worker.address)
        if worker.scraped_at == state.scraped_at:
            return
        before, now = state.engine, worker.engine
        state.engine, state.scraped_at = now, worker.scraped_at
        if before is None or now is None:
            return
        prefills = _delta(now.prefills, before.prefills)
        seconds = _delta(now.prefill_seconds, before.prefill_seconds)
        prompt = _delta(now.prompt_tokens, before.prompt_tokens)
        cached = _delta(now.cached_tokens, before.cached_tokens) or 0.0
        if prefills and prefills > 0 and seconds is not None and prompt is not None:
            uncached = max(0.0, prompt - cached) / prefills
            self.observe_ttft(worker.model, worker.address, uncached / 1000.0,
                              seconds / prefills)
        gaps = _delta(now.itls, before.itls)
        gap_seconds = _delta(now.itl_seconds, before.itl_seconds)
        if gaps and gaps > 0 and gap_seconds is not None:
            self.observe_itl(worker.model, worker.address, float(max(1, worker.running)),
                             gap_seconds / gaps)


def _delta(now: float | None, before: float | None) -> float | None:
    """How far a counter moved (None: not reported, or reset by a restart)."""
    if now is None or before is None or now < before:
        return None
    return now - before
