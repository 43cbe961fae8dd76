"""Base selection: the per-request choice that SAAR wraps.

Signals from the request pick the highest-priority matching decision; its candidate models are
then ranked by the ``hybrid`` method, which trades quality fit for the decision's difficulty
against price. A turn that matches no rule carries no evidence of a new task, so it inherits the
session's decision (``default``) instead of falling to the catch-all one: a bare "continue" is not
drift. A match on content (keywords, regex) is ``topical``: only that says the task changed; a
match on size, tools, API or headers says the request changed shape. The selector is one object
with one method so a classifier can replace it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ..config import Config, Decision, Model, Rules
from ..errors import ContextTooLong
from ..types import RequestSummary

PRICE_WEIGHT = 0.35
"""How much a candidate's relative price costs in score units (quality fit is in [0, 1])."""

UNDERQUALIFIED_PENALTY = 2.0
OVERQUALIFIED_PENALTY = 0.25


@dataclass(frozen=True, slots=True)
class BaseChoice:
    decision: str
    model: str
    scores: dict[str, float]
    difficulty: float
    confidence: float
    matched: bool = True
    """False when no rule matched and the default decision was used."""
    topical: bool = False
    """True when the decision matched on content (keywords or regex)."""


class Selector(Protocol):
    def select(
        self, request: RequestSummary, headers: Mapping[str, str], default: str | None = None
    ) -> BaseChoice:
        """Rank the candidates of the decision this request matches (``default`` if none does)."""
        ...


@dataclass(frozen=True, slots=True)
class _CompiledDecision:
    decision: Decision
    keywords: tuple[str, ...]
    """Lower-cased; any of them as a whole word or phrase: "ok" never matches "token"."""
    patterns: tuple[re.Pattern[str], ...]
    has_rules: bool


class HybridSelector:
    """Rule signals → decision → hybrid (quality fit vs price) candidate scores."""

    def __init__(self, config: Config) -> None:
        self._models = config.models
        ordered = sorted(config.routing.decisions, key=lambda d: -d.priority)
        self._decisions = tuple(
            _CompiledDecision(
                d,
                tuple(k.lower() for k in d.rules.keywords),
                tuple(re.compile(p, re.IGNORECASE) for p in d.rules.regex),
                d.rules != Rules(),
            )
            for d in ordered
        )
        self._by_name = {d.name: d for d in ordered}
        # The catch-all: the highest-priority decision without rules, else the lowest one.
        rule_less = [c.decision for c in self._decisions if not c.has_rules]
        self._fallback = rule_less[0] if rule_less else self._decisions[-1].decision

    def select(
        self, request: RequestSummary, headers: Mapping[str, str], default: str | None = None
    ) -> BaseChoice:
        decision = self.match(request, headers)
        matched = decision is not None
        if decision is None:
            decision = self._by_name.get(default or "", self._fallback)
        difficulty = decision.difficulty
        rules = decision.rules
        topical = matched and bool(rules.keywords or rules.regex)
        names = [ref.model for ref in decision.modelRefs]
        # A model whose window the context does not fit is no candidate. If none fits, a
        # context the model's tokenizer counted is refused here; an estimated one goes on (the
        # backends will say so better than an estimate can).
        fits = [n for n in names if self._models[n].context_window >= request.context_tokens]
        if not fits and request.context_counted:
            largest = max(self._models[n].context_window for n in names)
            raise ContextTooLong(
                f"the context ({request.context_tokens} tokens) exceeds the window of every "
                f"model of decision {decision.name!r} (largest {largest}); shorten or compact it")
        names = fits or names
        scores = hybrid_scores({n: self._models[n] for n in names}, difficulty)
        ranked = sorted(scores.values(), reverse=True)
        margin = ranked[0] - ranked[1] if len(ranked) > 1 else 1.0
        best = max(names, key=lambda n: scores[n])
        confidence = min(1.0, 0.5 + margin)
        return BaseChoice(decision.name, best, scores, difficulty, confidence, matched, topical)

    def match(self, request: RequestSummary, headers: Mapping[str, str]) -> Decision | None:
        """The highest-priority decision whose rules the request meets; rule-less ones excluded."""
        text = request.latest_text.lower()
        for compiled in self._decisions:
            if compiled.has_rules and _matches(compiled, request, headers, text):
                return compiled.decision
        return None


def _word_in(text: str, word: str) -> bool:
    """``word`` in ``text`` with no letter, digit or underscore right before or after it (a
    substring search per keyword: a tenth of the cost of one regex with lookarounds)."""
    end = len(text)
    at = text.find(word)
    while at >= 0:
        after = at + len(word)
        if (at == 0 or not _wordy(text[at - 1])) and (after == end or not _wordy(text[after])):
            return True
        at = text.find(word, at + 1)
    return False


def _wordy(char: str) -> bool:
    return char.isalnum() or char == "_"


def _matches(
    compiled: _CompiledDecision, request: RequestSummary, headers: Mapping[str, str], text: str
) -> bool:
    rules = compiled.decision.rules
    if compiled.keywords and not any(_word_in(text, k) for k in compiled.keywords):
        return False
    if compiled.patterns and not any(p.search(request.latest_text) for p in compiled.patterns):
        return False
    if rules.min_context_tokens and request.context_tokens < rules.min_context_tokens:
        return False
    if rules.max_context_tokens and request.context_tokens > rules.max_context_tokens:
        return False
    if rules.tools is not None and bool(request.tools_offered) != rules.tools:
        return False
    if rules.apis and request.api.value not in rules.apis:
        return False
    return all(headers.get(k.lower()) == v for k, v in rules.headers.items())


def fit(quality: float, difficulty: float) -> float:
    """How well a model of ``quality`` fits a task of ``difficulty`` (1: exactly); an
    underqualified model loses most."""
    gap = difficulty - quality
    return 1.0 - (UNDERQUALIFIED_PENALTY * gap if gap > 0 else OVERQUALIFIED_PENALTY * -gap)


def top_price(models: Mapping[str, Model]) -> float:
    """The dearest prompt price among ``models``: what relative prices are relative to."""
    return max(m.pricing.prompt for m in models.values()) or 1.0


def hybrid_scores(models: Mapping[str, Model], difficulty: float) -> dict[str, float]:
    """Quality fit for ``difficulty`` minus relative price; an underqualified model pays most."""
    top = top_price(models)
    return {
        name: fit(model.quality, difficulty) - PRICE_WEIGHT * model.pricing.prompt / top
        for name, model in models.items()
    }


def fit_price(points: float, tokens: int, top: float) -> float:
    """Price units (the pricing's per-million rates × tokens) that ``points`` of fit are worth
    on a prompt of ``tokens``, at the rate the hybrid score trades fit for price: ``PRICE_WEIGHT``
    points of fit for the whole prompt price ``top``."""
    return points * tokens * top / PRICE_WEIGHT
