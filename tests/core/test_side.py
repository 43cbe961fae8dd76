"""Side requests (``core.side``): the rule as a table, then through the router — OpenCode's
title request before its main loop, a haiku-like call in the middle of a session."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extproc.assembly import assemble
from extproc.config import parse_config
from extproc.core.router import LocalDriver
from extproc.core.side import Standing, standing
from extproc.state.records import SessionRecord
from extproc.types import Api, Phase, RequestSummary, ResponseSummary
from tests.conftest import session_config_data

CHEAP, STRONG = "qwen3-8b", "qwen3-32b"
POOL = {CHEAP: ["10.0.0.1:8000", "10.0.0.2:8000"], STRONG: ["10.0.1.1:8000", "10.0.1.2:8000"]}
TOOLS = ("bash",)


def request(*, opening: bool = True, tools: tuple[str, ...] = (), tokens: int = 600,
            model: str = "auto", results: int = 0) -> RequestSummary:
    return RequestSummary(Api.CHAT, model, True, 2, tokens, tools_offered=tools,
                          tool_results=results, opening=opening)


def record(requested: str | None) -> SessionRecord:
    return SessionRecord(STRONG, "hard_engineering", Phase.NORMAL, 0.0, requested=requested)


@pytest.mark.parametrize(("summary", "state", "max_tokens", "expected"), [
    # A small tool-less first request of a new session (OpenCode's title): provisional.
    (request(), None, 4096, Standing.PROVISIONAL),
    # ... and again while the session has made only light requests.
    (request(), record(None), 4096, Standing.PROVISIONAL),
    # The main loop's first request after them (it offers tools): placed as a first request.
    (request(tools=TOOLS, tokens=20_000), record(None), 4096, Standing.FIRST),
    # A new session's first request with tools is simply its first turn.
    (request(tools=TOOLS, tokens=20_000), None, 4096, Standing.MAIN),
    # Light, naming another model than the session's usual one: a side request.
    (request(model="claude-haiku"), record("auto"), 4096, Standing.SIDE),
    # Light, naming the usual model: a turn like any other.
    (request(), record("auto"), 4096, Standing.MAIN),
    # Not light, whatever model it names: too large, with tools, continuing a conversation,
    # carrying tool results.
    (request(model="claude-haiku", tokens=4097), record("auto"), 4096, Standing.MAIN),
    (request(model="claude-haiku", tools=TOOLS), record("auto"), 4096, Standing.MAIN),
    (request(model="claude-haiku", opening=False), record("auto"), 4096, Standing.MAIN),
    (request(model="claude-haiku", results=1), record("auto"), 4096, Standing.MAIN),
    # A plain chat's later turn (it continues its conversation) is never a first request.
    (request(opening=False, tools=TOOLS), record(None), 4096, Standing.MAIN),
    # Off: every request is a turn.
    (request(model="claude-haiku"), record("auto"), 0, Standing.MAIN),
    (request(tools=TOOLS, tokens=20_000), record(None), 0, Standing.MAIN),
])
def test_where_a_request_stands_in_its_session(summary, state, max_tokens, expected):
    assert standing(summary, state, max_tokens) is expected


def body(system: str, user: str, *, model: str = "auto", tools: bool = False,
         history: list[dict[str, Any]] | None = None) -> bytes:
    doc: dict[str, Any] = {"model": model, "stream": True, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user},
        *(history or [])]}
    if tools:
        doc["tools"] = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    return orjson.dumps(doc)


MAIN_SYSTEM = "You are opencode, an agent. " * 200
TITLE = body("You are a title generator. You output ONLY a thread title.",
             "Generate a title for this conversation: summarise the changelog")
MAIN = body(MAIN_SYSTEM, "Please refactor the storage layer", tools=True)
LOOP = body(MAIN_SYSTEM, "Please refactor the storage layer", tools=True, history=[
    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                          "function": {"name": "bash", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "ok"}])
HAIKU = body("Answer in one word.", "Is this a new topic? summarise", model=CHEAP)
SAME_MODEL = body("Answer in one word.", "Is this a new topic? summarise")


def driver(clock, max_tokens: int) -> tuple[LocalDriver, Any]:
    data = session_config_data()
    for model, endpoints in POOL.items():
        data["models"][model]["endpoints"] = endpoints
    data["routing"]["side_request_max_tokens"] = max_tokens
    parts = assemble(parse_config(data, source="side"), clock=clock)
    return LocalDriver(parts.router), parts


def send(local: LocalDriver, parts: Any, raw: bytes, clock, **answer: Any) -> dict[str, Any]:
    """Route and answer ``raw`` in session ``ses_1``; its replay record, with the session's
    record as this request left it (``after``)."""
    routed = local.route(Api.CHAT, {"authorization": "Bearer k", "x-session-id": "ses_1"}, raw)
    local.respond(routed, ResponseSummary(status=200, model=routed.model, **answer))
    clock.advance(1)
    found = parts.replay.get(routed.replay_id)
    key = f"{found['session']['tenant']}/ses_1"
    found["after"] = local.session(key)
    return found


def bound(found: dict[str, Any]) -> str | None:
    """The worker the session's binding pointed placement at (session affinity 1.0)."""
    affinity = found["worker"]["by_scorer"]["session_affinity"]
    return next((w for w, score in affinity.items() if score == 1.0), None)


def test_opencodes_title_request_neither_places_nor_counts_for_its_main_loop(clock):
    local, parts = driver(clock, 4096)
    title = send(local, parts, TITLE, clock)
    main = send(local, parts, MAIN, clock, tool_call_ids=["call_1"])
    # Placed as the session's first request: SAAR's base choice, no binding to the title's
    # worker; the session's record starts afresh with it.
    assert (main["reason"], main["phase"], main["model"]) == ("new_session", "new", STRONG)
    assert bound(main) is None
    after = main["after"]
    assert (after.turns, after.switches, after.model, after.requested) == (1, 0, STRONG, "auto")
    assert after.worker == main["worker"]["picked"] and title["after"].requested is None
    loop = send(local, parts, LOOP, clock)
    assert (loop["reason"], bound(loop)) == ("tool_loop_lock", main["worker"]["picked"])
    assert loop["after"].turns == 2


def test_the_title_request_places_the_session_with_the_rule_off(clock):
    """The same traffic with ``side_request_max_tokens: 0``: what the rule changes."""
    local, parts = driver(clock, 0)
    title = send(local, parts, TITLE, clock)
    main = send(local, parts, MAIN, clock, tool_call_ids=["call_1"])
    assert (main["reason"], main["phase"]) == ("drift_reset", "drift_reset")
    assert main["memory"]["model"] == title["model"] == CHEAP
    assert (main["after"].turns, main["after"].switches) == (2, 1)


def test_a_side_call_in_the_middle_of_a_session_leaves_it_as_it_was(clock):
    local, parts = driver(clock, 4096)
    send(local, parts, MAIN, clock, tool_call_ids=["call_1"])
    loop = send(local, parts, LOOP, clock)
    before = loop["after"]
    side = send(local, parts, HAIKU, clock)
    assert (side["model"], side["reason"], bound(side)) == (CHEAP, "side_request", None)
    assert side["session"]["id"] == "ses_1"  # recorded in its session, written to nothing
    after = side["after"]
    assert (after.turns, after.model, after.worker, after.last_replay_id) == (
        before.turns, before.model, before.worker, before.last_replay_id)
    # A light request naming the session's usual model is a turn like any other.
    same = send(local, parts, SAME_MODEL, clock)
    assert same["reason"] != "side_request" and same["after"].turns == before.turns + 1
