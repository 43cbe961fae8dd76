"""SAAR: session-aware choice of the physical model behind a logical one.

Order per turn: base selection → router memory → hard locks (tool loop, provider state) → reset
boundaries (idle, decision drift) → switch pricing → pick. Locks are never bought out by price.

Switch pricing is in dollars. Moving a session from its current model ``cur`` to a candidate
``c`` costs, in input tokens:

    transition(c) = ctx × (prompt(c) − cached(c))                 # re-prefill on c, uncached
                  + prior × warm × (prompt(cur) − cached(cur))    # the warm prefix thrown away

where ``ctx`` is the context resent this turn (less what the candidate's best worker already
holds, when the prefix index can tell), ``warm`` the tokens cached on ``cur`` (measured on its
best worker by the prefix index; else our estimate scaled by the backend's reported hit ratio),
and ``prior`` = min(1, R / horizon) the weight of the turns expected to reuse it. ``R``, the
turns expected after this one, is the decision's ``remaining_turn_prior`` less the turns run
(at a drift reset, which opens a new task of that decision, the whole prior); without one, as
many as the session has run (up to the horizon). The price becomes a score
penalty relative to a reference turn (``reference_context_tokens`` at the dearest candidate's
prompt price):

    penalty(c) = prefix_cache_weight × min(max_cache_cost_multiplier, transition(c) / reference)

A long warm session on an expensive model therefore faces a high bar to leave, and a short retry
on a cheap model a low one. Switch history, a handoff penalty and a margin are added on top.

A step-down (to a weaker model) must also pay for itself over what the session is likely to do
next. Hard turns come in runs: a session that just went up for one will soon need the big model
again. So, with ``price(m)`` the per-token price at the session's cache ratio and ``top`` the
dearest candidate's prompt price:

    saving(c) = R × ctx × (price(cur) − price(c))                   # over the remaining turns
    risk(c)   = (1 − (1 − return_rate)^R)                           # a remaining turn needs cur
                × (1 − fit(c, quality(cur))) × ctx × top / PRICE_WEIGHT   # its lost fit, priced

and ``c`` is held (not a move this turn) unless saving > transition + risk. The fit is priced
at the rate the hybrid score trades it for price. A reset boundary lifts the stickiness (stay
bias, handoff, history, margin, minimum turns), not the price: at an idle boundary nothing is
cached any more, so the base choice is taken unless it is a step-down whose saving does not
exceed its risk; at a drift boundary, once the warm prefix is large (``drift_reset_warm_tokens``),
a step-down is held as on any turn, the cache it throws away counted (Claude Code's resumed
run, which carries no provider state to lock it, is not moved off 12.7k warm tokens by a new
keyword).
The engine is pure: the session's record and the owners of the request's ids come in as facts,
health is injected, time comes from the injected clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from ..config import Config, Model, SessionAware
from ..errors import ContextTooLong, LockedModelDown, ModelUnavailable, UnknownModel, shown
from ..state.records import Owner, SessionRecord
from ..types import Action, Clock, Phase, RequestSummary, SessionIdentity
from .health import ModelHealth
from .selection import (
    BaseChoice,
    HybridSelector,
    Selector,
    fit,
    fit_price,
    hybrid_scores,
    top_price,
)

REFERENCE_CONTEXT_TOKENS = 32_768
TOKENS_PER_PRICE_UNIT = 1_000_000

CachedTokens = Callable[[str], int | None]
"""model → tokens of this request's prompt cached on that model's best worker (None: unknown)."""


def _unknown(model: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class CandidateTerms:
    """How one candidate's score was built; kept in the replay record."""

    model: str
    base: float
    stay_bias: float = 0.0
    handoff: float = 0.0
    history: float = 0.0
    cache_penalty: float = 0.0
    transition_usd: float = 0.0
    available: bool = True
    remaining_turns: float = 0.0
    """The turns expected after this one, which a move's saving and risk are counted over."""
    saving_usd: float = 0.0
    """A step-down's saving: the per-turn price difference over the remaining turns."""
    risk_usd: float = 0.0
    """A step-down's quality risk: the chance that a remaining turn needs the current model
    again, times what serving that turn on the weaker one loses in fit."""
    held: bool = False
    """A step-down whose saving does not exceed the cache it throws away and its risk: not a
    move this turn (a failover still takes it)."""

    @property
    def adjusted(self) -> float:
        return self.base + self.stay_bias - self.handoff - self.history - self.cache_penalty


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    model: str
    decision: str
    action: Action
    phase: Phase
    reason: str
    confidence: float
    base: BaseChoice | None
    previous_model: str | None = None
    lock: str | None = None
    reset: str | None = None
    candidates: tuple[CandidateTerms, ...] = ()
    pinned_worker: str | None = None
    """A lock's worker: the one that issued the calls or holds the provider state (its KV
    holds the session), which placement puts first while it is healthy."""


