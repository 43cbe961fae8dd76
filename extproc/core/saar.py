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
and ``prior`` ∈ (0, 1] the remaining-turn prior
(a session that ran ``t`` turns is expected to run about as many more, up to the horizon). The
price becomes a score penalty relative to a reference turn (``reference_context_tokens`` at the
dearest candidate's prompt price):

    penalty(c) = prefix_cache_weight × min(max_cache_cost_multiplier, transition(c) / reference)

A long warm session on an expensive model therefore faces a high bar to leave, and a short retry
on a cheap model a low one. Switch history, a handoff penalty and a margin are added on top.
The engine is pure: the session's record and the owners of the request's ids come in as facts,
health is injected, time comes from the injected clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..config import Config, SessionAware
from ..errors import ContextTooLong, LockedModelDown, ModelUnavailable, UnknownModel, shown
from ..state.records import Owner, SessionRecord
from ..types import Action, Clock, Phase, RequestSummary, SessionIdentity
from .health import ModelHealth
from .selection import BaseChoice, HybridSelector, Selector, hybrid_scores

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
            return RoutingDecision(
                model, base.decision, Action.NEW, Phase.NEW,
                "new_session" if identity.key else "no_session", base.confidence, base,
            )
        reset = self._reset(state, base, knobs)
        if reset is not None:
            model = self._first_available(base, base.model)
            action = Action.KEEP if model == state.model else Action.SWITCH
            phase = Phase.IDLE_RESET if reset == "idle" else Phase.DRIFT_RESET
            return RoutingDecision(
                model, base.decision, action, phase, f"{reset}_reset", base.confidence, base,
                state.model, reset=reset,
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
        wants_switch = best.model != state.model and (
            best.adjusted > current.adjusted + knobs.switch_margin
        )
        if wants_switch and state.turns >= knobs.min_turns_before_switch:
            return RoutingDecision(
                best.model, base.decision, Action.SWITCH, Phase.NORMAL, "switch_priced",
                confidence, base, prev, candidates=terms,
            )
        reason = "min_turns" if wants_switch else "stay_priced"
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
    ) -> tuple[CandidateTerms, ...]:
        models = self._config.models
        scores = dict(base.scores)
        if state.model not in scores and state.model in models:
            names = [*scores, state.model]
            scores = hybrid_scores({n: models[n] for n in names}, base.difficulty)
        cur = models[state.model]
        reference = REFERENCE_CONTEXT_TOKENS * max(models[n].pricing.prompt for n in scores)
        prior = knobs.remaining_turn_prior_weight * min(
            1.0, max(1, state.turns) / max(1, knobs.remaining_turn_prior_horizon)
        )
        ctx = request.context_tokens
        warm = cached_tokens(state.model)
        if warm is None:
            warm = state.context_tokens
            ratio = state.reported_cache_ratio
            if ratio is not None and state.turns >= 2:
                warm = int(warm * ratio)
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
            out.append(
                CandidateTerms(
                    name, base_score, handoff=handoff, history=history, cache_penalty=penalty,
                    transition_usd=transition / TOKENS_PER_PRICE_UNIT, available=available,
                )
            )
        return tuple(out)

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
