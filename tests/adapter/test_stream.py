"""The ext_proc adapter fed protobuf messages directly, as Envoy would send them."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import replace

import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.adapter.stream import process
from extproc.assembly import assemble

from .support import (
    BODY,
    CHAT,
    STREAMED,
    TOOLS,
    WITH_TOOLS,
    Driver,
    Replica,
    body_msg,
    headers_msg,
    response_body,
    response_headers,
    saar_metadata,
    set_headers,
    two_workers,
)


@pytest.fixture
def replica(config, clock) -> Replica:
    return Replica(assemble(config, clock=clock))


async def test_routes_rewrites_and_emits_metadata(replica):
    stream = replica.stream()
    spoofed = {**CHAT, "x-saar-cluster": "evil", "x-gateway-destination-endpoint": "1.2.3.4:80",
               "x-saar-selected-model": "fake"}
    first = await stream.handle(headers_msg(spoofed))
    removed = set(first.request_headers.response.header_mutation.remove_headers)
    assert removed == {"x-saar-cluster", "x-gateway-destination-endpoint", "x-saar-selected-model"}
    assert first.request_headers.response.clear_route_cache
    reply = await stream.handle(body_msg(BODY))
    common = reply.request_body.response
    body = common.body_mutation.body
    assert orjson.loads(body)["model"] == "qwen3-32b"
    assert set_headers(common) == {"x-saar-cluster": "qwen3-32b", "content-length": str(len(body)),
                                   "x-gateway-model-name": "qwen3-32b"}
    assert common.clear_route_cache
    meta = reply.dynamic_metadata.fields["saar"].struct_value.fields
    assert meta["selected_model"].string_value == "qwen3-32b"
    assert meta["replay_id"].string_value.startswith("rp-")
    assert meta["action"].string_value == "new"
    assert "turn" not in meta  # only a streamed request needs the turn on the observe stream
    assert replica.router.metrics.stripped_headers.labels("x-saar-cluster")._value.get() == 1


async def test_non_llm_path_skips_the_body_phase(replica):
    reply = await replica.stream().handle(headers_msg({":method": "GET", ":path": "/v1/models"}))
    assert reply.HasField("mode_override")
    assert reply.mode_override.request_body_mode == 0  # NONE


@pytest.mark.parametrize(
    ("path", "body", "status", "style_key"),
    [
        ("/v1/chat/completions", b"{oops", 400, "error"),
        ("/v1/messages", b"{oops", 400, "type"),
        ("/v1/chat/completions", orjson.dumps({"model": "nope", "messages": [{}]}), 404, "error"),
        ("/v1/chat/completions", orjson.dumps({"messages": []}), 400, "error"),
    ],
)
async def test_errors_answer_in_the_clients_format(replica, path, body, status, style_key):
    stream = replica.stream()
    await stream.handle(headers_msg({":method": "POST", ":path": path}))
    reply = await stream.handle(body_msg(body))
    immediate = reply.immediate_response
    assert immediate.status.code == status
    payload = orjson.loads(immediate.body)
    assert style_key in payload
    if path == "/v1/messages":
        assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"


async def test_empty_body_on_llm_path_is_400(replica):
    reply = await replica.stream().handle(headers_msg(CHAT, end=True))
    assert reply.immediate_response.status.code == 400


async def test_oversized_body_is_413(config, clock):
    small = replace(config, limits=replace(config.limits, max_body_bytes=64))
    stream = Replica(assemble(small, clock=clock)).stream()
    await stream.handle(headers_msg(CHAT))
    assert (await stream.handle(body_msg(BODY))).immediate_response.status.code == 413


async def routed_stream(replica: Replica, body: bytes = WITH_TOOLS) -> tuple[Driver, dict]:
    stream = replica.stream()
    await stream.handle(headers_msg(CHAT))
    reply = await stream.handle(body_msg(body))
    return stream, reply.dynamic_metadata.fields["saar"].struct_value.fields


TOOL_CALL = orjson.dumps({"model": "qwen3-32b", "choices": [{"message": {"tool_calls": [
    {"id": "call_9", "function": {"name": "t"}}]}, "finish_reason": "tool_calls"}]})


async def test_json_answer_commits_with_its_ids_before_the_client_reads_it(replica):
    stream, meta = await routed_stream(replica)
    replay_id = meta["replay_id"].string_value
    reply = await stream.handle(response_headers("200", "application/json"))
    # The JSON body is asked for, buffered; the commit waits for it and goes in one write.
    assert reply.mode_override.response_body_mode == 2  # BUFFERED
    assert replica.session(replay_id) is None
    reply = await stream.handle(response_body(TOOL_CALL))
    assert reply.HasField("response_body")
    record = replica.session(replay_id)
    assert (record.model, record.phase.value, record.turns) == ("qwen3-32b", "tool_loop", 1)
    assert replica.owner(replay_id, "call_9").model == "qwen3-32b"
    stream.close()
    outcome = replica.replay.get(replay_id)["outcome"]
    assert (outcome["status"], outcome["finish_reason"]) == (200, "tool_calls")


async def test_an_answer_that_cannot_carry_ids_commits_at_its_headers_and_is_read(replica):
    """No tools offered, a Chat request: nothing in the answer can bind the session, so the
    turn commits with the status; its body is still asked for, and what it carried (usage,
    finish reason) is in the record before the reply lets Envoy pass it to the client, who
    may look it up at once (the stream's end comes after)."""
    stream, meta = await routed_stream(replica, BODY)
    replay_id = meta["replay_id"].string_value
    reply = await stream.handle(response_headers("200", "application/json"))
    assert reply.mode_override.response_body_mode == 2  # BUFFERED
    record = replica.session(replay_id)
    assert (record.model, record.turns, record.worker) == ("qwen3-32b", 1, None)
    answer = orjson.dumps({"choices": [{"message": {"content": "done"}, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 9, "completion_tokens": 1}})
    reply = await stream.handle(response_body(answer))
    assert reply.HasField("response_body")
    outcome = replica.replay.get(replay_id)["outcome"]
    assert (outcome["status"], outcome["finish_reason"], outcome["usage"]) == (
        200, "stop", {"prompt_tokens": 9, "completion_tokens": 1, "cached_tokens": 0,
                      "source": "engine"})
    stream.close()
    assert "latency_ms" in replica.replay.get(replay_id)["outcome"]


async def test_failed_upstream_does_not_commit_nor_read_the_body(replica):
    stream, _ = await routed_stream(replica)
    reply = await stream.handle(response_headers("503", "application/json"))
    assert not reply.HasField("mode_override")
    stream.close()
    assert len(replica.state.local) == 0


async def observe(
    replica: Replica, meta, chunks: list[bytes], end: bool = True
) -> Driver:
    """The observe filter's stream: the forwarded metadata on every message,
    observability_mode on all but the end-of-stream one (as Envoy sends it)."""
    stream = replica.stream()
    for i, chunk in enumerate(chunks):
        last = end and i == len(chunks) - 1
        msg = ep.ProcessingRequest(observability_mode=i == 0 or not last)
        msg.metadata_context.filter_metadata["saar"].update(
            {key: value.string_value for key, value in meta.items()})
        msg.response_body.CopyFrom(ep.HttpBody(body=chunk, end_of_stream=last))
        assert await stream.handle(msg) is None
    return stream


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


CALL_CHUNK = {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_s"}]}}]}


async def test_streamed_answer_is_observed_without_holding_it(replica):
    stream, meta = await routed_stream(replica, STREAMED)
    replay_id = meta["replay_id"].string_value
    reply = await stream.handle(response_headers("200", "text/event-stream"))
    assert not reply.HasField("mode_override")  # no body on the blocking stream
    assert replica.session(replay_id).turns == 1  # committed before the client sees a byte
    data = sse(CALL_CHUNK)
    observer = await observe(replica, meta, [data[:20], data[20:], b""])
    # Once the response is understood the processor ends the stream itself.
    assert observer.observed
    assert replica.owner(replay_id, "call_s").model == "qwen3-32b"
    assert replica.session(replay_id).phase.value == "tool_loop"


async def test_a_tool_call_id_is_claimed_the_moment_it_passes(replica):
    _, meta = await routed_stream(replica, STREAMED)
    replay_id = meta["replay_id"].string_value
    chunk = b"data: " + orjson.dumps(CALL_CHUNK) + b"\n\n"
    observer = await observe(replica, meta, [chunk], end=False)
    assert not observer.observed  # the stream goes on...
    assert replica.owner(replay_id, "call_s").model == "qwen3-32b"  # ...the id is owned already


async def test_the_observer_commits_when_it_finishes_before_the_status_arrives(replica):
    """Order-independent commit: the observe stream's terminal event may be handled before the
    routing stream's response headers (the 1% lock loss of streamed tool loops)."""
    stream, meta = await routed_stream(replica, STREAMED)
    replay_id = meta["replay_id"].string_value
    await observe(replica, meta, [sse(CALL_CHUNK), b""])
    record = replica.session(replay_id)
    assert (record.turns, record.phase.value) == (1, "tool_loop")
    await stream.handle(response_headers("200", "text/event-stream"))
    stream.close()
    assert replica.session(replay_id).turns == 1  # the late commit lands once


async def test_a_streamed_turn_completes_on_another_replica(config, clock, replica):
    """Two processors, one store: the observe stream reaches the replica that did not route."""
    other = Replica(assemble(config, clock=clock), replica.state)
    _, meta = await routed_stream(replica, STREAMED)
    replay_id = meta["replay_id"].string_value
    await observe(other, meta, [sse(CALL_CHUNK), b""])
    assert replica.owner(replay_id, "call_s").model == "qwen3-32b"
    assert replica.session(replay_id).phase.value == "tool_loop"


async def test_a_failed_streamed_request_is_not_committed_by_the_observer(replica):
    _, meta = await routed_stream(replica, STREAMED)
    error = orjson.dumps({"error": {"message": "overloaded", "type": "server_error"}})
    await observe(replica, meta, [error, b""])
    assert len(replica.state.local) == 0


async def test_stream_cut_short_still_closes_the_turn(replica):
    stream, meta = await routed_stream(replica, STREAMED)
    replay_id = meta["replay_id"].string_value
    await stream.handle(response_headers("200", "text/event-stream"))
    observer = await observe(replica, meta, [b"data: {\"choices\": []}\n\n"], end=False)
    assert not observer.observed
    observer.close()
    stream.close()
    assert replica.replay.get(replay_id)["outcome"]["status"] == 200


async def test_a_client_that_hangs_up_before_the_answer_leaves_nothing_behind(config, clock):
    replica = Replica(assemble(two_workers(config), clock=clock))
    stream, meta = await routed_stream(replica)
    replay_id = meta["replay_id"].string_value
    picked = replica.replay.get(replay_id)["worker"]["picked"]
    pool = replica.parts.pools.registry.pool("qwen3-32b")
    assert next(w for w in pool if w.address == picked).in_flight == 1
    stream.close()  # Envoy ends the stream: no response headers ever came
    assert next(w for w in pool if w.address == picked).in_flight == 0
    assert replica.replay.get(replay_id)["outcome"]["aborted"] is True
    assert len(replica.state.local) == 0


class EnvoySide:
    """Envoy's end of one stream, as the handler's request iterator: messages put in one by
    one (None: the half-close); counts the reads that were cancelled while they waited."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[ep.ProcessingRequest | None] = asyncio.Queue()
        self.cancelled_reads = 0

    def __aiter__(self) -> EnvoySide:
        return self

    async def __anext__(self) -> ep.ProcessingRequest:
        try:
            message = await self.queue.get()
        except asyncio.CancelledError:
            self.cancelled_reads += 1
            raise
        if message is None:
            raise StopAsyncIteration
        return message


async def reset_after(replica: Replica, messages: list[ep.ProcessingRequest]) -> EnvoySide:
    """The handler's loop fed ``messages``; once each is answered, Envoy resets the stream
    (gRPC cancels the handler) while the handler waits to read the next."""
    envoy, replies = EnvoySide(), []
    driver = replica.stream()

    async def handler() -> None:
        async for reply in process(driver.stream, envoy, replica.parts.metrics):
            replies.append(reply)

    task = asyncio.create_task(handler())
    for message in messages:
        envoy.queue.put_nowait(message)
    for _ in range(200):
        await asyncio.sleep(0)
        if len(replies) == len(messages):
            break
    assert len(replies) == len(messages)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return envoy


async def test_the_read_envoys_reset_lands_on_is_not_cancelled(replica):
    """Once the answer's headers are answered and nothing but the stream's end is left, the
    reset does not cancel the read waiting for that end (grpc.aio leaks a read cancelled
    mid-batch); the handler itself still ends, and the turn with it."""
    envoy = await reset_after(replica, [headers_msg(CHAT), body_msg(BODY),
                                        response_headers("200", "application/json"),
                                        response_body(b'{"choices": []}')])
    assert envoy.cancelled_reads == 0
    loop, reported = asyncio.get_running_loop(), []
    loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
    envoy.queue.put_nowait(None)  # the half-close still reaches the read, which ends
    for _ in range(20):
        await asyncio.sleep(0)
    gc.collect()  # a task whose end nobody took is reported when it is freed
    loop.set_exception_handler(None)
    assert envoy.queue.empty() and envoy.cancelled_reads == 0
    assert reported == []  # the read's end is taken, not logged once a request
    pool = replica.parts.pools.registry.pool("qwen3-32b")
    assert [w.in_flight for w in pool] == [0]


@pytest.mark.parametrize("answer", [
    [],  # no answer yet: the client hung up
    [response_headers("200", "application/json")],  # the JSON answer's body is still to come
], ids=["before the answer", "before the answer's body"])
async def test_a_read_that_waits_for_more_than_the_end_is_cancelled_by_the_reset(replica, answer):
    envoy = await reset_after(replica, [headers_msg(CHAT), body_msg(WITH_TOOLS), *answer])
    assert envoy.cancelled_reads == 1


def subset_headers_msg(subset: list[str] | str) -> ep.ProcessingRequest:
    msg = headers_msg(CHAT)
    msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].update(
        {"x-gateway-destination-endpoint-subset": subset})
    return msg


@pytest.mark.parametrize("hint", [["10.0.0.2:80"], "10.0.0.2:80, 10.9.9.9:80"])
async def test_the_proxys_subset_hint_limits_the_pick(config, clock, hint):
    stream = Replica(assemble(two_workers(config), clock=clock)).stream()
    await stream.handle(subset_headers_msg(hint))
    reply = await stream.handle(body_msg(BODY))
    assert set_headers(reply.request_body.response)["x-gateway-destination-endpoint"] == (
        "10.0.0.2:80")
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.2:80"


async def test_an_empty_subset_is_503(config, clock):
    stream = Replica(assemble(two_workers(config), clock=clock)).stream()
    await stream.handle(subset_headers_msg(["10.9.9.9:80"]))
    reply = await stream.handle(body_msg(BODY))
    assert reply.immediate_response.status.code == 503
    assert orjson.loads(reply.immediate_response.body)["error"]["code"] == "model_unavailable"


async def test_the_served_worker_is_learnt_from_envoys_attribute(config, clock):
    replica = Replica(assemble(two_workers(config), clock=clock))
    long = orjson.dumps({"model": "auto", "tools": TOOLS, "messages": [
        {"role": "user", "content": "please refactor " + "the module " * 100}]})
    stream, meta = await routed_stream(replica, long)
    replay_id = meta["replay_id"].string_value
    picked = replica.replay.get(replay_id)["worker"]["picked"]
    other = next(a for a in ("10.0.0.1:80", "10.0.0.2:80") if a != picked)
    headers = response_headers("200", "application/json")
    headers.attributes["envoy.filters.http.ext_proc"].update({"upstream.address": other})
    await stream.handle(headers)
    await stream.handle(response_body(b"{}"))
    assert replica.replay.get(replay_id)["outcome"]["served_worker"] == other
    # The session is bound to where it really went, and the prefix index learnt it too.
    assert replica.session(replay_id).worker == other
    index = replica.parts.pools.index
    assert index.held(other) == index.held(picked) > 10


@pytest.mark.parametrize(("rendered", "diagnostics"), [(False, True), (True, False)])
async def test_diagnostic_headers_go_with_the_answer_unless_envoy_renders_them(
        config, clock, rendered, diagnostics):
    """A gateway's filter gets the diagnostics as response headers; the filter of a bootstrap
    we render says that its Envoy adds them from the metadata, so they are not sent twice.
    The pick is sent either way: no Envoy renders it."""
    stream = Replica(assemble(two_workers(config), clock=clock)).stream(rendered=rendered)
    await stream.handle(headers_msg(CHAT))
    routed = await stream.handle(body_msg(BODY))
    meta = saar_metadata(routed)
    reply = await stream.handle(response_headers("200", "application/json"))
    shown = set_headers(reply.response_headers.response)
    assert shown.pop("x-saar-endpoint") == set_headers(routed.request_body.response)[
        "x-gateway-destination-endpoint"]
    if diagnostics:
        assert shown == {"x-replay-id": meta["replay_id"],
                         "x-saar-selected-model": meta["selected_model"],
                         "x-saar-decision": meta["decision"],
                         "x-saar-session-phase": meta["session_phase"],
                         "x-saar-action": meta["action"],
                         "x-saar-confidence": meta["confidence"],
                         "x-saar-context-tokens": meta["context_tokens"]}
    else:
        assert shown == {}
