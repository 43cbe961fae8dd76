"""A stand-in for vLLM Semantic Router's ``bench/agentic_routing_experiment.py``, written for the
tests (none of their code): the names ``saar eval experiment`` uses, three scripted sessions
whose answers are worked out by hand in ``test_experiment.py``, a toy cache model (half the
prompt cached, none on a switched turn) and a summary of the columns the driver reads.

Their conventions the driver relies on are kept: a turn's prompt is 800 + ``history_tokens``
tokens, the baseline is priced uncached, every session starts "on" the first model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Profile:
    name: str
    quality: float
    prompt_per_1m: float
    completion_per_1m: float
    cached_per_1m: float


@dataclass(frozen=True)
class Scenario:
    name: str
    remaining_turn_prior: float


MODELS = (
    Profile("qwen3-8b", 0.64, 0.05, 0.10, 0.01),
    Profile("qwen3-32b", 0.78, 0.30, 0.60, 0.06),
    Profile("frontier-reasoner", 0.94, 8.00, 24.00, 1.20),
)
SMALL, MID, FRONTIER = (m.name for m in MODELS)
SCENARIOS = {"long": Scenario("long", 0.0), "short": Scenario("short", 4.0)}
"""``long`` has no remaining-turn prior; ``short`` expects sessions to end after turn 4."""
DEFAULT_SCENARIOS = ("long", "short")
COMPLETION = 200

# (base model, phase, idle) per turn; history grows by 300 tokens a turn from 1,000.
SESSIONS = (
    [(SMALL, "user_turn", False), (FRONTIER, "user_turn", False), (SMALL, "tool_loop", False),
     (MID, "provider_state", False), (MID, "user_turn", False)],
    [(MID, "user_turn", False), (SMALL, "user_turn", True), (MID, "user_turn", False),
     (FRONTIER, "user_turn", False), (MID, "user_turn", False)],
    [(FRONTIER, "user_turn", False), (SMALL, "topic_drift", False), (SMALL, "user_turn", False),
     (SMALL, "user_turn", False), (SMALL, "user_turn", False)],
)


def profile(name: str) -> Profile:
    return next(m for m in MODELS if m.name == name)


def cached_ratio_for(model: Profile, phase: str, history_tokens: int, switched: bool) -> float:
    return 0.0 if switched else 0.5


def turn_cost(model: Profile, prompt_tokens: int, cached_ratio: float, completion: int) -> float:
    cached = int(prompt_tokens * cached_ratio)
    return ((prompt_tokens - cached) * model.prompt_per_1m + cached * model.cached_per_1m
            + completion * model.completion_per_1m) / 1_000_000


def simulate_workload(
    session_count: int, turn_count: int, seed: int, scenario: Scenario = SCENARIOS["long"],
    agentic_policy: str = "acr-full",
) -> list[dict[str, Any]]:
    """The scripted sessions; the stand-in's own policy keeps a session's first model."""
    rows = []
    for index, turns in enumerate(SESSIONS[:session_count]):
        baseline = agentic = SMALL
        for turn, (base, phase, idle) in enumerate(turns[:turn_count]):
            history = 1_000 + 300 * turn
            served = base if turn == 0 else agentic
            baseline_switch, agentic_switch = base != baseline, served != agentic
            ratio = cached_ratio_for(profile(served), phase, history, agentic_switch)
            rows.append({
                "scenario": scenario.name, "seed": seed, "session_id": f"sess-{index:03d}",
                "turn": turn, "phase": phase, "idle_expired": idle, "demand": 0.5,
                "history_tokens": history, "baseline_model": base, "agentic_model": served,
                "baseline_switch": baseline_switch, "agentic_switch": agentic_switch,
                "tool_loop_switch_violation_baseline": phase == "tool_loop" and baseline_switch,
                "tool_loop_switch_violation_agentic": phase == "tool_loop" and agentic_switch,
                "context_portability_violation_baseline": phase == "provider_state"
                and baseline_switch,
                "context_portability_violation_agentic": phase == "provider_state"
                and agentic_switch,
                "agentic_drift_switch": phase == "topic_drift" and agentic_switch,
                "cached_prompt_ratio": ratio,
                "baseline_quality": profile(base).quality,
                "agentic_quality": profile(served).quality,
                "baseline_cost": round(turn_cost(profile(base), 800 + history, 0.0, COMPLETION), 8),
                "agentic_cost": round(turn_cost(profile(served), 800 + history, ratio, COMPLETION),
                                      8),
                "policy_reason": agentic_policy,
                "remaining_turns_estimate": "", "continuation_mass": "", "prior_mass": "",
            })
            baseline, agentic = base, served
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"turns": len(rows)}
    for side in ("baseline", "agentic"):
        out[f"{side}_switches"] = sum(bool(r[f"{side}_switch"]) for r in rows)
        out[f"{side}_tool_loop_switch_violations"] = sum(
            bool(r[f"tool_loop_switch_violation_{side}"]) for r in rows)
        out[f"{side}_context_portability_violations"] = sum(
            bool(r[f"context_portability_violation_{side}"]) for r in rows)
        out[f"{side}_cost"] = sum(float(r[f"{side}_cost"]) for r in rows)
        out[f"{side}_mean_quality"] = round(
            sum(float(r[f"{side}_quality"]) for r in rows) / len(rows), 4)
        out[f"{side}_frontier_turns"] = sum(r[f"{side}_model"] == FRONTIER for r in rows)
    out["cost_reduction_pct"] = round(
        (out["baseline_cost"] - out["agentic_cost"]) / out["baseline_cost"] * 100, 2)
    out["switch_reduction_pct"] = round(
        (out["baseline_switches"] - out["agentic_switches"]) / out["baseline_switches"] * 100, 2)
    return out
