"""The oracle's counting and the backend's cache model, on hand-built turns."""

from __future__ import annotations

import pytest

from extproc.core.selection import HybridSelector
from extproc.dev.evaluation.backend import CACHE_TTL_SECONDS, Backend, Reply
from extproc.dev.evaluation.oracle import Carried, Oracle, Unsafe
from extproc.dev.evaluation.policies import matrix_config
from extproc.dev.evaluation.workloads import CORPUS, FOLLOWUPS, PHRASES
from extproc.observability.sessions import turn_cost
from extproc.types import Api, RequestSummary, Usage


def test_tool_result_served_by_another_model_is_unsafe() -> None:
    oracle = Oracle()
    call = oracle.mint("call", "frontier-xl", "s", 0, 0)
    assert oracle.judge("s", "frontier-xl", Carried()).switched is False
    verdict = oracle.judge("s", "small-8b", Carried(tool_results=(call,)))
    assert verdict.switched is True
    assert verdict.unsafe is Unsafe.TOOL_LOOP


def test_tool_result_served_by_its_issuer_is_safe() -> None:
    oracle = Oracle()
    call = oracle.mint("call", "mid-70b", "s", 0, 0)
    oracle.judge("s", "mid-70b", Carried())
    verdict = oracle.judge("s", "mid-70b", Carried(tool_results=(call,)))
    assert verdict.switched is False
    assert verdict.unsafe is None


def test_foreign_provider_state_is_unsafe_and_a_double_violation_counts_once() -> None:
    oracle = Oracle()
    response = oracle.mint("resp", "mid-70b", "s", 0)
    call = oracle.mint("call", "mid-70b", "s", 0, 0)
    oracle.judge("s", "mid-70b", Carried())
    state_only = oracle.judge("s", "small-8b", Carried(provider_state=(response,)))
    assert state_only.unsafe is Unsafe.PROVIDER_STATE
    both = oracle.judge("s", "frontier-xl", Carried((call,), (response,)))
    assert both.unsafe is Unsafe.TOOL_LOOP


def test_minted_ids_do_not_name_the_model() -> None:
    minted = Oracle().mint("call", "frontier-xl", "s", 3, 1)
    assert "frontier" not in minted
    assert minted.startswith("call_")


def test_prefix_cache_is_per_model_and_expires() -> None:
    models = matrix_config().models
    backend = Backend(models, Oracle())

    def reply(turn: int, prompt: int) -> Reply:
        return Reply("s", turn, prompt, 100, (), responses_api=False, reasoning=False)

    assert backend.serve("small-8b", reply(0, 1000), 0.0).summary.usage.cached_tokens == 0
    warm = backend.serve("small-8b", reply(1, 1500), 10.0)
    assert warm.summary.usage.cached_tokens == 1000
    assert warm.cost_usd == pytest.approx(turn_cost(models["small-8b"], warm.summary.usage))
    assert backend.serve("mid-70b", reply(2, 1700), 20.0).summary.usage.cached_tokens == 0
    assert backend.serve("small-8b", reply(3, 1900), 30.0).summary.usage.cached_tokens == 1500
    late = backend.serve("small-8b", reply(4, 2000), 31.0 + CACHE_TTL_SECONDS)
    assert late.summary.usage.cached_tokens == 0


def test_cost_prices_cached_tokens_at_the_cached_rate() -> None:
    model = matrix_config().models["frontier-xl"]
    cost = turn_cost(model, Usage(prompt_tokens=1_000_000, completion_tokens=0, cached_tokens=0))
    cached = turn_cost(model, Usage(1_000_000, 0, 1_000_000))
    assert cost == pytest.approx(3.00)
    assert cached == pytest.approx(0.30)


def test_user_phrases_steer_the_live_selector_and_filler_does_not() -> None:
    config = matrix_config()
    selector = HybridSelector(config)
    for topic, phrases in PHRASES.items():
        for phrase in phrases:
            request = RequestSummary(Api.CHAT, "auto", False, 2, 9_000, latest_text=phrase)
            assert selector.select(request, {}).decision == topic, phrase
    keywords = [k for d in config.routing.decisions for k in d.rules.keywords]
    for text in (CORPUS.lower(), *FOLLOWUPS):
        assert not [k for k in keywords if k in text]
