"""The matrix end to end on the live router: hand-built sessions, a small matrix, the CLI."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import orjson
import pytest

from extproc.apis import parse_request
from extproc.cli import main
from extproc.core.selection import HybridSelector
from extproc.dev.evaluation.backend import Reply
from extproc.dev.evaluation.client import AgentSession, Request
from extproc.dev.evaluation.oracle import Carried, Unsafe
from extproc.dev.evaluation.policies import POLICIES, matrix_config
from extproc.dev.evaluation.runner import Cell, MatrixSpec, Tally, run_matrix
from extproc.dev.evaluation.workloads import PHRASES, workload
from extproc.types import Api

HEADERS = {"authorization": "Bearer sk-test", "x-session-id": "hand-built"}
TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]


def _responses(body: dict[str, object], turn: int, carried: Carried, tools: bool) -> Request:
    body = {"model": "auto", "store": True, "tools": TOOLS, **body}
    reply = Reply(
        "hand-built",
        turn,
        9_000,
        80,
        ("read_file",) if tools else (),
        responses_api=True,
        reasoning=False,
    )
    return Request(
        Api.RESPONSES, orjson.dumps(body), HEADERS, carried, reply, "hard_reasoning", 5.0
    )


def _chained_tool_loop(policy: str) -> list:
    """A hard task whose answer calls a tool; the results come back chained on the response."""
    cell = Cell(matrix_config(), policy)
    user = {"type": "message", "role": "user", "content": PHRASES["hard_reasoning"][0]}
    first = cell.step("hand-built", _responses({"input": [user]}, 0, Carried(), tools=True))
    (call,) = first.answer.summary.tool_call_ids
    response_id = first.answer.summary.response_id
    output = {"type": "function_call_output", "call_id": call, "output": "lock held by worker 3"}
    chained = {"previous_response_id": response_id, "input": [output]}
    second = cell.step(
        "hand-built", _responses(chained, 1, Carried((call,), (response_id,)), tools=False)
    )
    # A new task (a coding ask) drifts: without the provider lock, selection reopens.
    follow_up = {"type": "message", "role": "user", "content": PHRASES["coding"][0]}
    third = cell.step(
        "hand-built",
        _responses(
            {"previous_response_id": second.answer.summary.response_id, "input": [follow_up]},
            2,
            Carried(provider_state=(second.answer.summary.response_id,)),
            tools=False,
        ),
    )
    return [first, second, third]


def test_single_turn_hands_tool_results_to_another_model() -> None:
    first, second, third = _chained_tool_loop("single_turn")
    assert first.model == "frontier-xl"
    assert second.model != "frontier-xl"
    assert second.verdict.unsafe is Unsafe.TOOL_LOOP
    assert third.verdict.unsafe is None or third.verdict.unsafe is Unsafe.PROVIDER_STATE


@pytest.mark.parametrize("policy", ["saar", "no_tool_lock", "sticky"])
def test_locked_policies_keep_the_issuer(policy: str) -> None:
    steps = _chained_tool_loop(policy)
    assert [s.model for s in steps] == ["frontier-xl"] * 3
    assert all(s.verdict.unsafe is None and not s.verdict.switched for s in steps)


def test_no_provider_lock_breaks_a_chained_follow_up() -> None:
    first, second, third = _chained_tool_loop("no_provider_lock")
    assert second.verdict.unsafe is None
    assert third.model != first.model
    assert third.verdict.unsafe is Unsafe.PROVIDER_STATE


def test_single_turn_serves_the_stateless_base_choice_every_turn() -> None:
    config = matrix_config()
    cell = Cell(config, "single_turn")
    selector = HybridSelector(config)
    session = AgentSession(workload("drift-heavy"), random.Random(3), "st", "t")
    for _ in range(18):
        request = session.next_request()
        parsed = parse_request(request.api, request.raw, max_body_bytes=1 << 30)
        expected = selector.select(parsed, request.headers).model
        step = cell.step("st", request)
        session.observe(step.answer, request.reply)
        assert step.model == expected


def test_sticky_keeps_the_first_model_of_every_session() -> None:
    cell = Cell(matrix_config(), "sticky")
    for index in range(6):
        session = AgentSession(workload("drift-heavy"), random.Random(index), f"s{index}", "t")
        cell.play(session, 18, Tally())
        records = cell.parts.replay.for_session(f"s{index}")
        assert len(records) == 18
        assert len({r["model"] for r in records}) == 1


SMALL = MatrixSpec(seeds=1, sessions=12, turns=12, workloads=("tool-heavy", "provider-state-heavy"))


@pytest.fixture(scope="module")
def small_matrix() -> dict[str, Tally]:
    return run_matrix(SMALL)


def test_small_matrix_counts(small_matrix: dict[str, Tally]) -> None:
    single, saar = small_matrix["single_turn"], small_matrix["saar"]
    assert single.turns == saar.turns == SMALL.total_turns
    assert single.unsafe[Unsafe.TOOL_LOOP] > 0
    assert sum(saar.unsafe.values()) == 0
    assert saar.switches < single.switches
    assert small_matrix["no_tool_lock"].unsafe[Unsafe.TOOL_LOOP] > 0
    assert small_matrix["no_provider_lock"].unsafe[Unsafe.PROVIDER_STATE] > 0
    assert small_matrix["sticky"].switches == 0


def test_matrix_is_deterministic(small_matrix: dict[str, Tally]) -> None:
    again = run_matrix(replace(SMALL, policies=("saar",)))
    assert again["saar"] == small_matrix["saar"]


def test_cli_json_is_the_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval", "matrix", "--json", "--seeds", "1", "--sessions", "2", "--turns", "5"]
    assert main([*argv, "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "single_turn" in lines[0] or "policy" in lines[0]
    doc = json.loads(lines[-1])
    assert doc["turns"] == 6 * 2 * 5
    assert set(doc["policies"]) == set(POLICIES)
    keys = {
        "switches",
        "unsafe_switches",
        "cost_reduction",
        "quality_delta",
        "switch_reduction",
        "unsafe_tool_loop",
        "unsafe_provider_state",
    }
    for numbers in doc["policies"].values():
        assert keys <= set(numbers)
        assert numbers["unsafe_switches"] == (
            numbers["unsafe_tool_loop"] + numbers["unsafe_provider_state"]
        )
    assert doc["policies"]["single_turn"]["switch_reduction"] == 0.0
    assert doc["policies"]["single_turn"]["quality_delta"] == 0.0
