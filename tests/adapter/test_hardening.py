"""Issue 9 in the adapter, fed protobuf messages as Envoy sends them: path variants and unknown
paths (item 13), the marker on the processor's own errors (14), a locked session's model down
— held, then refused with its replay id — and retries pinned to the issuer (15), large bodies
bounded per tenant and parsed off the event loop (6)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.adapter.contract import MODEL_RETRIES
from extproc.adapter.gate import ParseThread
from extproc.assembly import assemble
from extproc.core.bodies import LargeBodies

from .support import (
    BODY,
    CHAT,
    WITH_TOOLS,
    Driver,
    Replica,
    body_msg,
    headers_msg,
    immediate,
    response_body,
    response_headers,
    saar_metadata,
    set_headers,
    two_workers,
)
from .test_stream import replica

__all__ = ["replica"]  # the fixture, shared with test_stream


def waited(reply) -> bool:
    """The reply tells Envoy to wait longer for the message: a hold began."""
    return reply.HasField("override_message_timeout")


# -- item 13: paths ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/V1/Chat/Completions", "//v1//chat/completions",
                                  "/v1/./chat/completions", "/v1%2Fchat%2Fcompletions",
                                  "/v1/chat/completions/"])
async def test_a_variant_of_an_api_path_is_routed_and_its_path_made_canonical(replica, path):
    stream = replica.stream()
    reply = await stream.handle(headers_msg({**CHAT, ":path": path}))
    common = reply.request_headers.response
    assert set_headers(common)[":path"] == "/v1/chat/completions"
    assert common.clear_route_cache
    assert not reply.HasField("mode_override")  # the body is read: limits and locks apply
    routed = await stream.handle(body_msg(BODY))
    assert orjson.loads(routed.request_body.response.body_mutation.body)["model"] == "qwen3-32b"


async def test_the_canonical_path_keeps_its_query(replica):
    reply = await replica.stream().handle(headers_msg({**CHAT, ":path": "/V1/messages?beta=1"}))
    assert set_headers(reply.request_headers.response)[":path"] == "/v1/messages?beta=1"


@pytest.mark.parametrize(("path", "headers", "style"), [
    ("/v1/files", {}, "openai"),
    ("/v1/chat/complete", {}, "openai"),
    ("/chat/completions", {}, "openai"),
    ("/v1/responses/compact", {}, "openai"),
    ("/v1/messages/batches", {}, "anthropic"),
    ("/v1/complete", {"anthropic-version": "2023-06-01"}, "anthropic"),
])
async def test_an_unknown_llm_path_is_a_404_in_the_clients_format(replica, path, headers, style):
    reply = await replica.stream().handle(
        headers_msg({":method": "POST", ":path": path, **headers}))
    status, _, body = immediate(reply)
    assert status == 404
    if style == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    else:
        assert body["error"]["code"] == "path_not_found"
    assert "Invalid URL" in (body["error"]["message"])
    assert saar_metadata(reply) == {"error": "path_not_found"}  # Envoy's mappers skip it
    errors = replica.router.metrics.errors
    assert errors.labels("path_not_found")._value.get() == 1


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/embeddings"),
                                              ("POST", "/v1/messages/count_tokens"),
                                              ("DELETE", "/v1/responses/resp_1"),
                                              ("POST", "/healthz")])
async def test_what_passes_through(replica, method, path):
    reply = await replica.stream().handle(headers_msg({":method": method, ":path": path}))
    assert reply.HasField("request_headers") and reply.HasField("mode_override")


async def test_a_huge_unknown_path_is_not_echoed_whole(replica):
    reply = await replica.stream().handle(
        headers_msg({":method": "POST", ":path": "/v1/" + "x" * 100_000}))
    assert len(immediate(reply)[2]["error"]["message"]) < 400


# -- item 15: a locked session's model down ------------------------------------------------


def quick_hold(config, seconds: float):
    return replace(config, health=replace(config.health, locked_hold_seconds=seconds,
                                          failure_threshold=1, cooldown_seconds=5))


TOOL_RESULT = orjson.dumps({"model": "auto", "messages": [
    {"role": "user", "content": "refactor it"},
    {"role": "assistant", "tool_calls": [{"id": "call_9", "type": "function",
                                          "function": {"name": "t", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_9", "content": "ok"}]})
TOOL_CALL = orjson.dumps({"model": "qwen3-32b", "choices": [{"message": {"tool_calls": [
    {"id": "call_9", "function": {"name": "t"}}]}, "finish_reason": "tool_calls"}]})


async def locked_and_down(replica: Replica) -> Driver:
    """A session whose tool call came from qwen3-32b; then qwen3-32b is taken out."""
    first = replica.stream()
    await first.handle(headers_msg(CHAT))
    await first.handle(body_msg(WITH_TOOLS))
    await first.handle(response_headers("200", "application/json"))
    await first.handle(response_body(TOOL_CALL))
    first.close()
    replica.parts.health.record("qwen3-32b", 503)
    stream = replica.stream()
    await stream.handle(headers_msg(CHAT))
    return stream


async def test_a_locked_request_waits_for_its_model_then_goes_to_it(config, clock):
    replica = Replica(assemble(quick_hold(config, 20), clock=clock))
    stream = await locked_and_down(replica)
    routing = asyncio.ensure_future(stream.handle(body_msg(TOOL_RESULT)))
    await replica.held()
    assert not routing.done()
    clock.advance(6)  # the cooldown is over: its due time wakes the hold
    replica.waker.wake("locked", "qwen3-32b")
    hold, reply = await asyncio.wait_for(routing, 1)
    assert waited(hold) and hold.override_message_timeout.seconds == 21
    assert set_headers(reply.request_body.response)["x-saar-cluster"] == "qwen3-32b"
    assert saar_metadata(reply)["action"] == "locked_keep"
    record = replica.replay.get(saar_metadata(reply)["replay_id"])
    assert [h["kind"] for h in record["holds"]] == ["locked"]


async def test_a_locked_request_still_down_after_the_hold_is_refused_with_its_replay_id(
        config, clock):
    replica = Replica(assemble(quick_hold(config, 0.1), clock=clock))
    stream = await locked_and_down(replica)
    hold, reply = await stream.handle(body_msg(TOOL_RESULT))
    assert waited(hold)
    status, headers, body = immediate(reply)
    assert status == 503 and body["error"]["code"] == "model_unavailable"
    assert headers["retry-after"] == "5"
    replay_id = headers["x-replay-id"]
    assert saar_metadata(reply) == {"error": "model_unavailable", "replay_id": replay_id}
    record = replica.replay.get(replay_id)
    assert (record["model"], record["lock"], record["action"]) == (
        "qwen3-32b", "tool_loop", "locked_keep")
    assert record["outcome"]["refused"] == "model_unavailable"
    assert replica.parts.metrics.holds.labels("locked", "timeout")._value.get() == 1


async def test_without_a_hold_the_refusal_is_immediate(config, clock):
    replica = Replica(assemble(quick_hold(config, 0), clock=clock))
    stream = await locked_and_down(replica)
    status, headers, _ = immediate(await stream.handle(body_msg(TOOL_RESULT)))
    assert status == 503 and headers["x-replay-id"].startswith("rp-")


async def test_a_locked_request_lists_its_issuer_once_per_envoy_attempt(config, clock):
    replica = Replica(assemble(two_workers(config), clock=clock))
    first = replica.stream()
    await first.handle(headers_msg(CHAT))
    reply = await first.handle(body_msg(WITH_TOOLS))
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    workers = lb["x-gateway-destination-endpoint"].string_value.split(",")
    assert len(set(workers)) == 2  # a new turn may fall back to the other worker
    await first.handle(response_headers("200", "application/json"))
    await first.handle(response_body(TOOL_CALL))
    first.close()
    stream = replica.stream()
    await stream.handle(headers_msg(CHAT))
    reply = await stream.handle(body_msg(TOOL_RESULT))
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value.split(",") == (
        [workers[0]] * (MODEL_RETRIES + 1))


# -- item 6: large bodies ------------------------------------------------------------------


LARGE = orjson.dumps({"model": "auto", "messages": [
    {"role": "user", "content": "refactor it " + "x" * 4096}]})


def large_headers(key: str) -> ep.ProcessingRequest:
    return headers_msg({**CHAT, "authorization": f"Bearer {key}",
                        "content-length": str(len(LARGE))})


def gated(replica: Replica, bodies: LargeBodies) -> list[Driver]:
    replica.bodies = bodies
    return [replica.stream() for _ in range(8)]


async def test_a_tenants_further_large_body_waits_for_its_turn(replica):
    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=5)
    first, second, other, *_ = gated(replica, bodies)
    assert (await first.handle(large_headers("a"))).HasField("request_headers")
    waiting = asyncio.ensure_future(second.handle(large_headers("a")))
    await replica.held()
    # Another tenant is not held by this one.
    assert (await other.handle(large_headers("b"))).HasField("request_headers")
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await first.handle(body_msg(LARGE))  # parsed and routed: its slot goes to the next
    hold, reply = await asyncio.wait_for(waiting, 1)
    assert waited(hold) and reply.HasField("request_headers")
    reply = await second.handle(body_msg(LARGE))
    assert reply.HasField("request_body")
    for stream in (first, second, other):
        stream.close()
    assert len(bodies) == 0  # nothing kept once nothing is in flight
    record = replica.replay.get(saar_metadata(reply)["replay_id"])
    assert [h["kind"] for h in record["holds"]] == ["large_body"]


async def test_a_large_body_that_waited_too_long_is_429(replica):
    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=0.05)
    first, second, *_ = gated(replica, bodies)
    await first.handle(large_headers("a"))
    hold, reply = await second.handle(large_headers("a"))
    assert waited(hold)
    status, headers, body = immediate(reply)
    assert (status, headers["retry-after"], body["error"]["code"]) == (429, "1", "tenant_busy")
    first.close()
    second.close()
    assert len(bodies) == 0


async def test_past_the_queue_a_large_body_is_429_at_once(replica):
    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=5)
    streams = gated(replica, bodies)[:7]
    await streams[0].handle(large_headers("a"))
    waits = [asyncio.ensure_future(s.handle(large_headers("a"))) for s in streams[1:5]]
    await replica.held(4)
    status, _, _ = immediate(await streams[5].handle(large_headers("a")))
    assert status == 429
    for wait in waits:  # the clients hang up while they wait
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    for stream in streams:
        stream.close()
    assert len(bodies) == 0


async def test_a_body_without_content_length_is_gated_when_it_arrives(replica):
    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=5)
    first, second, *_ = gated(replica, bodies)
    headers = {**CHAT, "authorization": "Bearer a"}
    await first.handle(headers_msg(headers))
    await second.handle(headers_msg(headers))
    tenant = "k-" + replica.router.identity.tenant_of("Bearer a")
    assert bodies.enter(tenant, len(LARGE)).now  # another body of the tenant holds the slot
    waiting = asyncio.ensure_future(second.handle(body_msg(LARGE)))
    await replica.held()
    ticket = bodies.leave(tenant)  # that body is done: the gate names who is next
    assert ticket is not None
    replica.waker.wake("large_body", ticket)
    hold, reply = await asyncio.wait_for(waiting, 1)
    assert waited(hold) and reply.HasField("request_body")
    first.close()
    second.close()
    assert len(bodies) == 0


async def test_a_large_body_is_parsed_on_the_parse_thread(config, clock):
    small = replace(config, limits=replace(config.limits, parse_thread_bytes=1024))
    parser = ParseThread()
    replica = Replica(assemble(small, clock=clock), parser=parser)
    seen = []
    read = replica.router.read

    def spy(*args):
        import threading

        seen.append(threading.current_thread().name)
        return read(*args)

    replica.router.read = spy  # type: ignore[method-assign]
    try:
        stream = replica.stream()
        await stream.handle(headers_msg(CHAT))
        reply = await stream.handle(body_msg(LARGE))
        assert saar_metadata(reply)["replay_id"].startswith("rp-")  # routed
        stream = replica.stream()
        await stream.handle(headers_msg(CHAT))
        await stream.handle(body_msg(BODY))  # small: on the loop
    finally:
        parser.close()
    assert seen[0].startswith("saar-parse") and not seen[1].startswith("saar-parse")


async def test_a_gateways_streamed_large_body_is_gated_once_gathered(replica):
    """Full duplex (an endpoint picker's filter): the gate applies when the body has ended."""
    from .test_duplex import chunk, duplex_headers

    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=5)
    first, second, *_ = gated(replica, bodies)
    headers = {**CHAT, "authorization": "Bearer a"}
    for stream in (first, second):
        assert await stream.handle(duplex_headers(headers)) is None
    tenant = "k-" + replica.router.identity.tenant_of("Bearer a")
    assert bodies.enter(tenant, len(LARGE)).now  # another body of the tenant holds the slot
    waiting = asyncio.ensure_future(second.handle(chunk(LARGE, True)))
    await replica.held()
    ticket = bodies.leave(tenant)
    assert ticket is not None
    replica.waker.wake("large_body", ticket)
    replies = await asyncio.wait_for(waiting, 1)
    assert waited(replies[0]) and replies[1].HasField("request_headers")
    second.close()


async def test_the_parse_thread_runs_calls_off_the_loop():
    import threading

    parser = ParseThread()
    try:
        name = await parser.run(lambda: threading.current_thread().name)
    finally:
        parser.close()
    assert name.startswith("saar-parse")
