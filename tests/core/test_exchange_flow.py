"""Flow control in the exchange: a saturated pool's requests are held as ``queue`` holds,
woken when a place frees, shed in the client's format with the drop reason."""

from __future__ import annotations

import orjson
import pytest

from extproc.config import parse_config
from extproc.core.exchange import (
    Closed,
    RequestBody,
    RequestHeaders,
    ResponseBody,
    ResponseHeaders,
    Woken,
)
from tests.conftest import session_config_data
from tests.core.test_exchange import CHAT, CHAT_CALL, MESSAGES, Loop, chat, messages

POOL = {"qwen3-32b": ["127.0.0.1:8102", "127.0.0.1:8112"],
        "qwen3-8b": ["127.0.0.1:8101", "127.0.0.1:8111"]}


@pytest.fixture
def loop(clock) -> Loop:
    data = session_config_data()
    for model, endpoints in POOL.items():
        data["models"][model]["endpoints"] = endpoints
    data.setdefault("scheduling", {})["flow_control"] = {
        "enabled": True, "queue_depth_threshold": 1}
    return Loop(parse_config(data, source="flow"), clock)


def saturate(loop: Loop, waiting: int = 1) -> None:
    for model in POOL:
        for worker in loop.parts.pools.registry.pool(model):
            worker.waiting, worker.scraped_at = waiting, loop.clock()


def session(name: str, **extra: str) -> dict[str, str]:
    return {**CHAT, "x-session-id": name, **extra}


def test_an_unsaturated_pool_routes_at_once(loop):
    loop(RequestHeaders(session("a")))
    assert loop(RequestBody(chat())) == ["parse", "load", "route qwen3-32b"]


def test_a_saturated_pool_queues_then_a_free_place_wakes_the_queue(loop):
    first = loop.exchange
    loop(RequestHeaders(session("a")), first)
    assert loop(RequestBody(chat()), first)[-1] == "route qwen3-32b"
    saturate(loop)
    queued = loop.new()
    loop(RequestHeaders(session("b")), queued)
    assert loop(RequestBody(chat()), queued) == ["parse", "load", "hold queue"]
    assert loop(Woken("queue"), queued) == ["hold queue"]  # its look: not dispatched yet
    # The first request ends and the pool has room again: the queue's head is woken.
    saturate(loop, waiting=0)
    loop(ResponseHeaders(200), first)
    assert "wake queue" in loop(Closed(), first)
    assert loop(Woken("queue"), queued) == ["route qwen3-32b"]
    record = loop.parts.replay.get(loop.commands[-1].routed.replay_id)
    assert [h["kind"] for h in record["holds"]] == ["queue", "queue"]


def test_a_wait_past_the_ttl_is_shed_with_the_reason_and_a_record(loop):
    saturate(loop)
    loop(RequestHeaders(session("a")))
    assert loop(RequestBody(chat()))[-1] == "hold queue"
    assert loop(Woken("queue", late=True)) == ["refuse 429 request_shed"]
    error = loop.commands[-1].error
    assert error.headers()["x-saar-drop-reason"] == "ttl"
    assert error.headers()["retry-after"] == "1"
    assert error.replay_id is not None
    record = loop.parts.replay.get(error.replay_id)
    assert record["outcome"]["refused"] == "request_shed"
    assert [h["kind"] for h in record["holds"]] == ["queue"]  # its wait is on its record
    body = orjson.loads(error.body("openai"))
    assert body["error"]["code"] == "request_shed"
    shed = loop.parts.metrics.flow_shed.labels("qwen3-32b", "interactive", "ttl")
    assert shed._value.get() == 1
    assert loop.parts.metrics.errors.labels("request_shed")._value.get() == 1


def test_a_deadline_sooner_than_the_ttl_bounds_the_wait(loop):
    saturate(loop)
    loop(RequestHeaders(session("a", **{"x-saar-deadline-ms": "500"})))
    assert loop(RequestBody(chat()))[-1] == "hold queue"
    assert loop.commands[-1].timeout == pytest.approx(0.5)
    assert loop(Woken("queue", late=True)) == ["refuse 429 request_shed"]
    assert loop.commands[-1].error.reason == "deadline"


