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
from extproc.adapter.gate import LargeBodies, ParseThread
from extproc.adapter.stream import ExtProcStream, Hold
from extproc.core.router import Router

from .test_stream import (
    BODY,
    CHAT,
    Replica,
    body_msg,
    headers_msg,
    replica,
    response_headers,
    set_headers,
    two_worker_router,
)

__all__ = ["replica"]  # the fixture, shared with test_stream


def immediate(reply) -> tuple[int, dict, dict]:
    out = reply.immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in out.headers.set_headers}
    return out.status.code, headers, orjson.loads(out.body)


def saar_metadata(reply) -> dict[str, str]:
    fields = reply.dynamic_metadata.fields["saar"].struct_value.fields
    return {k: v.string_value for k, v in fields.items()}


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
    ("/v1/completions", {}, "openai"),
    ("/v1/chat/complete", {}, "openai"),
    ("/chat/completions", {}, "openai"),
    ("/v1/responses/resp_1/cancel", {}, "openai"),
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


async def locked_and_down(replica: Replica) -> ExtProcStream:
    """A session whose tool call came from qwen3-32b; then qwen3-32b is taken out."""
    first = replica.stream()
    await first.handle(headers_msg(CHAT))
    await first.handle(body_msg(BODY))
    await first.handle(response_headers("200", "application/json"))
    await first.handle(ep.ProcessingRequest(
        response_body=ep.HttpBody(body=TOOL_CALL, end_of_stream=True)))
    first.close()
    replica.router.health.record("qwen3-32b", 503)
    stream = replica.stream()
    await stream.handle(headers_msg(CHAT))
    return stream


async def test_a_locked_request_waits_for_its_model_then_goes_to_it(config, clock):
    replica = Replica(Router(quick_hold(config, 20), clock=clock))
    stream = await locked_and_down(replica)
    hold = await stream.handle(body_msg(TOOL_RESULT))
    assert isinstance(hold, Hold) and hold.kind == "locked" and hold.timeout == 20
    waiting = asyncio.ensure_future(hold.wait())
    await asyncio.sleep(0.1)
    assert not waiting.done()
    clock.advance(6)  # the cooldown is over
    assert await asyncio.wait_for(waiting, 1) is True
    reply = await stream.resume(hold, True)
    assert set_headers(reply.request_body.response)["x-saar-cluster"] == "qwen3-32b"
    assert saar_metadata(reply)["action"] == "locked_keep"


async def test_a_locked_request_still_down_after_the_hold_is_refused_with_its_replay_id(
        config, clock):
    replica = Replica(Router(quick_hold(config, 0.1), clock=clock))
    stream = await locked_and_down(replica)
    hold = await stream.handle(body_msg(TOOL_RESULT))
    assert isinstance(hold, Hold)
    assert await hold.wait() is False
    reply = await stream.resume(hold, False)
    status, headers, body = immediate(reply)
    assert status == 503 and body["error"]["code"] == "model_unavailable"
    assert headers["retry-after"] == "5"
    replay_id = headers["x-replay-id"]
    assert saar_metadata(reply) == {"error": "model_unavailable", "replay_id": replay_id}
    record = replica.router.replay.get(replay_id)
    assert (record["model"], record["lock"], record["action"]) == (
        "qwen3-32b", "tool_loop", "locked_keep")
    assert record["outcome"]["refused"] == "model_unavailable"


async def test_without_a_hold_the_refusal_is_immediate(config, clock):
    replica = Replica(Router(quick_hold(config, 0), clock=clock))
    stream = await locked_and_down(replica)
    status, headers, _ = immediate(await stream.handle(body_msg(TOOL_RESULT)))
    assert status == 503 and headers["x-replay-id"].startswith("rp-")


async def test_a_locked_request_lists_its_issuer_once_per_envoy_attempt(config, clock):
    replica = Replica(two_worker_router(config, clock))
    first = replica.stream()
    await first.handle(headers_msg(CHAT))
    reply = await first.handle(body_msg(BODY))
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    workers = lb["x-gateway-destination-endpoint"].string_value.split(",")
    assert len(set(workers)) == 2  # a new turn may fall back to the other worker
    await first.handle(response_headers("200", "application/json"))
    await first.handle(ep.ProcessingRequest(
        response_body=ep.HttpBody(body=TOOL_CALL, end_of_stream=True)))
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


def gated(replica: Replica, bodies: LargeBodies, parser: ParseThread | None = None):
    return ExtProcStream(replica.router, replica.state, bodies=bodies, parser=parser)


