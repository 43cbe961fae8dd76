"""Turns raw tallies into the matrix's numbers, relative to the ``single_turn`` baseline.

* ``switch_reduction`` = 1 - switches / baseline switches.
* ``cost_reduction`` = 1 - cost / baseline cost, with the same cache-aware price for every policy.
* ``quality_delta`` = mean per-turn shortfall - the baseline's, where a turn's shortfall is
  min(0, served model quality - difficulty of the decision the user's task needs). The baseline
  is 0 by definition; negative means the policy served more turns below what they needed.
"""

from __future__ import annotations

from typing import Any

from .policies import BASELINE
from .runner import Tally


def _ratio(value: float, baseline: float) -> float:
    return 1.0 - value / baseline if baseline else 0.0


def summarize(tallies: dict[str, Tally]) -> dict[str, Any]:
    """The JSON document of the matrix (the last stdout line of ``saar eval matrix --json``)."""
    base = tallies[BASELINE]
    base_quality = base.shortfall / base.turns if base.turns else 0.0
    policies = {}
    for name, t in tallies.items():
        policies[name] = {
            "switches": t.switches,
            "unsafe_switches": sum(t.unsafe.values()),
            "unsafe_tool_loop": t.unsafe["tool_loop"],
            "unsafe_provider_state": t.unsafe["provider_state"],
            "switch_reduction": round(_ratio(t.switches, base.switches), 4),
            "cost_reduction": round(_ratio(t.cost_usd, base.cost_usd), 4),
            "quality_delta": round(t.shortfall / t.turns - base_quality, 4) if t.turns else 0.0,
            "cost_usd": round(t.cost_usd, 4),
        }
    return {"turns": base.turns, "policies": policies}


def table(summary: dict[str, Any]) -> str:
    header = (
        f"{'policy':<18} {'switches':>8} {'unsafe (tool/prov)':>20} {'switch red.':>11} "
        f"{'cost red.':>9} {'quality Δ':>9} {'cost $':>9}"
    )
    lines = [header, "-" * len(header)]
    for name, p in summary["policies"].items():
        unsafe = f"{p['unsafe_switches']} ({p['unsafe_tool_loop']}/{p['unsafe_provider_state']})"
        lines.append(
            f"{name:<18} {p['switches']:>8} {unsafe:>20} {p['switch_reduction']:>11.2%} "
            f"{p['cost_reduction']:>9.2%} {p['quality_delta']:>+9.4f} {p['cost_usd']:>9.2f}"
        )
    lines.append(f"turns per policy: {summary['turns']}")
    return "\n".join(lines)
