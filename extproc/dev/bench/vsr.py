"""``saar bench vsr``: the Semantic Router's own live benchmark
(``bench/agentic_routing_live_benchmark.py`` in vllm-project/semantic-router, Apache-2.0; the
user gives its path, it is not part of this project)
run through our Envoy + ``saar serve`` against simulated workers, and the same schedule sent
directly to one worker (``--baseline-base-url``) for its router-overhead figure, in one run;
``--variants saar,passthrough`` runs it through a pass-through processor too (the floor).

Their script reads its diagnostics from ``x-vsr-*`` response headers. Only those names are mapped:
the module is imported and its ``response_record`` wrapped so that each of our headers is also
seen under their name; their file is not edited.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from ...adapter.contract import DIAGNOSTIC_HEADERS, REPLAY_HEADER
from .. import EXAMPLE_CONFIG
from ..harness import run_stack
from .passthrough import command

_OURS = {key: name for name, key in DIAGNOSTIC_HEADERS.items()}
HEADER_MAP = {
    "x-vsr-selected-model": _OURS["selected_model"],
    "x-vsr-selected-decision": _OURS["decision"],
    "x-vsr-session-phase": _OURS["session_phase"],
    "x-vsr-selected-confidence": _OURS["confidence"],
    "x-vsr-replay-id": REPLAY_HEADER,
    "x-vsr-context-token-count": _OURS["context_tokens"],
    "x-vsr-matched-conversation": None,
}
"""Their header → ours (``adapter/contract.py``); None: we have no such diagnostic."""
SCENARIOS = {"balanced": (32, 64), "stateful-heavy": (16, 48), "tool-heavy": (16, 48)}
"""Scenario → (sessions, turns), as issue 15 measures them."""
TARGETS_MS = {"balanced": 4.5, "stateful-heavy": 5.0, "tool-heavy": 5.0}
"""p95 router overhead targets."""
VARIANTS = ("saar", "passthrough")
"""``saar`` serve as configured; ``passthrough``: a processor that answers every phase with an
empty CONTINUE (``bench.passthrough``), in the same Envoy — the floor any Python processor
pays, measured in the same run."""


def load_script(path: str | Path) -> ModuleType:
    """Import their script as a module and map its header names to ours."""
    spec = importlib.util.spec_from_file_location("vsr_live_benchmark", Path(path))
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    original = module.response_record

    def mapped(status: int, headers: dict[str, str], payload: str, started: float) -> Any:
        record = original(status, headers, payload, started)
        seen = record.get("headers") or {}
        for theirs, ours in HEADER_MAP.items():
            if ours is not None and ours in seen:
                seen[theirs] = seen[ours]
        return record

    module.response_record = mapped  # type: ignore[attr-defined]
    return module


def run_scenario(module: ModuleType, argv: Sequence[str]) -> int:
    """Their ``main`` with ``argv``; returns its exit code."""
    saved = sys.argv
    sys.argv = ["agentic_routing_live_benchmark.py", *argv]
    try:
        return int(module.main() or 0)
    finally:
        sys.argv = saved


def main(script: str, config_path: str | None, scenarios: Sequence[str], output: str,
         variants: Sequence[str] = ("saar",)) -> int:
    """Each variant's stack in turn, every scenario through it; their reports go to
    ``output/<variant>/<scenario>``."""
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {list(VARIANTS)}")
    module = load_script(script)
    config = yaml.safe_load(Path(config_path or EXAMPLE_CONFIG).read_text())
    results: dict[str, Any] = {}
    for variant in variants:
        out = Path(output) / variant
        found = results[variant] = {}
        with run_stack(config, workers_per_model=1, sim_args=["--time-scale", "0"],
                       processor=command(variant)) as stack:
            model, urls = next(iter(stack.sims.items()))
            # The floor sends the schedule to the default route's model: nothing picks one.
            asked = "auto" if variant == "saar" else model
            for scenario in scenarios:
                sessions, turns = SCENARIOS[scenario]
                argv = ["--base-url", stack.url.rstrip("/") + "/v1", "--model", asked,
                        "--include-previous-response-id", "--concurrency", "4",
                        "--scenario", scenario, "--sessions", str(sessions),
                        "--turns", str(turns), "--baseline-base-url",
                        urls[0].rstrip("/") + "/v1", "--baseline-model", model,
                        "--output-dir", str(out / scenario)]
                before = stack.continuity()
                code = run_scenario(module, argv)
                found[scenario] = {"exit": code, **verdict(scenario, out / scenario),
                                   **_since(before, stack.continuity())}
    print(json.dumps(results, indent=2))
    return 0


def verdict(scenario: str, folder: Path) -> dict[str, Any]:
    """What their reports say against issue 15's line: the p95 router overhead, the success
    of both runs and their script's violation counts."""
    comparison = json.loads((folder / "comparison.json").read_text())
    router = json.loads((folder / "summary.json").read_text())
    direct = json.loads((folder / "baseline" / "summary.json").read_text())
    overhead = comparison["router_overhead_ms"]["p95"]
    return {"p95_overhead_ms": overhead, "target_p95_ms": TARGETS_MS[scenario],
            "met": overhead <= TARGETS_MS[scenario] and router["success_rate"] == 1.0
            and not any(comparison["router_violations"].values()),
            "router_p95_ms": router["latency_ms"]["p95"],
            "direct_p95_ms": direct["latency_ms"]["p95"],
            "success": {"router": router["success_rate"], "direct": direct["success_rate"]},
            "their_violations": comparison["router_violations"]}


def _since(before: dict[str, Counter[str]], after: dict[str, Counter[str]]) -> dict[str, Any]:
    """The simulators' own judgement of the scenario (both runs): chained ids they issued
    (``continued``) and ids they never issued (``violations``; their script invents its
    tool-call ids, so ``tool_call`` counts those, routed or direct)."""
    return {f"simulators_{key}": {kind: after[key][kind] - before[key][kind]
                                  for kind in after[key]} for key in after}
