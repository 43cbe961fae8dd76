"""Base selection: which decision a turn matches, as a table of texts and shapes."""

from __future__ import annotations

import pytest

from extproc.core.selection import HybridSelector
from extproc.types import Api, RequestSummary


def turn(text: str, tokens: int = 100) -> RequestSummary:
    return RequestSummary(Api.CHAT, "auto", False, 2, tokens, latest_text=text)


@pytest.mark.parametrize(
    ("text", "tokens", "decision", "topical"),
    [
        ("Please refactor the parser", 100, "hard_engineering", True),
        ("REFACTOR it", 100, "hard_engineering", True),
        ("find the root cause of the crash", 100, "hard_engineering", True),
        ("summarize the diff", 100, "light_tasks", True),
        # Issue 9 item 17: keywords are words, not substrings.
        ("the designated token was refactored", 100, None, False),  # design/refactor inside
        ("explained.", 100, None, False),  # "explain" is not "explained"
        ("explain.", 100, "light_tasks", True),  # punctuation bounds a word
        ("continue", 100, None, False),
        ("continue", 30_000, "long_context", False),  # a shape, not a topic
    ],
)
def test_which_decision_a_turn_matches(session_config, text, tokens, decision, topical):
    selector = HybridSelector(session_config)
    matched = selector.match(turn(text, tokens), {})
    assert (matched.name if matched else None) == decision
    choice = selector.select(turn(text, tokens), {}, default="agentic_routing")
    assert choice.topical is topical
    assert choice.decision == (decision or "agentic_routing")


@pytest.mark.parametrize(
    ("tokens", "counted", "outcome"),
    [
        (131_072, True, "served"),  # fits the window exactly
        (131_073, True, "refused"),  # the model's own count: refused before any engine sees it
        (131_073, False, "served"),  # an estimate: the engine says better than a guess
    ],
)
def test_a_counted_context_over_every_window_is_refused(session_config, tokens, counted,
                                                        outcome):
    from dataclasses import replace

    from extproc.errors import ContextTooLong

    request = replace(turn("continue", tokens), context_counted=counted)
    selector = HybridSelector(session_config)
    try:
        choice = selector.select(request, {}, default="agentic_routing")
    except ContextTooLong as refused:
        assert outcome == "refused" and "131072" in str(refused)
    else:
        assert outcome == "served" and choice.model in session_config.models
