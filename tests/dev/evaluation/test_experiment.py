"""``saar eval experiment`` on a stand-in of their script: three scripted sessions whose served
models are worked out by hand (see the comments), judged by the stand-in's own summary."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from extproc.apis import parse_request
from extproc.cli import main
from extproc.dev.evaluation.experiment import (
    NEW_TASK,
    Conversation,
    ExperimentError,
    Judge,
    Spec,
    load_script,
    run_experiment,
    sessions,
)
from extproc.types import Api

from . import standin_experiment as standin

STANDIN = Path(standin.__file__)
SMALL, MID, FRONTIER = standin.SMALL, standin.MID, standin.FRONTIER
SPEC = Spec(str(STANDIN), seeds=(7,), sessions=3, turns=5)

# Served per session, in the experiment's routing config (their models; decisions per tier):
# sess-000: light, frontier, tool result (light), chained on the previous response (mid), mid.
#   The frontier turn moves up (no step-down gate on the way up); the tool result and the
#   chained turn are locked to the frontier model. On turn 4 a move down to the mid model saves
#   4 remaining turns × ~4.5 $/M × 3k tokens, more than its transition and its quality risk
#   (1 − 0.7⁴) × 0.44 fit at the hybrid's rate: it moves. With the "short" prior (sessions end
#   after turn 4) no turns remain: the step-down is held.
# sess-001: mid; light after an idle gap: the idle reset's base choice (the small model) saves
#   0.25 $/M a turn but risks 0.3 × 0.28 fit: held; then mid, frontier (the mid model's stay
#   bias and the frontier's re-prefill keep it: no move up), mid.
# sess-002: frontier; a new task of the light tier (drift: its base choice), light, light, light.
OURS = {
    "long": [[SMALL, FRONTIER, FRONTIER, FRONTIER, MID], [MID] * 5, [FRONTIER] + [SMALL] * 4],
    "short": [[SMALL] + [FRONTIER] * 4, [MID] * 5, [FRONTIER] + [SMALL] * 4],
}
SINGLE_TURN = [[SMALL, FRONTIER, SMALL, MID, MID], [MID, SMALL, MID, FRONTIER, MID],
               [FRONTIER] + [SMALL] * 4]
"""Each turn's base model: what a stateless router serves."""


def _switches(served: list[list[str]]) -> int:
    """Their convention: every session starts on their first model."""
    return sum(a != b for s in served for a, b in zip([SMALL, *s], s, strict=False))


def _cost(served: list[list[str]]) -> float:
    """The stand-in's costing of ``served``, worked out here with its own functions."""
    total = 0.0
    for session in served:
        previous = SMALL
        for turn, model in enumerate(session):
            profile = standin.profile(model)
            ratio = standin.cached_ratio_for(profile, "", 0, model != previous)
            total += standin.turn_cost(profile, 1_800 + 300 * turn, ratio, standin.COMPLETION)
            previous = model
    return total


def _quality(served: list[list[str]]) -> float:
    turns = [standin.profile(m).quality for s in served for m in s]
    return round(sum(turns) / len(turns), 4)


@pytest.fixture(scope="module")
def summary() -> dict:
    return run_experiment(SPEC)


def test_our_policy_serves_the_worked_out_models(summary: dict) -> None:
    assert summary["turns"] == 30 and summary["scenarios"] == ["long", "short"]
    for scenario, served in OURS.items():
        ours = summary["policies"]["ours/saar"]["by_scenario"][scenario]
        assert (ours["switches"], ours["unsafe"]) == (_switches(served), 0)
        assert ours["quality"] == _quality(served)
        assert ours["cost_usd"] == pytest.approx(_cost(served))
    both = OURS["long"] + OURS["short"]
    overall = summary["policies"]["ours/saar"]
    assert (overall["switches"], overall["quality"]) == (_switches(both), _quality(both)) == (
        9, 0.7813)


def test_our_single_turn_is_their_baseline(summary: dict) -> None:
    theirs = summary["policies"]["theirs/single-turn"]
    ours = summary["policies"]["ours/single_turn"]
    assert theirs["switches"] == ours["switches"] == 2 * _switches(SINGLE_TURN) == 20
    assert (ours["unsafe_tool_loop"], ours["unsafe_provider_state"]) == (2, 2)
    assert (theirs["unsafe_tool_loop"], theirs["unsafe_provider_state"]) == (2, 2)
    assert ours["quality"] == theirs["quality"]
    # Their costing prices their baseline uncached and every policy with their cache estimate:
    # the same served models then "save"; against the symmetric baseline they save nothing.
    assert theirs["cost_usd"] > ours["cost_usd"] == pytest.approx(2 * _cost(SINGLE_TURN))
    assert ours["cost_reduction_pct"] > 0
    assert ours["symmetric_cost_reduction_pct"] == 0.0
    assert ours["symmetric_baseline_cost_usd"] == pytest.approx(ours["cost_usd"])


def test_their_policy_comes_from_their_rows(summary: dict) -> None:
    theirs = summary["policies"]["theirs/acr-full"]  # the stand-in keeps a session's first model
    assert theirs["switches"] == 2 * 2 and theirs["unsafe"] == 0
    assert set(summary["policies"]) == {
        "theirs/single-turn", "theirs/acr-full", "theirs/acr-no-tool-lock", "ours/single_turn",
        "ours/saar", "ours/no_tool_lock", "ours/no_step_down_pricing",
    }


