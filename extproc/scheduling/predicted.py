"""The ``predicted`` cost form: each candidate worker's predicted time to first token, in
seconds, and the pick that minimises it.

For a request on worker ``w``::

    ttft(w)   = overhead + adapter(w) + wait(w) + prefill(w) + steps(w)
    wait      = ahead_tokens(w) x s_per_token(w)
    prefill   = uncached_tokens(w) x s_per_token(w)
    steps     = chunks x (step(w) + seq(w) x decoding(w))    (0 while nothing decodes)
    cost(w)   = ttft(w) + interference(w) + evicts(w)
    interference = decoding(w) x prefill(w)
    adapter   = its LoRA adapter's load (and wait for a slot) where it is not loaded

``uncached_tokens`` is the prompt less what the prefix index matched there, lower memory tiers
weighted (``TierWeights``: a block in host memory costs a quarter of its prefill); the
approximate index and the precise one both count blocks routed there and not yet confirmed.
``ahead_tokens`` is the prefill queued ahead: the uncached prompts of the requests this router
sent there that have no first token yet (``picked`` until ``first_token`` / ``finished``), or
the worker's scraped waiting requests at the model's average uncached prompt, whichever is
more. ``decoding`` is its other requests (running, and in flight here); the engine runs a
decode step of them with every prefill chunk of ``chunk_tokens``, and each of them waits out
this request's prefill between two of its tokens (``interference``). ``evicts`` prices what
the request's KV does to the sessions live on the worker (``ActiveSessionsScorer``'s
placements: their latest prompts): a session placed anew brings the model's expected session
size (its prompt, if larger) less what it shares there, a session's next turn on its own
worker its growth; what no longer fits in the device's KV is prefilled again when they come
back — at a copy's cost while host memory holds it. That is what spreads sessions: a new one
goes where its prefix is unless the wait there, or the KV it would evict there, costs more.

The rates are learnt online per (model, worker) (``rates.RateBook``: the pool's intercepts,
each worker's slopes, from conservative ``Priors``), from:

* the answers: a streamed answer's time to first token against the tokens it had to prefill
  (its usage's cached tokens, else the prediction's) and the queue ahead of it at the pick;
  its inter-token latency against the batch it joined;
* the engine's own counters between two scrapes (vLLM's ``request_prefill_time_seconds``,
  ``prompt_tokens``, ``prefix_cache_hits``, ``inter_token_latency_seconds``).

Candidates within ``tie_seconds`` (or ``tie_fraction``) of the best are a tie, broken by the
least to prefill (the same time, less work: a concurrent identical prompt joins the first),
then by the weighted scorers' totals (unitless weights only break ties), then at random.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .rates import Priors, RateBook, Rates
from .sessions import ActiveSessionsScorer
from .types import Picker, Prediction, SchedulingRequest, Worker

ENTRY_SECONDS = 120.0
"""A routed request no answer was heard of leaves the wait after this long."""
MAX_ENTRIES = 100_000
"""Routed requests remembered at most (the oldest go first)."""


@dataclass(slots=True)
class _Queue:
    """What this router sent one (model, worker) that has no first token yet."""

    tokens: float = 0.0
    """Their uncached prompt tokens."""
    requests: int = 0


_EMPTY = _Queue()
"""A worker nothing is queued on (read only)."""


@dataclass(slots=True)
class _Entry:
    """A routed request, from its pick until its usage came and its stream ended."""

    model: str
    worker: str
    prediction: Prediction
    at: float
    first: float | None = None
    answered: bool = False
    ended: bool = False
    learnt: bool = False


class PredictedCost:
    """The predicted cost form (``scheduling.cost_form: predicted``): ``predict`` each
    candidate, ``order`` them, and hear of each routed request (``picked``, ``first_token``,
    ``finished``)."""

    def __init__(self, *, priors: Priors | None = None,
                 sessions: ActiveSessionsScorer | None = None,
                 clock: Callable[[], float] = time.monotonic, cpu_weight: float = 0.75,
                 tie_seconds: float = 0.001, tie_fraction: float = 0.02,
                 host_guess: bool = False,
                 adapters: Callable[[Worker], frozenset[str]] | None = None) -> None:
        """``sessions``: the live sessions' placements (no ``evicts`` term without them);
        ``cpu_weight``: what a block in host memory is worth in device blocks
        (``scheduling.prefix.tier_weights.cpu``); ``host_guess``: the index knows the device
        only (the approximate one), so a session's previous prompt on its own worker with a
        host-memory tier counts as there, at ``cpu_weight``, where the index lost it;
        ``adapters``: the LoRA adapters in a worker's slots (``LoraAffinityScorer.loaded``;
        its gauge's running and waiting adapters without)."""
        self.host_guess = host_guess
        self._adapters = adapters or _gauged
        self.book = RateBook(priors)
        self.sessions = sessions
        self._clock = clock
        self._cpu_weight = min(max(cpu_weight, 0.0), 1.0)
        self.tie_seconds = tie_seconds
        self.tie_fraction = tie_fraction
        self._queues: dict[tuple[str, str], _Queue] = {}
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._uncached: dict[str, float] = {}
        """model → moving average of its requests' uncached prompt tokens."""
        self._session_tokens: dict[str, float] = {}
        """model → moving average of its sessions' KV at their largest (when they left)."""
        self._serial = 0
        if sessions is not None:
            sessions.lapsed.append(self._lapsed)

    @property
    def priors(self) -> Priors:
        return self.book.priors

    @priors.setter
    def priors(self, priors: Priors) -> None:
        self.book.priors = priors

    def rates(self, model: str, address: str) -> Rates:
        """``address``'s rates for ``model`` as learnt so far."""
        return self.book.rates(model, address)


    # -- the prediction ----------------------------------------------------------------------

    def predict(self, request: SchedulingRequest, workers: Sequence[Worker],
                matched: Mapping[str, float]) -> dict[str, Prediction]:
        """Each worker's prediction for ``request`` (``matched``: the prefix blocks each
        holds, device-equivalent)."""
        self._expire()
        model = workers[0].model if workers else request.model
        average = self._uncached.get(model, self.priors.uncached_tokens)
        out = {}
        for worker in workers:
            if worker.engine is not None:
                self.book.scraped(worker)
            address = worker.address
            rates = self.rates(worker.model, address)
            held = matched.get(address, 0.0)
            if (self.host_guess and address == request.bound_worker and worker.cpu_blocks
                    and request.reused > held):
                # the session's previous prompt was computed here; what the device let go
                # an offloading engine keeps in host memory for a while
                held += (request.reused - held) * self._cpu_weight
            uncached = _uncached(request, held)
            queue = self._queues.get((worker.model, address)) or _EMPTY
            routed_tokens, routed = queue.tokens, queue.requests
            waiting = 0 if worker.stale else worker.waiting
            ahead_tokens = max(routed_tokens, waiting * average)
            decoding = max(0, worker.requests - max(routed, waiting))
            chunks = max(1, math.ceil((ahead_tokens + uncached) / self.priors.chunk_tokens))
            steps = chunks * (rates.step_s + rates.seq_s * decoding) if decoding else 0.0
            prefill = uncached * rates.s_per_token
            out[address] = Prediction(
                uncached, ahead_tokens, decoding, ahead_tokens * rates.s_per_token, prefill,
                steps, rates.overhead_s, decoding * prefill, self._adapter(request, worker),
                self._evicts(request, worker, uncached) * rates.s_per_token)
        return out

    def _adapter(self, request: SchedulingRequest, worker: Worker) -> float:
        """Seconds a LoRA adapter's request costs there: none where its adapter is in a slot,
        a load where a slot is free (a worker that does not report ``max_lora`` has one);
        where every slot is taken, a wait for one, its load, and the reload of the adapter
        it evicts, whose live sessions come back for it."""
        adapter = request.adapter
        if adapter is None:
            return 0.0
        loaded = self._adapters(worker)
        if adapter in loaded:
            return 0.0
        p = self.priors
        if worker.max_lora is None or len(loaded) < worker.max_lora:
            return p.adapter_load_s
        return p.slot_wait_s + 2 * p.adapter_load_s

    def _evicts(self, request: SchedulingRequest, worker: Worker, uncached: float) -> float:
        """Tokens of prefill (device-equivalent) this request's KV on ``worker`` costs the
        sessions live there: what no longer fits in its device KV beside theirs, at a copy's
        price while its host memory holds it."""
        sessions, capacity = self.sessions, worker.capacity_tokens
        if sessions is None or not capacity:
            return 0.0
        expected = self._session_tokens.get(request.model, self.priors.session_tokens)
        before = float(sessions.load(worker.address))
        placed = sessions.placed(request.session_key)
        if placed is not None and placed.worker == worker.address:
            # its own KV is there already: it grows by what is new
            after = before + max(0.0, request.prompt_tokens - placed.tokens)
        else:
            size = max(float(request.prompt_tokens), expected)
            after = before + max(0.0, size - (request.prompt_tokens - uncached))
        host = (worker.cpu_blocks or 0) * worker.block_size
        return self._spilled(after - capacity, host) - self._spilled(before - capacity, host)

    def _spilled(self, tokens: float, host: float) -> float:
        """What ``tokens`` over the device's KV cost again, device-equivalent: a copy back
        while host memory holds them, a prefill beyond."""
        if tokens <= 0:
            return 0.0
        kept = min(tokens, host)
        return kept * (1.0 - self._cpu_weight) + (tokens - kept)

    def order(self, predictions: Mapping[str, Prediction], weighted: Mapping[str, float],
              picker: Picker) -> list[str]:
        """Cheapest first. Among the candidates within the tie band of the cheapest, those
        with the least to prefill first (the same time, less work: a concurrent identical
        prompt joins the first), each group in the order of their weighted scores (the
        picker's: highest first, ties at random)."""
        if not predictions:
            return []
        costs = {a: p.cost_s for a, p in predictions.items()}
        best = min(costs.values())
        band = best + max(self.tie_seconds, self.tie_fraction * best)
        tied = [a for a, c in costs.items() if c <= band]
        least = min(predictions[a].uncached_tokens for a in tied) + 0.5
        first = {a: weighted.get(a, 0.0) for a in tied if predictions[a].uncached_tokens < least}
        second = {a: weighted.get(a, 0.0) for a in tied if a not in first}
        rest = sorted((a for a in costs if a not in tied), key=lambda a: (costs[a], a))
        return [*picker.pick(first), *(picker.pick(second) if second else ()), *rest]

    # -- what happened -----------------------------------------------------------------------

    def picked(self, request: SchedulingRequest, worker: Worker,
               prediction: Prediction | None) -> None:
        """``request`` went to ``worker``: its uncached prompt is ahead of every later
        request there until its first token."""
        if prediction is None:
            return
        self._serial += 1
        key = request.request_id or f"~{self._serial}"
        self._drop(key)
        model, address = worker.model, worker.address
        queue = self._queues.get((model, address))
        if queue is None:
            queue = self._queues[(model, address)] = _Queue()
        queue.tokens += prediction.uncached_tokens
        queue.requests += 1
        previous = self._uncached.get(model, self.priors.uncached_tokens)
        self._uncached[model] = previous + 0.1 * (prediction.uncached_tokens - previous)
        self._entries[key] = _Entry(model, address, prediction, self._clock())
        while len(self._entries) > MAX_ENTRIES:
            self._drop(next(iter(self._entries)))

    def first_token(self, key: str) -> None:
        """``key``'s first token came: its prefill is no longer ahead of anyone."""
        entry = self._entries.get(key)
        if entry is None or entry.first is not None:
            return
        entry.first = self._clock()
        self._unqueue(entry)

    def answered(self, key: str, prompt_tokens: int | None = None,
                 cached_tokens: int | None = None, completion_tokens: int = 0) -> None:
        """``key``'s answer is complete, with its usage: learn its time to first token
        against what it prefilled (the usage's uncached tokens when the engine reported its
        cached ones) and its inter-token latency."""
        entry = self._entries.get(key)
        if entry is None or entry.answered:
            return
        entry.answered = True
        if entry.first is not None:
            uncached = None
            if prompt_tokens is not None and cached_tokens is not None:
                uncached = max(0.0, float(prompt_tokens - cached_tokens))
            self._learn_ttft(entry, uncached)
            if completion_tokens >= 2:
                gap = (self._clock() - entry.first) / (completion_tokens - 1)
                self.book.observe_itl(entry.model, entry.worker,
                                  float(entry.prediction.decoding + 1), gap)
        if entry.ended:
            self._drop(key)

    def finished(self, key: str) -> None:
        """``key``'s request is over at the router (answered, failed or abandoned): it no
        longer waits ahead of anyone; its time to first token is learnt now if its usage
        has not come (it may come later, for the inter-token latency)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if entry.answered or entry.first is None:
            self._drop(key)
            return
        entry.ended = True
        self._learn_ttft(entry, None)

    def _learn_ttft(self, entry: _Entry, uncached: float | None) -> None:
        if entry.first is None or entry.learnt:
            return
        entry.learnt = True
        p = entry.prediction
        work = p.ahead_tokens + (p.uncached_tokens if uncached is None else uncached)
        self.book.observe_ttft(entry.model, entry.worker, work / 1000.0,
                           entry.first - entry.at - p.steps_s)

    def _drop(self, key: str) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is not None and entry.first is None:
            self._unqueue(entry)
        return entry

    def _unqueue(self, entry: _Entry) -> None:
        queue = self._queues.get((entry.model, entry.worker))
        if queue is None:
            return
        queue.requests = max(0, queue.requests - 1)
        queue.tokens = max(0.0, queue.tokens - entry.prediction.uncached_tokens)
        if not queue.requests:
            queue.tokens = 0.0

    def _expire(self) -> None:
        horizon = self._clock() - ENTRY_SECONDS
        entries = self._entries
        while entries:
            key, entry = next(iter(entries.items()))
            if entry.at > horizon:
                break
            self._drop(key)

    def _lapsed(self, model: str | None, tokens: int) -> None:
        """A session's placement lapsed (idle, or it left): its KV at its last turn is a
        session's size on ``model``."""
        if model is None:
            return
        previous = self._session_tokens.get(model)
        self._session_tokens[model] = (float(tokens) if previous is None
                                       else previous + 0.1 * (tokens - previous))


def _gauged(worker: Worker) -> frozenset[str]:
    return worker.adapters_running | worker.adapters_waiting


def _uncached(request: SchedulingRequest, matched: float) -> float:
    blocks = len(request.prompt_blocks)
    if not blocks:
        return float(request.prompt_tokens)
    return request.prompt_tokens * (1.0 - min(matched, blocks) / blocks)