@dataclass(frozen=True, slots=True)
class Lock:
    model: str
    kind: str
    worker: str | None


class SaarEngine:
    def __init__(
        self,
        config: Config,
        health: ModelHealth,
        *,
        clock: Clock,
        selector: Selector | None = None,
    ) -> None:
        self._config = config
        self._health = health
        self._clock = clock
        self._selector = selector or HybridSelector(config)
        self._decisions = {d.name: d for d in config.routing.decisions}
        self._logical = frozenset(config.routing.logical_models)

    def decide(
        self,
        request: RequestSummary,
        identity: SessionIdentity,
        headers: Mapping[str, str],
        state: SessionRecord | None,
        owners: Mapping[str, Owner] | None = None,
        cached_tokens: CachedTokens = _unknown,
    ) -> RoutingDecision:
        """``state`` is the session's record (None: new, or no session); ``owners`` maps the
        ids the request carries to who issued them, as far as the store knows."""
        if request.model not in self._logical:
            return self._direct(request, state)
        base = self._selector.select(request, headers, state.decision if state else None)
        knobs = self._decisions[base.decision].algorithm.session_aware
        lock = self._lock(request, state, owners or {}, knobs)
        if lock is not None:
            phase = Phase.TOOL_LOOP if lock.kind == "tool_loop" else Phase.PROVIDER_STATE
            # The decision that held is the session's, not whatever this turn's text matched.
            held = state.decision if state is not None else base.decision
            decision = RoutingDecision(
                lock.model, held, Action.LOCKED_KEEP, phase, f"{lock.kind}_lock", 1.0, base,
                state.model if state else None, lock=lock.kind, pinned_worker=lock.worker,
            )
            self._require_available(decision)
            return decision
        if state is None:
            model = self._first_available(base, base.model)
            reason = "new_session" if identity.key else "no_session"
            terms: tuple[CandidateTerms, ...] = ()
            if identity.parent_session_id is not None:
                terms = self._inherited_terms(request, base, knobs, model, cached_tokens)
                moved = next((t for t in terms if t.model == model), None)
                if moved is not None and moved.held:
                    model, reason = terms[0].model, "sub_agent_prefix_held"
            return RoutingDecision(
                model, base.decision, Action.NEW, Phase.NEW, reason, base.confidence, base,
                candidates=terms,
            )
        reset = self._reset(state, base, knobs)
        if reset is not None:
            model = self._first_available(base, base.model)
            phase = Phase.IDLE_RESET if reset == "idle" else Phase.DRIFT_RESET
            reason = f"{reset}_reset"
            terms = ()
            if model != state.model:
                terms = self._reset_terms(request, state, base, knobs, model, reset, cached_tokens)
                moved = next((t for t in terms if t.model == model), None)
                if moved is not None and moved.held:
                    model, reason = state.model, f"{reset}_reset_held"
            action = Action.KEEP if model == state.model else Action.SWITCH
            return RoutingDecision(
                model, base.decision, action, phase, reason, base.confidence, base,
                state.model, reset=reset, candidates=terms,
            )
        return self._priced(request, state, base, knobs, cached_tokens)

    # -- steps -----------------------------------------------------------------------------

    def check_model(self, model: str) -> None:
        """``UnknownModel`` unless ``model`` is a logical or a physical model."""
        if model not in self._logical and model not in self._config.models:
            raise UnknownModel(f"The model `{shown(model)}` does not exist.")

    def _direct(self, request: RequestSummary, state: SessionRecord | None) -> RoutingDecision:
        """A physical model name goes to its own cluster; the session is still remembered."""
        self.check_model(request.model)
        action = Action.NEW if state is None else (
            Action.KEEP if state.model == request.model else Action.SWITCH
        )
        return RoutingDecision(
            request.model, "direct", action, Phase.NORMAL, "physical_model", 1.0, None,
            state.model if state else None,
        )

    def _lock(
        self,
        request: RequestSummary,
        state: SessionRecord | None,
        owners: Mapping[str, Owner],
        knobs: SessionAware,
    ) -> Lock | None:
        """Who owns this turn's pending tool results or provider state: the issuer of the ids
        when the store knows it, else the session's current model and worker."""
        if knobs.tool_loop_hard_lock and request.pending_tool_results:
            owner = issuer(owners, request.tool_result_ids, state)
            if owner is not None:
                return Lock(owner.model, "tool_loop", owner.worker)
        if knobs.context_portability_hard_lock and request.has_provider_state:
            previous = (request.previous_response_id,) if request.previous_response_id else ()
            owner = issuer(owners, (*request.provider_state, *previous), state)
            if owner is not None:
                return Lock(owner.model, "provider_state", owner.worker)
        return None

    def _reset(self, state: SessionRecord, base: BaseChoice, knobs: SessionAware) -> str | None:
        idle = self._clock() - state.last_seen
        timeout = knobs.idle_timeout_seconds
        if knobs.idle_reset and timeout > 0 and idle > timeout:
            return "idle"
        if knobs.decision_drift_reset and base.topical and base.decision != state.decision:
            return "drift"
        return None

    def _priced(
        self,
        request: RequestSummary,
        state: SessionRecord,
        base: BaseChoice,
        knobs: SessionAware,
        cached_tokens: CachedTokens,
    ) -> RoutingDecision:
        terms = self._price(request, state, base, knobs, cached_tokens)
        current = next(t for t in terms if t.model == state.model)
        usable = [t for t in terms if t.available]
        windows = {n: self._config.models[n].context_window for n in (t.model for t in terms)}
        if not usable and max(windows.values()) < request.context_tokens:
            raise ContextTooLong(
                f"the context (about {request.context_tokens} tokens) exceeds the window of "
                f"every model of decision {base.decision!r} (largest {max(windows.values())}); "
                "shorten or compact it"
            )
        if not usable:
            raise ModelUnavailable(
                f"no backend of decision {base.decision!r} is available",
                retry_after=self._health.retry_after(state.model),
            )
        best = max(usable, key=lambda t: t.adjusted)
        ranked = sorted((t.adjusted for t in usable), reverse=True)
        margin = ranked[0] - ranked[1] if len(ranked) > 1 else 1.0
        confidence = min(1.0, max(0.0, 0.5 + margin))
        prev = state.model
        if not current.available:
            outgrown = self._config.models[prev].context_window < request.context_tokens
            return RoutingDecision(
                best.model, base.decision, Action.SWITCH, Phase.NORMAL,
                "context_window" if outgrown else "failover", confidence, base, prev,
                candidates=terms,
            )
        move = max((t for t in usable if not t.held), key=lambda t: t.adjusted)
        wants_switch = move.model != state.model and (
            move.adjusted > current.adjusted + knobs.switch_margin
        )
        if wants_switch and state.turns >= knobs.min_turns_before_switch:
            return RoutingDecision(
                move.model, base.decision, Action.SWITCH, Phase.NORMAL, "switch_priced",
                confidence, base, prev, candidates=terms,
            )
        held = best.held and best.adjusted > current.adjusted + knobs.switch_margin
        reason = "min_turns" if wants_switch else "step_down_held" if held else "stay_priced"
        return RoutingDecision(
            state.model, base.decision, Action.KEEP, state.phase if state.phase is Phase.TOOL_LOOP
            else Phase.NORMAL, reason, confidence, base, prev, candidates=terms,
        )

    def _price(
        self,
        request: RequestSummary,
        state: SessionRecord,
        base: BaseChoice,
        knobs: SessionAware,
        cached_tokens: CachedTokens,
        *,
        new_task: bool = False,
    ) -> tuple[CandidateTerms, ...]:
        """Every candidate's terms against the session's current model. ``new_task``: this
        turn opens a new task (a drift reset), whose decision's remaining-turn prior counts
        from here, not from the session's first turn."""
        models = self._config.models
        scores = self._scores(state, base)
        cur = models[state.model]
        top = top_price({n: models[n] for n in scores})
        reference = REFERENCE_CONTEXT_TOKENS * max(models[n].pricing.prompt for n in scores)
        remaining = remaining_turns(knobs, state.turns, new_task=new_task)
        prior = knobs.remaining_turn_prior_weight * min(
            1.0, remaining / knobs.remaining_turn_prior_horizon
        )
        ctx = request.context_tokens
        warm = _warm(state, cached_tokens)
        ratio = min(1.0, warm / ctx) if ctx else 0.0
        history = knobs.switch_history_weight * min(state.switches / 8, 1.0)
        handoff = knobs.handoff_penalty_weight * knobs.default_handoff_penalty
        stay = knobs.tool_loop_stay_bias if state.phase is Phase.TOOL_LOOP else knobs.stay_bias
        out = []
        for name, score in scores.items():
            base_score = knobs.quality_gap_multiplier * score
            fits = models[name].context_window >= ctx
            available = fits and self._health.available(name)
            if name == state.model:
                out.append(CandidateTerms(name, base_score, stay_bias=stay, available=available))
                continue
            cand = models[name]
            uncached = ctx - min(ctx, cached_tokens(name) or 0)
            transition = (
                uncached * (cand.pricing.prompt - cand.pricing.cached_input)
                + prior * warm * (cur.pricing.prompt - cur.pricing.cached_input)
            )
            penalty = 0.0
            if knobs.switch_pricing and reference > 0:
                ratio_cost = min(knobs.max_cache_cost_multiplier, transition / reference)
                penalty = knobs.prefix_cache_weight * ratio_cost
            terms = CandidateTerms(
                name, base_score, handoff=handoff, history=history, cache_penalty=penalty,
                transition_usd=transition / TOKENS_PER_PRICE_UNIT, available=available,
            )
            out.append(_step_down(terms, cur, cand, ctx, ratio, remaining, top, knobs, transition))
        return tuple(out)

    def _reset_terms(
        self,
        request: RequestSummary,
        state: SessionRecord,
        base: BaseChoice,
        knobs: SessionAware,
        model: str,
        reset: str,
        cached_tokens: CachedTokens,
    ) -> tuple[CandidateTerms, ...]:
        """The terms a reset boundary's move to ``model`` is held by (none when the current
        model cannot keep the session). The boundary lifts the stickiness, not the price: after
        a drift, when ``drift_reset_warm_tokens`` or more of this request are still cached, a
        step-down must pay for the cache it throws away as on any turn (a smaller prefix is
        cheap to rebuild: the base choice is taken); after an idle one nothing is cached any
        more, so it pays only its quality risk."""
        models = self._config.models
        kept = models.get(state.model)
        if kept is None or kept.context_window < request.context_tokens or not (
            self._health.available(state.model)
        ):
            return ()
        if reset == "drift":
            # The prefix this request resends; a chain's state held by the provider is the
            # provider-state lock's business, not the prefix cache's.
            warm = min(_warm(state, cached_tokens), request.context_tokens)
            if warm < knobs.drift_reset_warm_tokens:
                return ()
            return self._price(request, state, base, knobs, cached_tokens, new_task=True)
        scores = self._scores(state, base)
        cur, cand = models[state.model], models[model]
        ctx = request.context_tokens
        ratio = state.reported_cache_ratio or 0.0
        stay = CandidateTerms(state.model, knobs.quality_gap_multiplier * scores[state.model])
        terms = CandidateTerms(model, knobs.quality_gap_multiplier * scores[model])
        remaining = remaining_turns(knobs, state.turns)
        top = top_price({n: models[n] for n in scores})
        return stay, _step_down(terms, cur, cand, ctx, ratio, remaining, top, knobs, 0.0)

    def _inherited_terms(
        self,
        request: RequestSummary,
        base: BaseChoice,
        knobs: SessionAware,
        model: str,
        cached_tokens: CachedTokens,
    ) -> tuple[CandidateTerms, ...]:
        """A sub-agent's first request, priced as a move from the model whose workers hold
        most of its prompt (its parent's system prompt and tools, usually) to ``model``, its
        base choice: a step-down there pays for the cache it throws away, as a drift's does
        (``drift_reset_warm_tokens`` or more cached; else the base choice is taken). The warm
        model's own terms come first; none when no other model is warmer."""
        ctx = request.context_tokens
        warm = {name: min(cached_tokens(name) or 0, ctx) for name in base.scores
                if name != model and self._health.available(name)
                and self._config.models[name].context_window >= ctx}
        if not warm:
            return ()
        warmest = max(warm, key=lambda name: warm[name])
        if warm[warmest] < knobs.drift_reset_warm_tokens or warm[warmest] <= (
                cached_tokens(model) or 0):
            return ()
        holder = SessionRecord(warmest, base.decision, Phase.NEW, self._clock(),
                               context_tokens=ctx)
        terms = self._price(request, holder, base, knobs, cached_tokens, new_task=True)
        return tuple(sorted(terms, key=lambda t: t.model != warmest))

    def _scores(self, state: SessionRecord, base: BaseChoice) -> dict[str, float]:
        """The base scores of the decision's candidates and of the session's current model."""
        models = self._config.models
        if state.model in base.scores or state.model not in models:
            return dict(base.scores)
        names = [*base.scores, state.model]
        return hybrid_scores({n: models[n] for n in names}, base.difficulty)

    def _first_available(self, base: BaseChoice, preferred: str) -> str:
        if self._health.available(preferred):
            return preferred
        for name in sorted(base.scores, key=lambda n: -base.scores[n]):
            if self._health.available(name):
                return name
        raise ModelUnavailable(
            f"no backend of decision {base.decision!r} is available",
            retry_after=self._health.retry_after(preferred),
        )

    def _require_available(self, decision: RoutingDecision) -> None:
        """``LockedModelDown`` (carrying the lock's decision, for the replay record) when
        model health has taken the locked model out."""
        model, lock = decision.model, decision.lock or "lock"
        if not self._health.available(model):
            raise LockedModelDown(
                f"this session is locked to {model} by its {lock.replace('_', ' ')} and {model} "
                "has no available backend; retry later (the session resumes on the same model)",
                model=model, decision=decision, retry_after=self._health.retry_after(model),
            )