async def test_a_tenants_further_large_body_waits_for_its_turn(replica):
    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=5)
    first, second, other = (gated(replica, bodies) for _ in range(3))
    assert (await first.handle(large_headers("a"))).HasField("request_headers")
    hold = await second.handle(large_headers("a"))
    assert isinstance(hold, Hold) and hold.kind == "large_body"
    # Another tenant is not held by this one.
    assert (await other.handle(large_headers("b"))).HasField("request_headers")
    waiting = asyncio.ensure_future(hold.wait())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await first.handle(body_msg(LARGE))  # parsed and routed: its slot goes to the next
    assert await asyncio.wait_for(waiting, 1) is True
    assert (await second.resume(hold, True)).HasField("request_headers")
    reply = await second.handle(body_msg(LARGE))
    assert reply.HasField("request_body")
    for stream in (first, second, other):
        stream.close()
    assert len(bodies) == 0  # nothing kept once nothing is in flight


async def test_a_large_body_that_waited_too_long_is_429(replica):
    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=0.05)
    first, second = gated(replica, bodies), gated(replica, bodies)
    await first.handle(large_headers("a"))
    hold = await second.handle(large_headers("a"))
    assert await hold.wait() is False
    status, headers, body = immediate(await second.resume(hold, False))
    assert (status, headers["retry-after"], body["error"]["code"]) == (429, "1", "tenant_busy")
    first.close()
    second.close()
    assert len(bodies) == 0


async def test_past_the_queue_a_large_body_is_429_at_once(replica):
    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=5)
    streams = [gated(replica, bodies) for _ in range(7)]
    await streams[0].handle(large_headers("a"))
    holds = [await s.handle(large_headers("a")) for s in streams[1:5]]
    waits = [asyncio.ensure_future(h.wait()) for h in holds]
    await asyncio.sleep(0.01)
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
    first, second = gated(replica, bodies), gated(replica, bodies)
    headers = {**CHAT, "authorization": "Bearer a"}
    await first.handle(headers_msg(headers))
    await second.handle(headers_msg(headers))
    assert first._admit(len(LARGE), lambda: None) is None  # type: ignore[arg-type, return-value]
    hold = await second.handle(body_msg(LARGE))
    assert isinstance(hold, Hold) and hold.kind == "large_body"
    first.close()
    assert await hold.wait() is True
    reply = await second.resume(hold, True)
    assert reply.HasField("request_body")
    second.close()


async def test_a_large_body_is_parsed_on_the_parse_thread(config, clock):
    small = replace(config, limits=replace(config.limits, parse_thread_bytes=1024))
    replica = Replica(Router(small, clock=clock))
    parser = ParseThread()
    seen = []
    read = replica.router.read

    def spy(*args):
        import threading

        seen.append(threading.current_thread().name)
        return read(*args)

    replica.router.read = spy  # type: ignore[method-assign]
    try:
        stream = ExtProcStream(replica.router, replica.state, parser=parser)
        await stream.handle(headers_msg(CHAT))
        reply = await stream.handle(body_msg(LARGE))
        assert saar_metadata(reply)["replay_id"].startswith("rp-")  # routed
        stream = ExtProcStream(replica.router, replica.state, parser=parser)
        await stream.handle(headers_msg(CHAT))
        await stream.handle(body_msg(BODY))  # small: on the loop
    finally:
        parser.close()
    assert seen[0].startswith("saar-parse") and not seen[1].startswith("saar-parse")


async def test_a_gateways_streamed_large_body_is_gated_once_gathered(replica):
    """Full duplex (an endpoint picker's filter): the gate applies when the body has ended."""
    from .test_duplex import chunk, duplex_headers

    bodies = LargeBodies(1024, per_tenant=1, wait_seconds=5)
    first, second = gated(replica, bodies), gated(replica, bodies)
    headers = {**CHAT, "authorization": "Bearer a"}
    for stream in (first, second):
        assert await stream.handle(duplex_headers(headers)) is None
    assert first._admit(len(LARGE), lambda: None) is None  # type: ignore[arg-type, return-value]
    hold = await second.handle(chunk(LARGE, True))
    assert isinstance(hold, Hold) and hold.kind == "large_body"
    first.close()
    assert await hold.wait() is True
    replies = await second.resume(hold, True)
    assert isinstance(replies, list) and replies[0].HasField("request_headers")
    second.close()
