"""The exchange as tables: a request's events in, the commands it gives out, over the three APIs
and the three stream kinds (the routing stream, a gateway's full duplex stream, the observe
stream), with the holds and the lock lifecycle.

A small loop plays the adapter's part without I/O: it runs ``Parse`` and ``Load`` at once
against an in-process store and feeds their results back, applies ``Apply``, and writes every
command down in a short notation, so each table row reads as "this event, then these commands".
"""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from extproc.assembly import assemble
from extproc.core import exchange as ex
from extproc.core.bodies import LargeBodies
from extproc.core.exchange import (
    Closed,
    Observe,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    ResponseBody,
    ResponseHeaders,
    Woken,
)
from extproc.state.memory import MemoryStore

SESSION = {"x-session-id": "s", "authorization": "Bearer k"}
CHAT = {":method": "POST", ":path": "/v1/chat/completions", **SESSION}
RESPONSES = {":method": "POST", ":path": "/v1/responses", **SESSION}
MESSAGES = {":method": "POST", ":path": "/v1/messages", **SESSION}
TOOLS = [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}]


def chat(*, stream: bool = False, tools: bool = True, result: str | None = None) -> bytes:
    messages: list[dict] = [{"role": "user", "content": "refactor the parser"}]
    if result:
        messages += [{"role": "assistant", "tool_calls": [
            {"id": result, "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": result, "content": "ok"}]
    body: dict = {"model": "auto", "messages": messages, "stream": stream}
    if tools:
        body["tools"] = TOOLS
    return orjson.dumps(body)


def responses(previous: str | None = None) -> bytes:
    body: dict = {"model": "auto", "input": [{"role": "user", "content": "refactor it"}]}
    if previous:
        body["previous_response_id"] = previous
    return orjson.dumps(body)


def messages(result: str | None = None) -> bytes:
    turns: list[dict] = [{"role": "user", "content": "refactor the parser"}]
    if result:
        turns += [{"role": "assistant", "content": [
            {"type": "tool_use", "id": result, "name": "t", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": result,
                                          "content": "ok"}]}]
    return orjson.dumps({"model": "auto", "max_tokens": 64, "tools": [
        {"name": "t", "input_schema": {"type": "object"}}], "messages": turns})


CHAT_CALL = orjson.dumps({"choices": [{"message": {"tool_calls": [
    {"id": "call_1", "function": {"name": "t"}}]}, "finish_reason": "tool_calls"}]})
CHAT_TEXT = orjson.dumps({"choices": [{"message": {"content": "done"}, "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 30, "completion_tokens": 2,
                                    "prompt_tokens_details": {"cached_tokens": 16}}})
RESPONSE = orjson.dumps({"id": "resp_1", "output": [
    {"type": "message", "content": [{"type": "output_text", "text": "done"}]}]})
TOOL_USE = orjson.dumps({"content": [{"type": "tool_use", "id": "toolu_1", "name": "t",
                                      "input": {}}], "stop_reason": "tool_use"})


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


SSE_CALL = sse({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_s"}]}}]})


class Loop:
    """The adapter's part, without I/O: an in-process store and a transcript."""

    def __init__(self, config, clock, *, bodies: LargeBodies | None = None,
                 shared: bool = False) -> None:
        self.parts = assemble(config, clock=clock, shared=shared)
        self.store = MemoryStore.from_config(config, clock)
        self.clock = clock
        self.bodies = bodies
        self.exchange = self.new()

    def new(self) -> ex.Exchange:
        self.exchange = ex.Exchange(self.parts.router, self.parts.options, bodies=self.bodies)
        return self.exchange

    def __call__(self, event: ex.Event, exchange: ex.Exchange | None = None) -> list[str]:
        exchange = exchange or self.exchange
        out: list[str] = []
        self.commands: list[ex.Command] = []
        queue = exchange.handle(event)
        while queue:
            command = queue.pop(0)
            self.commands.append(command)
            out.append(note(command))
            if isinstance(command, ex.Parse):
                try:
                    queue[:0] = exchange.handle(ex.Parsed(command.job()))
                except ex.RoutingError as exc:
                    queue[:0] = exchange.handle(ex.Parsed(None, exc))
            elif isinstance(command, ex.Load):
                queue[:0] = exchange.handle(
                    ex.Loaded(self.store.load_now(command.query), command.early))
            elif isinstance(command, ex.Apply):
                self.store.apply_now(command.writes, self.clock())
        return out

    def play(self, steps: list[tuple[ex.Event, list[str]]]) -> None:
        for event, expected in steps:
            assert self(event) == expected, f"after {event!r}"


def note(command: ex.Command) -> str:
    """A command in a few words."""
    if isinstance(command, ex.Continue):
        flags = [f for f, on in (("skip", command.skip), ("read", command.read_body),
                                 ("path", command.path is not None)) if on]
        if command.remove:
            flags.append("remove=" + ",".join(sorted(command.remove)))
        return " ".join(["continue", command.phase.name.lower(), *flags])
    if isinstance(command, ex.Route):
        kind = "route duplex" if command.duplex else "route"
        return f"{kind} {command.routed.model}" + (" trailers" if command.trailers else "")
    if isinstance(command, ex.Chunk):
        return f"chunk {command.phase.name.lower()}" + (" end" if command.end else "")
    if isinstance(command, ex.Refuse):
        return f"refuse {command.error.status} {command.error.code}"
    if isinstance(command, ex.Apply):
        writes = ",".join(type(w).__name__.lower() for w in command.writes)
        return f"apply {writes} awaited" if command.wait else f"apply {writes}"
    if isinstance(command, ex.Hold):
        return f"hold {command.kind}"
    if isinstance(command, ex.Wake):
        return f"wake {command.kind}"
    if isinstance(command, ex.Load):
        return "load early" if command.early else "load"
    if isinstance(command, ex.Parse):
        return "parse offload" if command.offload else "parse"
    return type(command).__name__.lower()


@pytest.fixture
def loop(session_config, clock) -> Loop:
    return Loop(session_config, clock)


ROUTED = ["parse", "load", "route qwen3-32b"]

# -- the routing stream (buffered), the three APIs -------------------------------------------

BUFFERED = {
    "chat, a JSON answer with a tool call: read, its ids in the store before it passes": (
        CHAT, chat(), [
        (RequestHeaders(CHAT), ["continue request_headers"]),
        (RequestBody(chat()), ROUTED),
        (ResponseHeaders(200), ["continue response_headers read"]),
        (ResponseBody(CHAT_CALL), ["apply commit,finish,claim awaited",
                                   "continue response_body"]),
        (Closed(), []),
    ]),
    "chat without tools: committed at the status, the answer read for its usage": (
        CHAT, chat(tools=False), [
            (RequestHeaders(CHAT), ["continue request_headers"]),
            (RequestBody(chat(tools=False)), ROUTED),
            (ResponseHeaders(200), ["apply commit", "continue response_headers read"]),
            (ResponseBody(CHAT_TEXT), ["apply finish,claim", "continue response_body"]),
            (Closed(), []),
        ]),
    "chat, streamed: committed in the store before the client has a byte, the observe stream "
    "reads the rest": (
        CHAT, chat(stream=True), [
            (RequestHeaders(CHAT), ["continue request_headers"]),
            (RequestBody(chat(stream=True)), ROUTED),
            (ResponseHeaders(200, streamed=True), ["apply commit awaited",
                                                   "continue response_headers"]),
            (Closed(), []),
        ]),
    "responses: a response id is always owned": (RESPONSES, responses(), [
        (RequestHeaders(RESPONSES), ["continue request_headers"]),
        (RequestBody(responses()), ROUTED),
        (ResponseHeaders(200), ["continue response_headers read"]),
        (ResponseBody(RESPONSE), ["apply commit,finish,claim awaited",
                                  "continue response_body"]),
        (Closed(), []),
    ]),
    "messages, a tool use": (MESSAGES, messages(), [
        (RequestHeaders(MESSAGES), ["continue request_headers"]),
        (RequestBody(messages()), ROUTED),
        (ResponseHeaders(200), ["continue response_headers read"]),
        (ResponseBody(TOOL_USE), ["apply commit,finish,claim awaited",
                                  "continue response_body"]),
        (Closed(), []),
    ]),
    "a failed upstream: nothing committed, nothing read": (CHAT, chat(), [
        (RequestHeaders(CHAT), ["continue request_headers"]),
        (RequestBody(chat()), ROUTED),
        (ResponseHeaders(503), ["continue response_headers"]),
        (Closed(), []),
    ]),
    "the client hangs up before the body of the answer: its commit is still written": (
        CHAT, chat(), [
            (RequestHeaders(CHAT), ["continue request_headers"]),
            (RequestBody(chat()), ROUTED),
            (ResponseHeaders(200), ["continue response_headers read"]),
            (Closed(), ["apply commit"]),
        ]),
}


@pytest.mark.parametrize("case", list(BUFFERED))
def test_the_routing_stream(loop, case):
    _, _, steps = BUFFERED[case]
    loop.play(steps)


# After each event but the close: whether Envoy sends nothing more on the stream but its end
# (the loop reads that end where Envoy's reset cannot cancel the read).
CLOSING = {
    "chat, a JSON answer with a tool call": [False, False, False, True],
    "chat without tools": [False, False, False, True],
    "chat, streamed": [False, False, True],
    "responses": [False, False, False, True],
    "messages, a tool use": [False, False, False, True],
    "a failed upstream": [False, False, True],
    "the client hangs up before the body of the answer": [False, False, False],
}


@pytest.mark.parametrize("case", list(CLOSING))
def test_the_routing_stream_knows_when_only_its_end_is_left(loop, case):
    (name,) = [c for c in BUFFERED if c.startswith(case)]
    _, _, steps = BUFFERED[name]
    seen = []
    for event, _ in steps[:-1]:
        loop(event)
        seen.append(loop.exchange.closing)
    assert seen == CLOSING[case]


@pytest.mark.parametrize(("headers", "commands"), [
    ({":method": "GET", ":path": "/v1/models"}, ["continue request_headers skip"]),
    ({":method": "POST", ":path": "/v1/embeddings"}, ["continue request_headers skip"]),
    ({":method": "POST", ":path": "/V1/Chat/Completions/"}, ["continue request_headers path"]),
    ({":method": "POST", ":path": "/v1/files"}, ["refuse 404 path_not_found"]),
    ({":method": "POST", ":path": "/v1/completions"}, ["continue request_headers"]),
    ({":method": "GET", ":path": "/v1/responses/resp_1"},
     ["load", "continue request_headers skip"]),
    ({**CHAT, "x-saar-cluster": "evil", "x-gateway-destination-endpoint": "6.6.6.6:1"},
     ["continue request_headers remove=x-gateway-destination-endpoint,x-saar-cluster"]),
])
def test_request_headers(loop, headers, commands):
    assert loop(RequestHeaders(headers)) == commands


@pytest.mark.parametrize(("body", "commands"), [
    (b"{oops", ["parse", "refuse 400 malformed_request"]),
    (orjson.dumps({"model": "nope", "messages": [{}]}), ["parse", "refuse 404 model_not_found"]),
    (orjson.dumps({"messages": []}), ["parse", "refuse 400 missing_model"]),
])
def test_bad_bodies_are_refused_in_the_clients_format(loop, body, commands):
    loop(RequestHeaders(CHAT))
    assert loop(RequestBody(body)) == commands
    assert loop.exchange.style == "openai"


def test_a_request_without_a_body_is_refused(loop):
    assert loop(RequestHeaders(CHAT, end=True)) == ["refuse 400 malformed_request"]


# -- the lock lifecycle ----------------------------------------------------------------------

LOCKS = {
    "chat: the tool result goes to the model that issued the call": (
        CHAT, chat(), CHAT_CALL, chat(result="call_1"), "tool_loop"),
    "messages: the tool result goes to the model that issued the tool use": (
        MESSAGES, messages(), TOOL_USE, messages(result="toolu_1"), "tool_loop"),
    "responses: previous_response_id goes to its issuer": (
        RESPONSES, responses(), RESPONSE, responses(previous="resp_1"), "provider_state"),
}


@pytest.mark.parametrize("case", list(LOCKS))
def test_a_lock_holds_on_the_next_turn(loop, case):
    headers, first, answer, then, lock = LOCKS[case]
    loop.play([(RequestHeaders(headers), ["continue request_headers"]),
               (RequestBody(first), ROUTED), (ResponseHeaders(200), [
                   "continue response_headers read"]),
               (ResponseBody(answer), ["apply commit,finish,claim awaited",
                                       "continue response_body"]),
               (Closed(), [])])
    follow = loop.new()
    loop(RequestHeaders(headers))
    assert loop(RequestBody(then)) == ROUTED
    routed = follow._routed
    assert routed is not None and routed.locked
    record = loop.parts.replay.get(routed.replay_id)
    assert (record["lock"], record["action"]) == (lock, "locked_keep")


def test_a_locked_request_whose_model_is_out_waits_then_is_refused_with_its_record(
        session_config, clock):
    config = replace(session_config, health=replace(session_config.health, failure_threshold=1,
                                                    locked_hold_seconds=2))
    loop = Loop(config, clock)
    loop.play([(RequestHeaders(CHAT), ["continue request_headers"]),
               (RequestBody(chat()), ROUTED),
               (ResponseHeaders(200), ["continue response_headers read"]),
               (ResponseBody(CHAT_CALL), ["apply commit,finish,claim awaited",
                                          "continue response_body"]),
               (Closed(), [])])
    loop.parts.health.record("qwen3-32b", 503)
    loop.new()
    loop(RequestHeaders(CHAT))
    assert loop(RequestBody(chat(result="call_1"))) == ["parse", "load", "hold locked"]
    assert loop(Woken("locked", late=True)) == ["refuse 503 model_unavailable"]
    refusal = loop.commands[-1]
    assert isinstance(refusal, ex.Refuse) and refusal.error.replay_id is not None
    record = loop.parts.replay.get(refusal.error.replay_id)
    assert record["outcome"]["refused"] == "model_unavailable" and record["lock"] == "tool_loop"


def test_a_locked_request_goes_on_when_its_model_is_back(session_config, clock):
    config = replace(session_config, health=replace(session_config.health, failure_threshold=1,
                                                    cooldown_seconds=5))
    loop = Loop(config, clock)
    loop(RequestHeaders(CHAT))
    loop(RequestBody(chat()))
    loop(ResponseHeaders(200))
    loop(ResponseBody(CHAT_CALL))
    loop(Closed())
    loop.parts.health.record("qwen3-32b", 503)
    loop.new()
    loop(RequestHeaders(CHAT))
    assert loop(RequestBody(chat(result="call_1")))[-1] == "hold locked"
    clock.advance(6)  # the cool-down is over: the hold's due time comes
    assert loop(Woken("locked")) == ["route qwen3-32b"]


# -- settling: a request whose issuer's write may still be on its way ------------------------


def test_without_a_shared_store_or_a_streamed_answer_in_flight_nobody_waits(loop):
    loop(RequestHeaders(CHAT))
    parse, load, route = loop(RequestBody(chat(result="call_unknown")))
    assert (parse, load, route.split()[0]) == ("parse", "load", "route")


def test_a_tool_result_racing_its_streamed_answers_claim_settles_until_the_claim(loop):
    """The observe stream's claim is handled after the tool result arrives: the request
    waits for the claim (woken by it), then goes to the issuer."""
    routing = loop.exchange
    loop(RequestHeaders(CHAT))
    loop(RequestBody(chat(stream=True)))
    loop(ResponseHeaders(200, streamed=True))
    early = loop.new()
    loop(RequestHeaders(CHAT), early)
    assert loop(RequestBody(chat(result="call_s")), early) == ["parse", "load", "hold settle"]
    observer = loop.new()
    routed = routing._routed
    assert routed is not None
    assert loop(Observe(routed.turn, routed.api), observer) == []
    assert loop(ResponseBody(SSE_CALL), observer) == ["apply claim,finish", "done"]
    assert loop(Woken("settle"), early) == ["load", "route qwen3-32b"]
    assert early._routed is not None and early._routed.locked
    loop(Closed(), routing)


def test_with_a_shared_store_an_unknown_issuer_is_looked_for_then_given_up(
        session_config, clock):
    loop = Loop(session_config, clock, shared=True)
    loop(RequestHeaders(CHAT))
    assert loop(RequestBody(chat(result="call_elsewhere"))) == ["parse", "load", "hold settle"]
    assert loop(Woken("settle")) == ["load", "hold settle"]  # looked again: not there yet
    load, route = loop(Woken("settle", late=True))
    assert (load, route.split()[0]) == ("load", "route")


def test_ids_waited_for_in_vain_are_not_waited_for_again(session_config, clock):
    """A client's own ids (or a retry of a request already given up on) route at once; a
    newer unknown id is waited for again."""
    loop = Loop(session_config, clock, shared=True)
    loop(RequestHeaders(CHAT))
    assert loop(RequestBody(chat(result="call_foreign"))) == ["parse", "load", "hold settle"]
    assert loop(Woken("settle", late=True))[-1].split()[0] == "route"
    loop(ResponseHeaders(200))
    loop(ResponseBody(orjson.dumps({"choices": [{"message": {"content": "ok"}}]})))
    loop(Closed())
    loop.new()
    loop(RequestHeaders(CHAT))
    assert [c.split()[0] for c in loop(RequestBody(chat(result="call_foreign")))] == [
        "parse", "load", "route"]
    loop(Closed())
    loop.new()
    loop(RequestHeaders(CHAT))
    assert loop(RequestBody(chat(result="call_newer"))) == ["parse", "load", "hold settle"]


def test_a_request_naming_no_session_does_not_wait_again_for_ids_given_up_on(
        session_config, clock):
    """No session header: the request follows its tool call's id, which no store knows; once
    given up on, its conversation's session remembers it and the same ids route at once."""
    loop = Loop(session_config, clock, shared=True)
    anonymous = {":method": "POST", ":path": "/v1/chat/completions",
                 "authorization": "Bearer k"}
    loop(RequestHeaders(anonymous))
    assert loop(RequestBody(chat(result="call_foreign"))) == ["parse", "load", "hold settle"]
    assert loop(Woken("settle", late=True))[-1].split()[0] == "route"
    loop(ResponseHeaders(200))
    loop(ResponseBody(orjson.dumps({"choices": [{"message": {"content": "ok"}}]})))
    loop(Closed())
    loop.new()
    loop(RequestHeaders(anonymous))
    assert [c.split()[0] for c in loop(RequestBody(chat(result="call_foreign")))] == [
        "parse", "load", "route"]


def test_with_a_shared_store_the_session_is_loaded_early(session_config, clock):
    loop = Loop(session_config, clock, shared=True)
    assert loop(RequestHeaders(CHAT)) == ["load early", "continue request_headers"]
    # The early facts cover a request continuing nothing: no second load.
    assert loop(RequestBody(chat())) == ["parse", "route qwen3-32b"]


# -- admission's pause -----------------------------------------------------------------------


def test_a_paused_session_is_held_then_admitted(loop):
    loop.parts.pools.admission.is_paused = lambda key: key is not None  # type: ignore
    loop(RequestHeaders(CHAT))
    assert loop(RequestBody(chat())) == ["parse", "load", "hold paused"]
    assert loop(Woken("paused", late=True)) == ["route qwen3-32b"]  # admitted after the wait


# -- large bodies ----------------------------------------------------------------------------


def test_large_bodies_wait_their_turn_and_wake_the_next(session_config, clock):
    bodies = LargeBodies(100, per_tenant=1, wait_seconds=5)
    loop = Loop(session_config, clock, bodies=bodies)
    large = {**CHAT, "content-length": "500"}
    first, second = loop.exchange, loop.new()
    assert loop(RequestHeaders(large), first) == ["continue request_headers"]
    assert loop(RequestHeaders(large), second) == ["hold large_body"]
    # The first body is parsed: its slot goes to the one waiting, woken by name.
    assert loop(RequestBody(chat()), first) == ["parse", "wake large_body", "load",
                                                "route qwen3-32b"]
    assert loop(Woken("large_body"), second) == ["continue request_headers"]
    assert loop(RequestBody(chat()), second) == ["parse", "load", "route qwen3-32b"]


def test_a_large_body_that_waited_too_long_is_429(session_config, clock):
    bodies = LargeBodies(100, per_tenant=1, wait_seconds=5)
    loop = Loop(session_config, clock, bodies=bodies)
    large = {**CHAT, "content-length": "500"}
    loop(RequestHeaders(large))
    second = loop.new()
    assert loop(RequestHeaders(large), second) == ["hold large_body"]
    assert loop(Woken("large_body", late=True), second) == ["refuse 429 tenant_busy"]


# -- a gateway's endpoint picker: full duplex ------------------------------------------------


def test_full_duplex_answers_the_headers_once_routed_and_passes_the_answer_back(loop):
    loop.play([
        (RequestHeaders(CHAT, duplex=True, duplex_response=True), []),
        (RequestBody(chat()[:10], end=False), []),
        (RequestBody(chat()[10:]), ["parse", "load", "route duplex qwen3-32b"]),
        (ResponseHeaders(200), ["continue response_headers"]),
        (ResponseBody(CHAT_CALL[:10], end=False), ["chunk response_body"]),
        (ResponseBody(CHAT_CALL[10:]), ["apply commit,finish,claim awaited",
                                        "chunk response_body end"]),
        (Closed(), []),
    ])


def test_a_full_duplex_stream_is_never_read_as_closing(loop):
    """Its answer's chunks come on it, and Envoy may send trailers after them."""
    seen = []
    for event in (RequestHeaders(CHAT, duplex=True, duplex_response=True), RequestBody(chat()),
                  ResponseHeaders(200), ResponseBody(CHAT_CALL)):
        loop(event)
        seen.append(loop.exchange.closing)
    assert seen == [False] * 4


def test_full_duplex_trailers_end_the_body(loop):
    loop.play([
        (RequestHeaders(CHAT, duplex=True, duplex_response=True), []),
        (RequestBody(chat(), end=False), []),
        (RequestTrailers(), ["parse", "load", "route duplex qwen3-32b trailers"]),
    ])


def test_full_duplex_claims_each_streamed_id_in_the_store_before_its_chunk_passes(loop):
    """The chunk that carries a tool call's id reaches the client only after the shared
    store has its owner: the continuation, whichever replica gets it, finds the issuer."""
    loop.play([
        (RequestHeaders(CHAT, duplex=True, duplex_response=True), []),
        (RequestBody(chat(stream=True)), ["parse", "load", "route duplex qwen3-32b"]),
        (ResponseHeaders(200, streamed=True), ["apply commit awaited",
                                               "continue response_headers"]),
        (ResponseBody(SSE_CALL[:40], end=False), ["chunk response_body"]),
        (ResponseBody(SSE_CALL[40:], end=False), ["apply claim,finish awaited",
                                                  "chunk response_body"]),
        (ResponseBody(b""), ["chunk response_body end"]),
    ])


def test_full_duplex_traffic_that_is_no_api_call_passes_chunk_by_chunk(loop):
    loop.play([
        (RequestHeaders({":method": "POST", ":path": "/v1/embeddings"}, duplex=True),
         ["continue request_headers"]),
        (RequestBody(b"abc", end=False), ["chunk request_body"]),
    ])


# -- the observe stream ----------------------------------------------------------------------


def test_the_observe_stream_claims_as_ids_pass_and_finishes_the_turn(loop):
    routing = loop.exchange
    loop(RequestHeaders(CHAT))
    loop(RequestBody(chat(stream=True)))
    routed = routing._routed
    assert routed is not None
    observer = loop.new()
    half = len(SSE_CALL) // 2
    loop.play([
        (Observe(routed.turn, routed.api), []),
        (ResponseBody(SSE_CALL[:half], end=False), []),
        (ResponseBody(SSE_CALL[half:], end=False), ["apply claim,finish", "done"]),
    ])
    assert observer.stage is ex.Stage.DONE
    assert not observer.closing  # an observe stream ends itself ("done")


def test_a_streamed_answers_first_chunk_is_timed_once(loop, clock):
    """The record's outcome gets ``first_chunk_ms`` (time to first token) from the first
    chunk that carries an event, measured from the decision; later chunks leave it."""
    loop(RequestHeaders(CHAT))
    loop(RequestBody(chat(stream=True)))
    routed = loop.exchange._routed
    assert routed is not None
    loop.new()
    loop(Observe(routed.turn, routed.api))
    clock.advance(0.25)
    loop(ResponseBody(b"", end=False))  # an empty chunk is no token
    clock.advance(0.125)
    half = len(SSE_CALL) // 2
    loop(ResponseBody(SSE_CALL[:half], end=False))
    clock.advance(1.0)
    loop(ResponseBody(SSE_CALL[half:], end=False))
    outcome = loop.parts.replay.get(routed.replay_id)["outcome"]
    assert outcome["first_chunk_ms"] == 375.0


def test_an_observe_stream_cut_short_finishes_with_what_it_saw(loop):
    routing = loop.exchange
    loop(RequestHeaders(CHAT))
    loop(RequestBody(chat(stream=True)))
    routed = routing._routed
    assert routed is not None
    loop.new()
    partial = b'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c9"}]}}]}\n\n'
    loop.play([(Observe(routed.turn, routed.api), []),
               (ResponseBody(partial, end=False), ["apply claim"]),
               (Closed(), ["apply finish"])])


def test_an_observe_stream_without_a_turn_ends_at_once(loop):
    assert loop(Observe(None, None)) == ["done"]


def test_a_sessions_final_request_forgets_it(loop):
    final = {**CHAT, "x-dynamo-session-final": "true"}
    loop(RequestHeaders(final))
    loop(RequestBody(chat(tools=False)))
    assert loop(ResponseHeaders(200)) == ["apply commit", "continue response_headers read"]
    assert loop(Closed()) == ["apply forget"]
    assert len(loop.store) == 0


# -- what the answer carried, in its record --------------------------------------------------

ENGINE_USAGE = {"prompt_tokens": 30, "completion_tokens": 2, "cached_tokens": 16,
                "source": "engine"}
CHAT_CALL_USED = orjson.dumps({**orjson.loads(CHAT_CALL), "usage": orjson.loads(CHAT_TEXT)[
    "usage"]})
RESPONSE_USED = orjson.dumps({**orjson.loads(RESPONSE), "status": "completed", "usage": {
    "input_tokens": 30, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 16}}})
TOOL_USE_USED = orjson.dumps({**orjson.loads(TOOL_USE), "usage": {
    "input_tokens": 14, "cache_read_input_tokens": 16, "output_tokens": 2}})
ANSWERED = {
    "chat without tools": (CHAT, chat(tools=False), CHAT_TEXT, "stop"),
    "chat, a tool call": (CHAT, chat(), CHAT_CALL_USED, "tool_calls"),
    "responses": (RESPONSES, responses(), RESPONSE_USED, "completed"),
    "messages": (MESSAGES, messages(), TOOL_USE_USED, "tool_use"),
}


def outcome(loop: Loop, replay_id: str) -> dict:
    return loop.parts.replay.get(replay_id).get("outcome") or {}


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full duplex"])
@pytest.mark.parametrize("case", list(ANSWERED))
def test_a_json_answers_usage_is_recorded_before_the_client_gets_it(loop, case, duplex):
    """A client may look its answer up by ``x-replay-id`` the moment it has it (a fast
    upstream answers in a few ms): what the answer carried is recorded as its body passes the
    processor, before the reply lets Envoy send it on, not when the stream ends later."""
    headers, body, answer, finish = ANSWERED[case]
    loop(RequestHeaders(headers, duplex=duplex, duplex_response=duplex))
    loop(RequestBody(body))
    routed = loop.exchange._routed
    assert routed is not None
    loop(ResponseHeaders(200))
    passed = loop(ResponseBody(answer))
    assert passed[-1] == ("chunk response_body end" if duplex else "continue response_body")
    recorded = outcome(loop, routed.replay_id)
    assert (recorded.get("usage"), recorded.get("finish_reason")) == (ENGINE_USAGE, finish)
    loop(Closed())
    recorded = outcome(loop, routed.replay_id)
    assert (recorded["usage"], recorded["finish_reason"]) == (ENGINE_USAGE, finish)
    assert "latency_ms" in recorded


WORDS = sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"delta": {"content": "Hello"}}]},
            {"choices": [{"delta": {"content": " world"}, "finish_reason": "stop"}]})
