"""Runs of an agent that names no session (Qwen Code by default), through the real router:
one session per run, a resume continues it, two runs that open alike never merge."""

from __future__ import annotations

import orjson
import pytest

from extproc.assembly import assemble
from extproc.core.router import LocalDriver
from extproc.types import Api, ResponseSummary

TOOLS = [{"type": "function", "function": {"name": "run_shell_command", "parameters": {}}}]
REMINDER = "<system-reminder>Today's date is Wednesday.</system-reminder>"


def body(task: str, history: list[dict], *, reminder: bool = True) -> bytes:
    first = [{"type": "text", "text": REMINDER}] if reminder else []
    messages = [{"role": "system", "content": "You are Qwen Code."},
                {"role": "user", "content": [*first, {"type": "text", "text": task}]},
                *history]
    return orjson.dumps({"model": "auto", "messages": messages, "tools": TOOLS})


def call(call_id: str) -> list[dict]:
    return [{"role": "assistant", "tool_calls": [{"id": call_id, "type": "function",
             "function": {"name": "run_shell_command", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "ok"}]


@pytest.fixture
def driver(session_config, clock):
    return LocalDriver(assemble(session_config, clock=clock).router)


def send(driver, raw: bytes, issued: str | None = None) -> str | None:
    routed = driver.route(Api.CHAT, {"authorization": "Bearer qwen"}, raw)
    driver.respond(routed, ResponseSummary(
        status=200, tool_call_ids=[issued] if issued else [],
        finish_reason="tool_calls" if issued else "stop"))
    return routed.turn.session_key


def test_runs_without_an_id(driver):
    run = [send(driver, body("debug", []), "call_a"),
           send(driver, body("debug", call("call_a")), "call_b"),
           send(driver, body("debug", call("call_a") + call("call_b")))]
    # The resume drops the date reminder and adds a turn: its history holds the run's ids.
    resume = send(driver, body("debug", [*call("call_a"), *call("call_b"),
                                         {"role": "user", "content": "confirm"}],
                               reminder=False))
    again = [send(driver, body("debug", [])), send(driver, body("debug", []))]
    assert len(set(run)) == 1 and None not in run
    assert resume == run[0]
    assert len({*again, run[0]}) == 3  # the same prompt, three runs: three sessions


def test_a_history_of_unknown_ids_falls_back_to_the_fingerprint(driver):
    """Ids another router issued (or long expired): the conversation's fingerprint, the same
    whatever its reminders."""
    first = send(driver, body("other", call("call_x")))
    second = send(driver, body("other", [*call("call_x"), *call("call_y")], reminder=False))
    assert first == second and first.split("/", 1)[1].startswith("c-")


EXTRACTION = "You are now acting as the managed memory extraction subagent."


def side_agent(task: str, answer: str) -> bytes:
    """Qwen Code's memory-extraction side agent after a plain run: its own system prompt and
    tools, the run's history (its task and the answer's text, no id) and its own task."""
    messages = [{"role": "system", "content": EXTRACTION},
                {"role": "user", "content": [{"type": "text", "text": REMINDER},
                                             {"type": "text", "text": task}]},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "Scan the recent conversation history."}]
    return orjson.dumps({"model": "auto", "messages": messages, "tools": TOOLS[:1]})


def said(driver, raw: bytes, text: str) -> str | None:
    routed = driver.route(Api.CHAT, {"authorization": "Bearer qwen"}, raw)
    driver.respond(routed, ResponseSummary(status=200, text=text, finish_reason="stop"))
    return routed.turn.session_key


def test_a_side_agent_resending_a_runs_answer_joins_that_run(driver):
    """A plain run's history holds no id, only its answer's text: the text's mark chains the
    side agent to the run that got the answer, and two runs of one prompt stay two."""
    first = said(driver, body("Say hello", []), "Hello there.\n")
    first_side = said(driver, side_agent("Say hello", "Hello there."), "")
    second = said(driver, body("Say hello", []), "Hi!")
    second_side = said(driver, side_agent("Say hello", "Hi!"), "")
    unknown = said(driver, side_agent("Say hello", "Never answered here."), "")
    assert first_side == first and second_side == second
    assert len({first, second, unknown}) == 3


TASK = "Run this and report its output: [[run: echo sub-5]]"
OTHER_TASK = "Find where the cache is flushed and say why."
SUBAGENT = "You are a general-purpose subagent working for a parent agent."


def spawn(call_id: str, task: str) -> ResponseSummary:
    """An answer whose ``agent`` call gives a sub-agent ``task`` (Qwen Code's spawn tool)."""
    arguments = orjson.dumps({"description": "Run a delegated command", "prompt": task})
    return ResponseSummary(status=200, tool_call_ids=[call_id], tool_names=["agent"],
                           arguments={0: arguments.decode()}, finish_reason="tool_calls")


def sub_agent(task: str, history: list[dict]) -> bytes:
    """A sub-agent's request: its own system prompt, a reminder, its task, its own history."""
    messages = [{"role": "system", "content": SUBAGENT},
                {"role": "user", "content": [{"type": "text", "text": REMINDER},
                                             {"type": "text", "text": task}]},
                *history]
    return orjson.dumps({"model": "auto", "messages": messages, "tools": TOOLS})


def routed_as(driver, raw: bytes, answer: ResponseSummary,
              credential: str = "qwen") -> tuple[str, str | None]:
    """The session a request was routed in (its id, tenant left out) and its parent."""
    routed = driver.route(Api.CHAT, {"authorization": f"Bearer {credential}"}, raw)
    driver.respond(routed, answer)
    turn = routed.turn
    assert turn.session_key is not None
    return turn.session_key.split("/", 1)[1], turn.parent


def answered(call_id: str | None = None) -> ResponseSummary:
    return ResponseSummary(status=200, tool_call_ids=[call_id] if call_id else [],
                           finish_reason="tool_calls" if call_id else "stop")


def test_a_sub_agent_opening_with_its_spawn_calls_task_is_under_the_spawning_run(driver):
    """Qwen Code's sub-agent names nothing of its parent but the task the parent's ``agent``
    call gave it: the router owns that call's task text as it owns the call's id, so the
    sub-agent opens a session of its own under the run, and keeps that parent on every
    later turn; the same text from another tenant, or another text, opens a root."""
    run, _ = routed_as(driver, body("Delegate it", []), spawn("call_p", TASK))
    other_run, _ = routed_as(driver, body("Delegate that", []), spawn("call_q", OTHER_TASK))
    steps = [
        # (request, its answer, credential) -> (same session as, parent)
        ((sub_agent(TASK, []), answered("call_s"), "qwen"), ("new", run)),
        ((sub_agent(TASK, call("call_s")), answered(), "qwen"), ("sub", run)),
        ((body("Delegate it", call("call_p")), answered(), "qwen"), ("run", None)),
        ((sub_agent(OTHER_TASK, []), answered(), "qwen"), ("new", other_run)),
        ((sub_agent(TASK, []), answered(), "another"), ("new", None)),
        ((sub_agent("A task no call of this router gave.", []), answered(), "qwen"),
         ("new", None)),
    ]
    seen: dict[str, str] = {"run": run}
    for (raw, answer, credential), (same_as, parent) in steps:
        session, got_parent = routed_as(driver, raw, answer, credential)
        if same_as == "new":
            assert session not in {run, other_run, *seen.values()}
            seen.setdefault("sub", session)
        else:
            assert session == seen[same_as]
        assert got_parent == parent, (same_as, parent)
