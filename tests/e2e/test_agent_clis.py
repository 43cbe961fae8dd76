"""The four agent CLIs as they really are — Claude Code, Codex (its default "responses-lite"
format and the standard one), OpenCode and Qwen Code, installed by ``make install`` — run
headless with their own tool loops through Envoy and ``saar serve`` to two models of two
simulated workers each, all in one loopback-only network namespace.

Each CLI runs a plain task, a debugging task whose commands it really executes, a resume of it
and a task it delegates to a sub-agent (``extproc.dev.sim.agent`` plays their model). The
runs happen once, in the module's fixture; the tests assert from outside the router: the CLIs'
own output, files and session ids, Envoy's access log, the simulators' continuity counters and
the replay records.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from extproc.dev import agent_clis
from extproc.dev.agent_clis import (
    CODEX_DEFAULT_MODEL,
    AgentCli,
    ClaudeCode,
    CliRun,
    Codex,
    OpenCode,
    QwenCode,
)
from extproc.dev.harness import Stack, run_stack
from tests.e2e.conftest import e2e_config, get_json, replay_outcome

pytestmark = pytest.mark.e2e

PLAIN = "Say hello in one line."
DEBUG = ("Debug the failing check: [[run: printf 'check-%s\\n' $((6*7)) > check.txt]] "
         "then [[run: cat check.txt]]")
RESUME = "Confirm the fix holds: [[run: grep -c check-42 check.txt > confirmed.txt]]"
DELEGATE = "Delegate this to a sub-agent: [[agent: echo sub-$((2+3)) > sub.txt; cat sub.txt]]"
SECOND = "Delegate the second check: [[agent: echo second-$((4*4))]]"
"""Another session in the same project, with another sub-agent: the cache figures."""


@dataclass
class Traffic:
    """One CLI run and what reached the stack while it ran."""

    run: CliRun
    records: list[dict[str, Any]]
    statuses: list[int]

    def roots(self) -> set[str | None]:
        """The router sessions of the run's own requests (sub-agents' set aside)."""
        return {r["session"]["id"] for r in self.records if not r["session"]["parent"]}

    def children(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["session"]["parent"]]


@dataclass
class Runs:
    stack: Stack
    by_cli: dict[str, dict[str, Traffic]] = field(default_factory=dict)
    projects: dict[str, Path] = field(default_factory=dict)

    def all(self) -> Iterator[tuple[str, str, Traffic]]:
        for cli, runs in self.by_cli.items():
            for name, traffic in runs.items():
                yield cli, name, traffic


def agents_config() -> dict[str, Any]:
    """The e2e config as a new user runs it: default idle timeout, Codex's default model
    name accepted as a logical model."""
    config = e2e_config()
    for decision in config["routing"]["decisions"]:
        aware = decision.get("algorithm", {}).get("session_aware")
        if aware:
            aware["idle_timeout_seconds"] = 300
    config["routing"]["logical_models"] = ["auto", CODEX_DEFAULT_MODEL]
    config["limits"]["max_body_bytes"] = 8 << 20
    return copy.deepcopy(config)


def _access_lines(stack: Stack) -> list[dict[str, Any]]:
    if not stack.access_log.exists():
        return []
    return [json.loads(line) for line in stack.access_log.read_text().splitlines() if line]


def _settled_lines(stack: Stack, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The access log once it has a line for every request the workers served (Envoy
    flushes it about once a second)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = _access_lines(stack)
        served = sum(state["requests"] for state in _sim_states(stack))
        if len(lines) >= served or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def _drive(stack: Stack, cli: AgentCli, prompt: str, project: Path,
           resume: bool = False) -> Traffic:
    before = len(_settled_lines(stack))
    run = cli.run(prompt, project, resume=resume).check()
    lines = _settled_lines(stack)[before:]
    records = [replay_outcome(stack, line["replay_id"]) for line in lines
               if line.get("replay_id") not in (None, "-")]
    return Traffic(run, records, [int(line["status"]) for line in lines])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[Runs]:
    missing = agent_clis.installed()
    if missing:
        pytest.fail(f"{missing}: `make install` installs them")
    root = tmp_path_factory.mktemp("agents")
    with agent_clis.loopback_namespace(), run_stack(
            agents_config(), workers_per_model=2, workdir=root / "stack") as stack:
        found = Runs(stack)
        plans: list[tuple[AgentCli, list[tuple[str, str, bool]]]] = [
            (ClaudeCode(root / "claude-home", stack.url),
             [("plain", PLAIN, False), ("debug", DEBUG, False), ("resume", RESUME, True),
              ("delegate", DELEGATE, False), ("second", SECOND, False)]),
            (Codex(root / "codex-home", stack.url, CODEX_DEFAULT_MODEL),
             [("plain", PLAIN, False), ("debug", DEBUG, False), ("resume", RESUME, True),
              ("delegate", DELEGATE, False)]),
            (OpenCode(root / "opencode-home", stack.url),
             [("plain", PLAIN, False), ("debug", DEBUG, False), ("resume", RESUME, True),
              ("delegate", DELEGATE, False)]),
            (QwenCode(root / "qwen-home", stack.url),
             [("plain", PLAIN, False), ("debug", DEBUG, False), ("resume", RESUME, True),
              ("delegate", DELEGATE, False), ("plain-again", PLAIN, False)]),
        ]
        for cli, plan in plans:
            project = root / f"{cli.name}-project"
            found.projects[cli.name] = project
            found.by_cli[cli.name] = {
                name: _drive(stack, cli, prompt, project, resume)
                for name, prompt, resume in plan}
        opted_in = QwenCode(root / "qwen-header-home", stack.url, session_header="x-session-id")
        found.projects["qwen-code-header"] = root / "qwen-header-project"
        found.by_cli["qwen-code-header"] = {
            name: _drive(stack, opted_in, prompt, found.projects["qwen-code-header"], resume)
            for name, prompt, resume in [("debug", DEBUG, False), ("resume", RESUME, True)]}
        standard = Codex(root / "codex-standard-home", stack.url, "auto")
        found.projects["codex-standard"] = root / "codex-standard-project"
        found.by_cli["codex-standard"] = {
            "debug": _drive(stack, standard, DEBUG, found.projects["codex-standard"])}
        yield found


def _sim_states(stack: Stack) -> list[dict[str, Any]]:
    return [get_json(f"{url}/admin/state") for urls in stack.sims.values() for url in urls]


def test_every_request_is_answered_200(runs):
    statuses = [s for _, _, traffic in runs.all() for s in traffic.statuses]
    assert len(statuses) >= 40
    assert statuses == [200] * len(statuses)
    served = sum(state["requests"] for state in _sim_states(runs.stack))
    assert served == len(statuses)


FLAKY_OUTPUT = {"qwen-code", "qwen-code-header"}
"""Qwen Code 0.24.4 now and then reports a command's output as "(empty)" when the command ran
(its files are there): seen in about one run in three under load. Its runs are judged by what
the commands left on disk only."""


def test_the_clis_ran_the_commands_and_quote_their_output(runs):
    for cli, by_name in runs.by_cli.items():
        project = runs.projects[cli]
        quoted = cli not in FLAKY_OUTPUT
        assert (project / "check.txt").read_text() == "check-42\n", cli
        assert "check-42" in by_name["debug"].run.answer or not quoted, cli
        if "resume" in by_name:
            assert (project / "confirmed.txt").read_text() == "1\n", cli
        if "delegate" in by_name:
            assert (project / "sub.txt").read_text() == "sub-5\n", cli
            assert "sub-5" in by_name["delegate"].run.answer or not quoted, cli


def test_tool_results_and_provider_blobs_stay_with_their_issuer(runs):
    states = _sim_states(runs.stack)
    assert sum(sum(s["violations"].values()) for s in states) == 0
    continued = {kind: sum(s["continued"][kind] for s in states)
                 for kind in ("tool_call", "provider_state")}
    # Every CLI's tool loops (and Claude Code's signed thinking, Codex's encrypted reasoning)
    # went back to a worker: continuity was exercised, not vacuously kept.
    assert continued["tool_call"] >= 20
    assert continued["provider_state"] >= 10


@pytest.mark.parametrize("cli", ["claude-code", "codex", "codex-standard", "opencode"])
def test_sessions_are_keyed_by_the_clis_own_ids(runs, cli):
    for name, traffic in runs.by_cli[cli].items():
        assert traffic.roots() == {traffic.run.session_id}, (cli, name)


@pytest.mark.parametrize("cli", ["claude-code", "codex", "opencode"])
def test_a_resumed_run_stays_in_its_session(runs, cli):
    by_name = runs.by_cli[cli]
    assert by_name["resume"].run.session_id == by_name["debug"].run.session_id
    assert by_name["resume"].roots() == by_name["debug"].roots()


@pytest.mark.parametrize("cli", ["claude-code", "codex", "opencode"])
def test_sub_agents_are_recorded_under_their_parent(runs, cli):
    delegate = runs.by_cli[cli]["delegate"]
    children = delegate.children()
    assert children, cli
    (root,) = delegate.roots()
    assert {r["session"]["parent"] for r in children} == {root}
    assert all(r["session"]["id"] != root for r in children)


def test_codex_default_format_is_recorded_with_its_tools(runs):
    for name, traffic in runs.by_cli["codex"].items():
        assert traffic.records and all(
            r["request"]["tools_offered"] > 0 for r in traffic.records), name
    debug = runs.by_cli["codex"]["debug"].run
    commands = [e["item"] for e in debug.events if e.get("type") == "item.completed"
                and (e.get("item") or {}).get("type") == "command_execution"]
    assert commands and all(c["exit_code"] == 0 for c in commands)


def test_qwen_code_keeps_a_tool_loop_in_one_session_without_an_id(runs):
    """What holds today without an id: the turns of one conversation share its session (its
    opening is resent unchanged), and a different task is another session."""
    debug, plain = runs.by_cli["qwen-code"]["debug"], runs.by_cli["qwen-code"]["plain"]
    loop = [r for r in debug.records if r["request"]["tool_results"]]
    assert len(loop) >= 2
    (session,) = {r["session"]["id"] for r in loop}
    assert session == debug.records[0]["session"]["id"]
    assert session not in plain.roots()


def test_qwen_code_with_its_opt_in_session_header_is_one_session_per_run(runs):
    """docs/agents.md's setting: ``customHeaders`` with ``${session_id}`` (and the switch that
    lets it expand) makes a Qwen Code run, and its resume, one session keyed by its own id."""
    by_name = runs.by_cli["qwen-code-header"]
    debug, resume = by_name["debug"], by_name["resume"]
    assert resume.run.session_id == debug.run.session_id
    for traffic in (debug, resume):
        assert {r["session"]["id"] for r in traffic.records} == {debug.run.session_id}
        assert {r["session"]["source"] for r in traffic.records} == {"x-session-id"}


def test_qwen_code_gets_one_session_per_run_with_default_settings(runs):
    """No id sent: a run's turns, its memory-extraction side agent (by its answer's text)
    and its resume (by the history's ids) are one session; its sub-agent is a child of it, not
    a second root; the same prompt in another run is another session."""
    by_name = runs.by_cli["qwen-code"]
    roots = {name: traffic.roots() for name, traffic in by_name.items()}
    assert all(len(r) == 1 for r in roots.values()), roots
    assert roots["resume"] == roots["debug"]
    assert roots["plain-again"] != roots["plain"]  # same prompt, another run


def test_qwen_code_sub_agents_are_recorded_under_their_parent(runs):
    """Its sub-agent's first request carries the task of the parent's ``agent`` call, which
    the parent's answer issued: the sub-agent's every turn is recorded under the parent."""
    delegate = runs.by_cli["qwen-code"]["delegate"]
    (root,) = delegate.roots()
    children = delegate.children()
    assert children and {r["session"]["parent"] for r in children} == {root}


def test_opencodes_title_request_does_not_place_its_session(runs):
    """The title request (no tools, the session's first) counts provisionally; the main
    loop's first request is placed as the session's first (SAAR's new session, no binding to
    the title's worker), and the session's record starts with it."""
    placed = 0
    for name, traffic in runs.by_cli["opencode"].items():
        by_session: dict[str, list[dict[str, Any]]] = {}
        for r in traffic.records:
            by_session.setdefault(r["session"]["id"], []).append(r)
        for records in by_session.values():
            if records[0]["request"]["tools_offered"] or len(records) < 2:
                continue
            main = records[1]
            affinity = main["worker"]["by_scorer"]["session_affinity"]
            assert (main["reason"], main["phase"]) == ("new_session", "new"), name
            assert set(affinity.values()) == {0.0}, name
            placed += 1
    assert placed >= 3


def _cached_fraction(record: dict[str, Any]) -> float:
    usage = (record.get("outcome") or {}).get("usage") or {}
    return usage.get("cached_tokens", 0) / max(usage.get("prompt_tokens", 0), 1)


def test_report_claude_code_cache_figures(runs):
    """Prints (does not assert) what the normalisation work is measured by."""
    figures = _claude_cache_figures(runs)
    print(f"\nClaude Code cache figures: {json.dumps(figures)}")
    assert None not in figures.values()


def _claude_cache_figures(runs: Runs) -> dict[str, Any]:
    """The first request of a session started after others in the same project, and the
    first turn of a sub-agent started after another session's sub-agent: the share of each
    prompt its worker had cached (as the simulator reported it to the CLI)."""
    second = runs.by_cli["claude-code"]["second"]
    roots = [r for r in second.records if not r["session"]["parent"]]
    children = second.children()
    return {
        "second_session_first_request": round(_cached_fraction(roots[0]), 3)
        if roots else None,
        "sub_agent_first_turn": round(_cached_fraction(children[0]), 3) if children else None,
    }


def test_claude_code_reuses_the_prompt_across_sessions_and_sub_agents(runs):
    figures = _claude_cache_figures(runs)
    assert figures["second_session_first_request"] >= 0.75
    assert figures["sub_agent_first_turn"] >= 0.5


def test_first_requests_go_where_their_prefix_is_unless_predicted_faster_elsewhere(runs):
    """Issue 30, over the four CLIs: every new session's and sub-agent's first request lands
    on the worker whose index matched the most of its prompt, unless its record shows a
    shorter predicted time there (the pick minimises the predicted cost, in seconds)."""
    firsts = elsewhere = 0
    for cli, name, traffic in runs.all():
        for record in traffic.records:
            worker = record["worker"]
            if record["phase"] != "new" or not worker or not worker["matched_blocks"]:
                continue
            firsts += 1
            matched, picked = worker["matched_blocks"], worker["picked"]
            most = max(matched.values())
            if matched.get(picked, 0) == most:
                continue
            elsewhere += 1
            predicted = worker["predicted"] or {}
            best = min(predicted[w]["cost_s"] for w, m in matched.items() if m == most)
            assert picked in predicted and predicted[picked]["cost_s"] <= best, (
                cli, name, record["replay_id"], matched, predicted)
    print(f"\nfirst requests: {firsts}, placed off the most-matched worker for a shorter "
          f"predicted time: {elsewhere}")
    assert firsts >= 8


def _second_sessions(runs: Runs) -> dict[str, float]:
    """Per CLI: the share of a session's first request its worker had cached, for the first
    session in the CLI's runs whose first request went to a model an earlier session's first
    request went to (another model's workers share nothing with it)."""
    shares = {}
    for cli in ("claude-code", "codex", "opencode", "qwen-code"):
        seen: set[str] = set()
        for traffic in runs.by_cli[cli].values():
            firsts = [r for r in traffic.records if not r["session"]["parent"]
                      and r["phase"] == "new" and r["request"]["tools_offered"]]
            if not firsts:
                continue
            if firsts[0]["model"] in seen:
                shares[cli] = round(_cached_fraction(firsts[0]), 3)
                break
            seen.add(firsts[0]["model"])
    return shares


def test_a_second_sessions_first_request_finds_the_shared_prompt_cached(runs):
    """Issue 30: at least 75% for each CLI whose sessions share a system prompt."""
    shares = _second_sessions(runs)
    print(f"\nsecond session's first request, share cached: {json.dumps(shares)}")
    assert len(shares) == 4
    assert {cli: s for cli, s in shares.items() if s < 0.75} == {}