USAGE_CHUNK = orjson.dumps({"choices": [], "usage": {
    "prompt_tokens": 30, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16}}})


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_streamed_answer_without_usage_is_recorded_with_an_estimate(loop, include_usage):
    """Without ``stream_options.include_usage`` the engine sends no usage, and the client's
    stream is left as it asked for it: the record gets the router's estimate, marked (the
    prompt as the router counted it, 11 characters generated as 3 tokens, the cache
    unknown); the session's memory keeps only what an engine reported."""
    loop(RequestHeaders(CHAT))
    loop(RequestBody(chat(stream=True, tools=False)))
    routed = loop.exchange._routed
    assert routed is not None
    loop(ResponseHeaders(200, streamed=True))
    loop.new()
    loop(Observe(routed.turn, routed.api))
    stream = WORDS[:-len(b"data: [DONE]\n\n")] + b"data: " + USAGE_CHUNK + b"\n\n" + (
        b"data: [DONE]\n\n") if include_usage else WORDS
    assert loop(ResponseBody(stream, end=False))[-1] == "done"
    recorded = outcome(loop, routed.replay_id)
    assert recorded["finish_reason"] == "stop"
    memory = loop.store.record(routed.turn.session_key)
    assert memory is not None
    if include_usage:
        assert recorded["usage"] == ENGINE_USAGE
        assert memory.reported_prompt_tokens == 30
    else:
        assert recorded["usage"] == {
            "prompt_tokens": routed.turn.context_tokens, "completion_tokens": 3,
            "cached_tokens": None, "source": "estimated"}
        assert routed.turn.context_tokens > 0
        assert memory.reported_prompt_tokens == 0
