"""The runner: filters, then weighted scorers (or Dynamo's cost), then the picker, for the
workers of one model's pool. It times every plugin and contains its failures (a raising filter
is skipped, a raising scorer scores 0), so one bad plugin degrades a pick but never fails it.
After the pick the prefix index and the pick observers learn where the request went."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from ..config import Scheduling
from ..state.table import SessionTable
from .cost import DynamoCost
from .filters import DecodeFilter, HealthyFilter, SubsetFilter
from .latency import LatencyPredictor
from .lora import LoraAffinityScorer
from .picker import MaxScorePicker
from .plugins import SCORERS, Context, active_sessions
from .predicted import PredictedCost
from .prefix_index import ApproximatePrefixIndex
from .sessions import ActiveSessionsScorer
from .types import (
    Filter,
    Picker,
    PickObserver,
    Prediction,
    PrefixIndex,
    ScheduleResult,
    SchedulingRequest,
    Scorer,
    Worker,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class Scheduler:
    def __init__(
        self,
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        filters: Sequence[Filter],
        index: PrefixIndex,
        *,
        cost: DynamoCost | None = None,
        predicted: PredictedCost | None = None,
        observers: Sequence[PickObserver] = (),
        max_waiting: int = 0,
        timer: Callable[[], float] = time.perf_counter,
        prefer: Callable[[str | None], str | None] | None = None,
        placed: Callable[[str | None], str | None] | None = None,
    ) -> None:
        """``cost`` switches to Dynamo's cost form (scorers then unused); ``predicted`` to the
        predicted time to first token (the scorers only break its ties, and a sub-agent goes
        where the prediction sends it, not to its parent's worker regardless);
        ``max_waiting`` > 0
        sheds a request when every candidate has more waiting requests than that; ``prefer``
        names a session's worker that goes first if eligible (admission reserved room there);
        a request's ``pinned`` worker (a hard lock) goes first before that. ``placed`` tells
        where a live session was placed: a sub-agent's first turn (no worker of its own yet)
        goes first to its parent's, whose context it starts from."""
        self.scorers = tuple(scorers)
        self.picker = picker
        self.filters = tuple(filters)
        self.index = index
        self.cost = cost
        self.predicted = predicted
        self.observers = tuple(observers)
        self.max_waiting = max_waiting
        self._timer = timer
        self._prefer = prefer
        self._placed = placed
        plugins = (*(s for s, _ in self.scorers), *self.observers)
        self.active_sessions = next(
            (s for s in plugins if isinstance(s, ActiveSessionsScorer)), None)
        self.session_slots = tuple(dict.fromkeys(
            s for s in plugins if isinstance(s, ActiveSessionsScorer | LoraAffinityScorer)))
        """The scorers whose per-session slots hang on the session table (told when a session
        leaves it)."""

    def reweigh(self, weights: Mapping[str, float], overlap_weight: float | None = None) -> None:
        """New weights for the scorers built at start (one missing from ``weights``: 0) and,
        in the Dynamo cost form, a new overlap weight: what SIGHUP changes without a restart.
        A scorer not built at start cannot be added here."""
        self.scorers = tuple((s, float(weights.get(_name(s), 0.0))) for s, _ in self.scorers)
        if self.cost is not None and overlap_weight is not None:
            self.cost.overlap_weight = overlap_weight

    def weights(self) -> dict[str, float]:
        """The scorers built at start, by name, with their weights now."""
        return {_name(s): w for s, w in self.scorers}

    def placed_worker(self, session_key: str | None) -> str | None:
        """Where the live session ``session_key`` was last placed (None: not known)."""
        return None if self._placed is None else self._placed(session_key)

    def schedule(self, request: SchedulingRequest, workers: Sequence[Worker]) -> ScheduleResult:
        run = _Run(self._timer)
        candidates = list(workers)
        for f in self.filters:
            candidates = run(f.name, candidates, f.filter, request, candidates)
        if not candidates or (
            self.max_waiting and all(w.waiting > self.max_waiting for w in candidates)
        ):
            return ScheduleResult(
                (), durations=run.durations, failed=tuple(run.failed), shed=bool(candidates)
            )
        no_match: dict[str, float] = {}
        matched = run("prefix_index", no_match, self._matched, request, candidates)
        request = replace(request, matched=matched)  # what every scorer reads
        scores: dict[str, dict[str, float]] = {}
        predicted: dict[str, Prediction] = {}
        cost, model = self.cost, self.predicted
        if cost is not None:
            cost.observe(request)
            totals = {w.address: -cost.cost(request, w, matched.get(w.address, 0))
                      for w in candidates}
        else:
            for scorer, _ in self.scorers:
                scores[scorer.name] = run(scorer.name, {}, _score, scorer, request, candidates)
            totals = {
                w.address: sum(weight * scores[s.name].get(w.address, 0.0)
                               for s, weight in self.scorers)
                for w in candidates
            }
            if model is not None:
                predicted = run("predicted", predicted, model.predict, request, candidates,
                                matched)
        if model is not None and predicted:
            weighted, totals = totals, {a: -p.cost_s for a, p in predicted.items()}
            ordered = tuple(run("picker", sorted(totals), model.order, predicted, weighted,
                                self.picker))
        else:
            ordered = tuple(run("picker", sorted(totals), self.picker.pick, totals))
        preferred = request.pinned
        if preferred not in totals and self._prefer is not None:
            preferred = self._prefer(request.session_key)
        if (preferred not in totals and request.bound_worker is None and not predicted
                and request.parent_session is not None and self._placed is not None):
            parent = self._placed(request.parent_session)
            # Where the prefix is: the parent's worker unless another holds more of it.
            if parent in totals and matched.get(parent, 0.0) >= max(matched.values(),
                                                                    default=0.0):
                preferred = parent
        if preferred in totals:
            ordered = (preferred, *(a for a in ordered if a != preferred))
        run("prefix_index.routed", None, self.index.routed, ordered[0], request.prompt_blocks,
            request.reused)
        for observer in self.observers:
            run(f"{_name(observer)}.picked", None, observer.picked, request, ordered[0])
        if model is not None and predicted:
            worker = next(w for w in candidates if w.address == ordered[0])
            run("predicted.picked", None, model.picked, request, worker,
                predicted.get(ordered[0]))
        return ScheduleResult(
            ordered,
            scores=scores,
            total=totals,
            matched_blocks=matched,
            durations=run.durations,
            failed=tuple(run.failed),
            predicted=predicted,
        )

    def _matched(
        self, request: SchedulingRequest, workers: Sequence[Worker]
    ) -> dict[str, float]:
        """The caller's measurements where it made them, the index's for the rest."""
        known = request.matched or {}
        blocks = request.prompt_blocks
        return {w.address: known[w.address] if w.address in known
                else self.index.matched_blocks(w.address, blocks) for w in workers}


class _Run:
    """Calls one plugin: times it, and on an exception logs it and answers ``fallback``."""

    def __init__(self, timer: Callable[[], float]) -> None:
        self._timer = timer
        self.durations: dict[str, float] = {}
        self.failed: list[str] = []

    def __call__(self, name: str, fallback: T, call: Callable[..., T], *args: Any) -> T:
        start = self._timer()
        try:
            return call(*args)
        except Exception:
            log.exception("scheduling plugin %s failed; contained", name)
            self.failed.append(name)
            return fallback
        finally:
            self.durations[name] = self._timer() - start


def from_config(
    config: Scheduling,
    *,
    index: PrefixIndex,
    rng: random.Random,
    max_sessions: int = 100_000,
    timer: Callable[[], float] = time.perf_counter,
    clock: Callable[[], float] = time.monotonic,
    prefer: Callable[[str | None], str | None] | None = None,
    table: SessionTable | None = None,
    predictor: LatencyPredictor | None = None,
) -> Scheduler:
    """The scheduler ``config`` describes: the subset, healthy and decode-role filters, the
    named scorers (the
    plugin registry's) with their weights (zero-weight ones left out; none in the Dynamo cost
    form), a seeded max-score
    picker. ``clock`` ages the active-sessions scorer's placements (a simulator's virtual
    time); ``prefer`` is admission's ``preferred_worker``; ``table`` the session table the
    active-sessions scorer's slots hang on (one of its own without it); ``predictor`` the
    latency model the SLO scorer reads (neutral without it)."""
    form = config.cost_form
    context = Context(config, index, clock, max_sessions, table, predictor)
    scorers: list[tuple[Scorer, float]] = [] if form == "dynamo" else [
        (SCORERS[name].make(context), weight) for name, weight in config.scorers.items() if weight]
    sessions = next((s for s, _ in scorers if isinstance(s, ActiveSessionsScorer)), None)
    observers: list[PickObserver] = [
        s for s, _ in scorers if isinstance(s, ActiveSessionsScorer | LoraAffinityScorer)]
    predicted = None
    if form == "predicted":
        if sessions is None:  # the live sessions' placements: what the ``evicts`` term reads
            sessions = active_sessions(context)
            observers.append(sessions)
        lora = next((s for s, _ in scorers if isinstance(s, LoraAffinityScorer)), None)
        predicted = PredictedCost(sessions=sessions, clock=clock,
                                  cpu_weight=config.prefix.tier_weights.cpu,
                                  host_guess=isinstance(index, ApproximatePrefixIndex),
                                  adapters=None if lora is None else lora.loaded)
    return Scheduler(
        scorers,
        MaxScorePicker(rng),
        [SubsetFilter(), HealthyFilter(), DecodeFilter()],
        index,
        cost=DynamoCost(config.overlap_weight) if form == "dynamo" else None,
        predicted=predicted,
        observers=observers,
        max_waiting=config.max_waiting_per_worker,
        timer=timer,
        prefer=prefer,
        placed=sessions.worker if sessions is not None else None,
    )


def _score(
    scorer: Scorer, request: SchedulingRequest, workers: Sequence[Worker]
) -> dict[str, float]:
    """The scorer's answer forced into [0, 1]; NaN counts as 0."""
    scores = scorer.score(request, workers)
    return {a: 0.0 if math.isnan(s) else min(max(float(s), 0.0), 1.0) for a, s in scores.items()}


def _name(plugin: object) -> str:
    return str(getattr(plugin, "name", type(plugin).__name__))