def test_without_step_down_pricing_sessions_step_down_and_back(summary: dict) -> None:
    # sess-000 moves down on turn 4 whatever the prior; sess-001 takes the idle reset's small
    # model, then goes back up on the next mid turn.
    served = [[SMALL, FRONTIER, FRONTIER, FRONTIER, MID], [MID, SMALL, MID, MID, MID],
              OURS["long"][2]]
    for scenario in ("long", "short"):
        ours = summary["policies"]["ours/no_step_down_pricing"]["by_scenario"][scenario]
        assert (ours["switches"], ours["quality"]) == (_switches(served), _quality(served))
        assert ours["cost_usd"] == pytest.approx(_cost(served))


def test_knobs_reach_every_decision(summary: dict) -> None:
    off = run_experiment(replace(SPEC, policies=("saar",), knobs=(("step_down_pricing", False),)))
    assert off["policies"]["ours/saar"] == summary["policies"]["ours/no_step_down_pricing"]
    with pytest.raises(ExperimentError, match="return_rate"):
        run_experiment(replace(SPEC, knobs=(("return_rate", 2.0),)))
    with pytest.raises(ExperimentError, match="clairvoyance"):
        run_experiment(replace(SPEC, knobs=(("clairvoyance", 1.0),)))


def test_the_harness_sends_real_requests() -> None:
    script = load_script(STANDIN)
    judge = Judge(script)
    rows = next(sessions(script.simulate_workload(1, 5, 7)))
    tiers = dict(zip((SMALL, MID, FRONTIER), ("light", "mid", "frontier"), strict=True))
    talk = Conversation("sess-000", "t", tiers)
    seen = []
    for index, row in enumerate(rows):
        headers, raw = talk.request(row)
        request = parse_request(Api.RESPONSES, raw, max_body_bytes=1 << 24)
        seen.append(request)
        assert headers["x-session-id"] == "sess-000"
        assert headers["x-demand-tier"] == tiers[row["baseline_model"]]
        calls = index + 1 < len(rows) and rows[index + 1]["phase"] == "tool_loop"
        answer = talk.answer(row, FRONTIER, calls, judge.usage(row, FRONTIER, SMALL))
        if row["phase"] != "provider_state":  # a chained turn sends its new items only
            assert request.context_tokens == pytest.approx(800 + row["history_tokens"], rel=0.05)
        if index == 1:
            issued_call, issued_response = answer.tool_call_ids, answer.response_id
        if index == 2:
            issued_response = answer.response_id
    assert seen[2].tool_result_ids == tuple(issued_call) and seen[2].pending_tool_results
    assert seen[3].previous_response_id == issued_response
    assert not seen[4].has_provider_state and not seen[4].pending_tool_results
    first, drift = list(sessions(script.simulate_workload(3, 5, 7)))[2][:2]
    talk = Conversation("sess-002", "t", tiers)
    talk.request(first)
    talk.answer(first, FRONTIER, False, judge.usage(first, FRONTIER, SMALL))
    request = parse_request(Api.RESPONSES, talk.request(drift)[1], max_body_bytes=1 << 24)
    assert drift["phase"] == "topic_drift" and request.latest_text.endswith(NEW_TASK)


def test_the_judge_checks_their_costing_and_reads_back_their_tokens() -> None:
    script = load_script(STANDIN)
    judge = Judge(script)
    rows = script.simulate_workload(3, 5, 7)
    judge.check(rows)
    assert judge.tokens(rows[3]) == (800 + 1_900, standin.COMPLETION)
    rows[3]["agentic_cost"] += 0.01
    with pytest.raises(ExperimentError, match="sess-000 turn 3"):
        judge.check(rows)


def test_a_script_that_is_not_theirs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="no such Python file"):
        load_script(tmp_path / "missing.py")
    partial = tmp_path / "partial.py"
    partial.write_text("MODELS = ()\ndef summarize(rows):\n    return {}\n")
    with pytest.raises(ExperimentError, match="SCENARIOS, DEFAULT_SCENARIOS, simulate_workload"):
        load_script(partial)
    repriced = tmp_path / "repriced.py"
    repriced.write_text(STANDIN.read_text().replace("8.00, 24.00", "9.00, 24.00"))
    with pytest.raises(ExperimentError, match="frontier-reasoner is not priced as"):
        run_experiment(Spec(str(repriced), seeds=(7,), sessions=1, turns=2, policies=("saar",)))
    with pytest.raises(ExperimentError, match="no scenario nowhere"):
        run_experiment(Spec(str(STANDIN), scenarios=("nowhere",)))


def test_cli_json_is_the_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval", "experiment", "--script", str(STANDIN), "--json", "--seeds", "7",
            "--sessions", "3", "--turns", "5", "--jobs", "1", "--policies", "single_turn,saar"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("policy")
    doc = json.loads(lines[-1])
    assert doc["turns"] == 30
    assert doc["policies"]["ours/saar"]["switches"] == 9
    assert set(doc["policies"]) == {"theirs/single-turn", "theirs/acr-full",
                                    "theirs/acr-no-tool-lock", "ours/single_turn", "ours/saar"}


def test_cli_refuses_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval", "experiment", "--script", str(STANDIN), "--policies", "saar,clairvoyant"]
    assert main(argv) == 2
    assert "unknown policies clairvoyant" in capsys.readouterr().err