def test_a_sheddable_request_is_refused_at_once_in_the_clients_format(loop):
    saturate(loop)
    loop(RequestHeaders({**MESSAGES, "x-saar-class": "sheddable"}))
    assert loop(RequestBody(messages())) == ["parse", "load", "refuse 429 request_shed"]
    error = loop.commands[-1].error
    assert error.reason == "saturated"
    assert orjson.loads(error.body("anthropic"))["error"]["type"] == "rate_limit_error"
    assert loop.parts.metrics.errors.labels("request_shed")._value.get() == 1  # once


def test_an_open_tool_loops_continuation_goes_before_a_new_sessions_first_turn(loop):
    # Session "loop" gets a tool call answered, so its next request continues the loop.
    loop(RequestHeaders(session("loop")))
    loop(RequestBody(chat()))
    home = loop.commands[-1].routed.placement.worker  # its context is there
    loop(ResponseHeaders(200))
    loop(ResponseBody(CHAT_CALL))
    loop(Closed())
    saturate(loop)
    new = loop.new()
    loop(RequestHeaders(session("new")), new)
    assert loop(RequestBody(chat()), new)[-1] == "hold queue"
    continuing = loop.new()
    loop(RequestHeaders(session("loop")), continuing)
    assert loop(RequestBody(chat(result="call_1")), continuing)[-1] == "hold queue"
    # One place frees on its worker (the next scrape shows it): the continuation, though it
    # came later, is the one dispatched.
    for worker in loop.parts.pools.registry.pool("qwen3-32b"):
        if worker.address == home:
            worker.waiting, worker.scraped_at = 0, loop.clock() + 1
    (ticket,) = loop.parts.pools.dispatch("qwen3-32b")
    assert loop(Woken("queue"), new) == ["hold queue"]
    assert loop(Woken("queue"), continuing) == ["route qwen3-32b"]
    assert loop.parts.pools.flow.queued() == {("qwen3-32b", "interactive"): 1}
    assert ticket not in loop.parts.pools.flow._tickets


def test_a_client_leaving_the_queue_frees_its_place(loop):
    saturate(loop)
    gone = loop.exchange
    loop(RequestHeaders(session("a")), gone)
    assert loop(RequestBody(chat()), gone)[-1] == "hold queue"
    loop(Closed(), gone)
    assert loop.parts.pools.flow.queued() == {}


def test_a_refusal_wakes_the_request_its_entry_dispatched(loop):
    saturate(loop)
    queued = loop.exchange
    loop(RequestHeaders(session("a")), queued)
    assert loop(RequestBody(chat()), queued)[-1] == "hold queue"
    # A place frees unseen (no dispatch ran since); a sheddable request's entry finds it,
    # but the queued interactive request ranks first and takes it: the refusal wakes it.
    worker = loop.parts.pools.registry.pool("qwen3-32b")[0]
    worker.waiting, worker.scraped_at = 0, loop.clock() + 1
    shed = loop.new()
    loop(RequestHeaders(session("b", **{"x-saar-class": "sheddable"})), shed)
    assert loop(RequestBody(chat()), shed) == ["parse", "load", "wake queue",
                                               "refuse 429 request_shed"]
    assert loop(Woken("queue"), queued) == ["route qwen3-32b"]


def test_flow_control_knows_where_a_requests_context_is(loop):
    loop(RequestHeaders(session("parent")))
    loop(RequestBody(chat()))
    routed = loop.commands[-1].routed
    parent = routed.placement.worker
    assert (routed.arrival.session, routed.arrival.home) == (routed.turn.session_key, None)
    loop(ResponseHeaders(200))
    loop(ResponseBody(CHAT_CALL))
    loop(Closed())
    # Its next turn goes home; a sub-agent's first turn starts from its parent's context.
    for name, extra in (("parent", {}), ("child", {"x-parent-session-id": "parent"})):
        exchange = loop.new()
        loop(RequestHeaders(session(name, **extra)), exchange)
        loop(RequestBody(chat(result="call_1") if name == "parent" else chat()), exchange)
        arrival = loop.commands[-1].routed.arrival
        assert (arrival.home, arrival.pinned) == (parent, name == "parent")
        loop(ResponseHeaders(200), exchange)
        loop(Closed(), exchange)
