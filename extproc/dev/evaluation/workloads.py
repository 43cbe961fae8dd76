"""The six workload mixes and the text their simulated agents type.

A mix only sets proportions of session events; the events themselves (user turns, tool loops,
provider-bound state, idle gaps, task drift) are built by ``client.AgentSession``. User phrases
carry the keywords of ``matrix.yaml``'s decisions, so the live selector classifies them; filler
text (prompts, tool output, answers) is keyword-free. Some tool outputs end with a log line that
does carry a decision's keywords ("deadlock detected"), as real test and build output does: a
per-request router reads it as a new task, which is how tool results end up on another model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    name: str
    topics: tuple[tuple[str, float], ...]
    """(decision name, weight) of a session's starting task."""
    tool: float
    """Chance that an answer is a batch of tool calls (so the next request carries results)."""
    idle: float
    """Chance that a user turn comes after an idle gap longer than the idle timeout."""
    drift: float
    """Chance that a user turn starts a new task with a different topic."""
    followup: float
    """Chance that a user turn is a bare follow-up ("continue") without task keywords."""
    responses: float
    """Share of sessions on the Responses API (the rest use Chat Completions)."""
    state: float
    """Chance that a Responses turn carries provider-bound state."""
    tool_signal: float = 0.15
    """Chance that a tool output ends with a log line carrying a decision's keywords."""


_TOPICS = (("hard_reasoning", 0.3), ("coding", 0.4), ("routine", 0.3))
_FRONTIER_TOPICS = (("hard_reasoning", 0.7), ("coding", 0.2), ("routine", 0.1))

WORKLOADS: tuple[WorkloadMix, ...] = (
    WorkloadMix("balanced", _TOPICS, 0.35, 0.06, 0.08, 0.12, 0.30, 0.7),
    WorkloadMix("tool-heavy", _TOPICS, 0.70, 0.04, 0.05, 0.10, 0.25, 0.7),
    WorkloadMix("frontier-heavy", _FRONTIER_TOPICS, 0.35, 0.06, 0.08, 0.12, 0.30, 0.7),
    WorkloadMix("idle-heavy", _TOPICS, 0.30, 0.35, 0.08, 0.12, 0.30, 0.7),
    WorkloadMix("provider-state-heavy", _TOPICS, 0.40, 0.05, 0.08, 0.12, 0.80, 0.95),
    WorkloadMix("drift-heavy", _TOPICS, 0.30, 0.06, 0.35, 0.12, 0.30, 0.7),
)
WORKLOAD_NAMES: tuple[str, ...] = tuple(w.name for w in WORKLOADS)

PHRASES: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {
        "hard_reasoning": (
            "Find the root cause of the intermittent deadlock in the job scheduler.",
            "There is a race condition between the cache writer and the reader; trace it.",
            "Prove that the retry loop terminates under every backoff setting.",
            "Architect a sharded queue that survives a zone outage without losing jobs.",
            "Write a formal spec of the lease protocol and check the invariants.",
        ),
        "coding": (
            "Implement cursor pagination for the orders endpoint.",
            "Refactor the config loader into smaller functions.",
            "Add a unit test for the parser edge cases we found.",
            "Migrate the settings module to the new validation library.",
            "Fix the failing import in the command line entry point.",
        ),
        "routine": (
            "Summarize what changed in the last commit.",
            "List the files under src and their sizes.",
            "Rename the variable tmp to buffer in the handler.",
            "Show me the README section about installation.",
            "What does the helper in utils return for an empty list?",
        ),
    }
)

TOOL_SIGNALS: tuple[str, ...] = (
    "FAILED tests/test_pool.py::test_drain - deadlock detected after 30s",
    "WARNING: possible race condition on cache key session:42",
    "TODO(ops): implement backoff for this endpoint",
    "hint: fix the import order in cli.py",
)
"""Log lines with decision keywords, as real tool output carries them."""

FOLLOWUPS: tuple[str, ...] = (
    "continue",
    "ok, go ahead",
    "yes, apply that",
    "looks good, keep going",
    "run it again please",
)

_VOCABULARY = (
    "def return self value index buffer request response items for in if else None True False "
    "import from class path count total result data node list map key await async yield with "
    "open read write line error raise try except log lines offset limit cursor batch queue "
    "worker task state token chunk frame header body status retry timeout session cache store "
    "record field schema table row column query filter sort merge split join parse dump load"
)

CORPUS: str = " ".join(random.Random(7).choices(_VOCABULARY.split(), k=80_000))
"""Keyword-free code-like text; a message of ``n`` tokens is a ``4 n``-character slice."""


def tool_output(rng: random.Random, tokens: int, signal: float) -> str:
    text = filler(rng, tokens)
    return f"{text}\n{rng.choice(TOOL_SIGNALS)}" if rng.random() < signal else text


def filler(rng: random.Random, tokens: int) -> str:
    size = 4 * tokens
    start = rng.randrange(0, len(CORPUS) - size)
    return CORPUS[start : start + size]


def pick_topic(rng: random.Random, topics: tuple[tuple[str, float], ...]) -> str:
    names, weights = zip(*topics, strict=True)
    return rng.choices(names, weights)[0]


def workload(name: str) -> WorkloadMix:
    for mix in WORKLOADS:
        if mix.name == name:
            return mix
    raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOAD_NAMES)}")
