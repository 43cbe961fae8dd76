"""The matrix's policies, each expressed as SAAR knobs on the one config the live server loads.

Every policy runs through ``extproc.router.Router`` unchanged; only ``session_aware`` differs:

* ``single_turn`` turns every memory effect off (no locks, no stay bias, no pricing, no margin,
  a reset on every decision change) and hands the engine a ``PerTurnSelector``: the same
  ``HybridSelector``, never told the session's decision, so each turn gets the choice a stateless
  per-request router would make. Knobs alone cannot express this once the selector inherits the
  session's decision for turns no rule matches.
* ``sticky`` makes leaving impossible (no resets, an unbeatable stay bias), so a session keeps the
  model its first turn got.
* ``saar`` is the config as shipped; each ablation flips exactly one SAAR flag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...assembly import Parts, assemble
from ...config import Config, SessionAware, load_config
from ...core.selection import BaseChoice, HybridSelector
from ...types import Clock, RequestSummary

CONFIG_PATH = Path(__file__).with_name("matrix.yaml")

NEVER = 10**9
"""A stay bias and a turn count no candidate score can overcome."""

POLICY_KNOBS: dict[str, dict[str, Any]] = {
    "single_turn": {
        "tool_loop_hard_lock": False,
        "context_portability_hard_lock": False,
        "decision_drift_reset": True,
        "switch_pricing": False,
        "min_turns_before_switch": 0,
        "switch_margin": 0.0,
        "stay_bias": 0.0,
        "tool_loop_stay_bias": 0.0,
        "handoff_penalty_weight": 0.0,
        "switch_history_weight": 0.0,
    },
    "sticky": {
        "idle_reset": False,
        "decision_drift_reset": False,
        "min_turns_before_switch": NEVER,
        "stay_bias": float(NEVER),
        "tool_loop_stay_bias": float(NEVER),
    },
    "saar": {},
    "no_tool_lock": {"tool_loop_hard_lock": False},
    "no_provider_lock": {"context_portability_hard_lock": False},
    "no_drift_reset": {"decision_drift_reset": False},
    "no_idle_reset": {"idle_reset": False},
    "no_switch_pricing": {"switch_pricing": False},
    "no_step_down_pricing": {"step_down_pricing": False},
}

POLICIES: tuple[str, ...] = tuple(POLICY_KNOBS)
BASELINE = "single_turn"


def matrix_config() -> Config:
    return load_config(CONFIG_PATH)


def policy_config(config: Config, policy: str) -> Config:
    """``config`` with the policy's knobs applied to every decision's ``session_aware`` block."""
    knobs = POLICY_KNOBS[policy]

    def tuned(aware: SessionAware) -> SessionAware:
        return replace(aware, **knobs)

    decisions = tuple(
        replace(d, algorithm=replace(d.algorithm, session_aware=tuned(d.algorithm.session_aware)))
        for d in config.routing.decisions
    )
    return replace(config, routing=replace(config.routing, decisions=decisions))


class PerTurnSelector:
    """The live ``HybridSelector`` with the session's decision withheld."""

    def __init__(self, inner: HybridSelector) -> None:
        self._inner = inner

    def select(
        self, request: RequestSummary, headers: Mapping[str, str], default: str | None = None
    ) -> BaseChoice:
        return self._inner.select(request, headers)


def build(config: Config, policy: str, clock: Clock) -> Parts:
    """The live router's parts for ``policy``; only ``single_turn`` swaps in a stateless
    selector."""
    tuned = policy_config(config, policy)
    selector = PerTurnSelector(HybridSelector(tuned)) if policy == BASELINE else None
    return assemble(tuned, clock=clock, selector=selector)