def remaining_turns(knobs: SessionAware, turns: int, *, new_task: bool = False) -> float:
    """The turns a session that has run ``turns`` is expected to run after this one: the
    decision's ``remaining_turn_prior`` less the turns run, without a prior as many as it has
    run (at least one, at most ``remaining_turn_prior_horizon``).

    ``new_task``: the turn opens a new task (a drift reset into this decision). The prior is the
    length of a task of this decision, so it counts from here: the whole prior remains, however
    long the session ran before. Without a prior the session's age stays the evidence (a long
    session that changes task is still a long session)."""
    if knobs.remaining_turn_prior > 0:
        return knobs.remaining_turn_prior if new_task else max(
            0.0, knobs.remaining_turn_prior - turns)
    return float(min(max(1, turns), knobs.remaining_turn_prior_horizon))


def _warm(state: SessionRecord, cached_tokens: CachedTokens) -> int:
    """Tokens of the session's prefix cached on its current model: measured on its best
    worker, else the last context scaled by the backend's reported hit ratio."""
    warm = cached_tokens(state.model)
    if warm is not None:
        return warm
    ratio = state.reported_cache_ratio
    if ratio is not None and state.turns >= 2:
        return int(state.context_tokens * ratio)
    return state.context_tokens


def _step_down(
    terms: CandidateTerms,
    cur: Model,
    cand: Model,
    tokens: int,
    cached_ratio: float,
    remaining: float,
    top: float,
    knobs: SessionAware,
    thrown: float,
) -> CandidateTerms:
    """``terms`` with a step-down's pricing when ``cand`` is weaker than ``cur`` (price units:
    per-million rates × tokens). It saves the per-turn price difference at the session's cache
    ratio over the ``remaining`` turns, the ones the move is made for (this turn's own saving is
    the margin it must clear: a session expected to end now is not moved down); it risks, with
    the chance that one of them needs ``cur`` again, the fit that turn loses on ``cand``, priced
    at the hybrid score's rate; it throws away ``thrown``. Held unless the saving exceeds both."""
    if not (knobs.switch_pricing and knobs.step_down_pricing) or cand.quality >= cur.quality:
        return terms

    def per_token(model: Model) -> float:
        price = model.pricing
        return (1.0 - cached_ratio) * price.prompt + cached_ratio * price.cached_input

    saving = remaining * tokens * (per_token(cur) - per_token(cand))
    chance = 1.0 - (1.0 - knobs.return_rate) ** remaining
    points = 1.0 - fit(cand.quality, cur.quality)  # a turn that needs cur fits it exactly
    risk = chance * fit_price(points, tokens, top)
    return replace(
        terms, remaining_turns=remaining, saving_usd=saving / TOKENS_PER_PRICE_UNIT,
        risk_usd=risk / TOKENS_PER_PRICE_UNIT, held=saving <= thrown + risk,
    )


def issuer(
    owners: Mapping[str, Owner], ids: Iterable[str], state: SessionRecord | None
) -> Owner | None:
    """Who issued what a request continues — the one rule, for a lock and for a pin: the
    issuer of the newest of ``ids`` whose owner is known, else the session's own model and
    worker (its last answer), else nobody."""
    owner = None
    for key in ids:
        owner = owners.get(key, owner)
    if owner is not None or state is None:
        return owner
    return Owner(state.model, state.worker)
