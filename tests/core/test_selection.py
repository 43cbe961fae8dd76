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
