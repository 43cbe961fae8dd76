"""The table of ``saar eval experiment``: each policy judged by their ``summarize``, with both
their costing (single-turn baseline uncached) and a symmetric one (the baseline priced with their
cache estimate too, as every other policy is)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .experiment import Judge, Row


def _numbers(summary: Mapping[str, Any], fair: Mapping[str, Any], side: str) -> dict[str, Any]:
    return {
        "switches": summary[f"{side}_switches"],
        "unsafe": summary[f"{side}_tool_loop_switch_violations"]
        + summary[f"{side}_context_portability_violations"],
        "unsafe_tool_loop": summary[f"{side}_tool_loop_switch_violations"],
        "unsafe_provider_state": summary[f"{side}_context_portability_violations"],
        "cost_usd": summary[f"{side}_cost"],
        "quality": summary[f"{side}_mean_quality"],
        "frontier_turns": summary[f"{side}_frontier_turns"],
        "switch_reduction_pct": 0.0 if side == "baseline" else summary["switch_reduction_pct"],
        "cost_reduction_pct": 0.0 if side == "baseline" else summary["cost_reduction_pct"],
        "symmetric_cost_reduction_pct": 0.0 if side == "baseline" else fair["cost_reduction_pct"],
        "symmetric_baseline_cost_usd": round(fair["baseline_cost"], 6),
    }


def report(
    judge: Judge,
    scenarios: tuple[str, ...],
    theirs: Mapping[str, Mapping[str, list[Row]]],
    ours: Mapping[str, Mapping[str, list[Row]]],
) -> dict[str, Any]:
    """The JSON document: each policy overall and by scenario, by their ``summarize``."""
    summarize = judge.script.summarize

    def judged(by_scenario: Mapping[str, list[Row]], side: str = "agentic") -> dict[str, Any]:
        rows = [row for s in scenarios for row in by_scenario[s]]
        overall = _numbers(summarize(rows), summarize(judge.symmetric(rows)), side)
        overall["by_scenario"] = {
            s: _numbers(summarize(by_scenario[s]), summarize(judge.symmetric(by_scenario[s])),
                        side)
            for s in scenarios
        }
        return overall

    policies = {"theirs/single-turn": judged(theirs["acr-full"], "baseline")}
    policies.update({f"theirs/{p}": judged(rows) for p, rows in theirs.items()})
    policies.update({f"ours/{p}": judged(rows) for p, rows in ours.items()})
    turns = sum(len(rows) for rows in theirs["acr-full"].values())
    return {"turns": turns, "scenarios": list(scenarios), "policies": policies}


def table(summary: Mapping[str, Any]) -> str:
    header = (f"{'policy':<24} {'switches':>8} {'unsafe (tool/prov)':>19} {'cost $':>9} "
              f"{'cost red.':>9} {'symmetric':>9} {'quality':>7}")
    lines = [header, "-" * len(header)]
    for name, p in summary["policies"].items():
        unsafe = f"{p['unsafe']} ({p['unsafe_tool_loop']}/{p['unsafe_provider_state']})"
        lines.append(
            f"{name:<24} {p['switches']:>8} {unsafe:>19} {p['cost_usd']:>9.2f} "
            f"{p['cost_reduction_pct']:>8.2f}% {p['symmetric_cost_reduction_pct']:>8.2f}% "
            f"{p['quality']:>7.4f}"
        )
    base = next(iter(summary["policies"].values()))
    lines.append(
        f"turns per policy: {summary['turns']}; cost red.: their costing (single-turn uncached, "
        f"${base['cost_usd']:.2f}); symmetric: single-turn with their cache estimate too "
        f"(${base['symmetric_baseline_cost_usd']:.2f})"
    )
    return "\n".join(lines)
