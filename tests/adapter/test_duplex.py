"""The adapter in FULL_DUPLEX_STREAMED mode (a gateway's endpoint picker filter), fed the
messages Envoy sends: the body in chunks, answered only once it has ended."""

from __future__ import annotations

from dataclasses import replace

import orjson
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.adapter.codec import CHUNK_BYTES
from extproc.assembly import assemble
from extproc.service.roles import pool_config

from .support import (
    BODY,
    CHAT,
    STREAMED,
    Driver,
    Replica,
    headers_msg,
    response_headers,
    set_headers,
    two_workers,
)
from .test_stream import replica, sse

DUPLEX = pm.ProcessingMode.FULL_DUPLEX_STREAMED
__all__ = ["replica"]  # the fixture, shared with test_stream


def duplex_headers(headers: dict[str, str]) -> ep.ProcessingRequest:
    msg = headers_msg(headers)
    msg.protocol_config.request_body_mode = DUPLEX
    msg.protocol_config.response_body_mode = DUPLEX
    return msg


def chunk(body: bytes, end: bool) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=end))


def answer_chunk(body: bytes, end: bool) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_body=ep.HttpBody(body=body, end_of_stream=end))


def streamed(replies, kind: str) -> tuple[bytes, list[bool]]:
    replies = replies if isinstance(replies, list) else [replies]
    pieces = [getattr(r, kind).response.body_mutation.streamed_response for r in replies]
    return b"".join(p.body for p in pieces), [p.end_of_stream for p in pieces]


async def routed(stream: Driver, body: bytes, headers=CHAT) -> list:
    assert await stream.handle(duplex_headers(headers)) is None  # not answered yet
    half = len(body) // 2
    assert await stream.handle(chunk(body[:half], False)) is None
    replies = await stream.handle(chunk(body[half:], True))
    return replies if isinstance(replies, list) else [replies]  # an error: one reply


async def test_the_headers_are_answered_after_the_body_then_the_body_streams_back(config, clock):
    replica = Replica(assemble(two_workers(config), clock=clock))
    stream = replica.stream()
    spoofed = {**CHAT, "x-gateway-destination-endpoint": "6.6.6.6:1", "x-gateway-model-name": "x"}
    replies = await routed(stream, BODY, spoofed)
    first = replies[0]
    assert first.HasField("request_headers")
    common = first.request_headers.response
    assert common.clear_route_cache
    headers = set_headers(common)
    assert headers["x-gateway-model-name"] == "qwen3-32b"
    assert headers["x-saar-cluster"] == "qwen3-32b"
    assert "content-length" not in headers  # Envoy drops it itself in this mode
    pick = headers["x-gateway-destination-endpoint"]
    assert pick in ("10.0.0.1:80", "10.0.0.2:80")
    lb = first.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value.split(",")[0] == pick
    # The spoofed copies are overwritten, not removed (a removal would win over the set).
    assert list(common.header_mutation.remove_headers) == []
    body, ends = streamed(replies[1:], "request_body")
    assert orjson.loads(body)["model"] == "qwen3-32b"
    assert ends[-1] and not any(ends[:-1])


async def test_a_body_larger_than_a_chunk_goes_back_in_pieces(config, clock):
    stream = Replica(assemble(config, clock=clock)).stream()
    big = orjson.dumps({"model": "qwen3-8b", "messages": [
        {"role": "user", "content": "summarise " + "word " * 40_000}]})
    replies = await routed(stream, big)
    body, ends = streamed(replies[1:], "request_body")
    assert body == big  # a physical model: the body is not rewritten, but must come back
    assert len(replies) - 1 == -(-len(big) // CHUNK_BYTES) and ends.count(True) == 1


async def test_a_pool_of_one_still_gets_its_destination(config, clock):
    picker = assemble(pool_config(config, "qwen3-8b"), clock=clock)
    stream = Replica(picker).stream()
    replies = await routed(stream, BODY)
    headers = set_headers(replies[0].request_headers.response)
    assert headers["x-gateway-destination-endpoint"] == "127.0.0.1:8101"
    assert headers["x-gateway-model-name"] == "qwen3-8b"  # "auto" stays inside this pool
    body, _ = streamed(replies[1:], "request_body")
    assert orjson.loads(body)["model"] == "qwen3-8b"


async def test_a_pool_answers_503_without_workers_and_404_for_another_pools_model(config, clock):
    models = {**config.models, "qwen3-8b": replace(config.models["qwen3-8b"], endpoints=())}
    picker = assemble(pool_config(replace(config, models=models), "qwen3-8b"), clock=clock)
    replies = await routed(Replica(picker).stream(), BODY)
    assert replies[0].immediate_response.status.code == 503  # no ready endpoint
    other = orjson.dumps({"model": "qwen3-32b", "messages": [{"role": "user", "content": "hi"}]})
    replies = await routed(Replica(picker).stream(), other)
    assert replies[0].immediate_response.status.code == 404


async def test_too_large_a_body_is_refused_as_it_streams(config, clock):
    small = replace(config, limits=replace(config.limits, max_body_bytes=64))
    stream = Replica(assemble(small, clock=clock)).stream()
    await stream.handle(duplex_headers(CHAT))
    reply = await stream.handle(chunk(b"x" * 65, False))
    assert reply.immediate_response.status.code == 413


async def test_non_llm_traffic_passes_chunk_by_chunk(replica):
    stream = replica.stream()
    reply = await stream.handle(duplex_headers({":method": "POST", ":path": "/v1/embeddings"}))
    assert reply.HasField("request_headers") and not reply.HasField("mode_override")
    body, ends = streamed(await stream.handle(chunk(b"abc", False)), "request_body")
    assert (body, ends) == (b"abc", [False])


async def test_trailers_end_the_body_and_are_answered_last(replica):
    stream = replica.stream()
    await stream.handle(duplex_headers(CHAT))
    assert await stream.handle(chunk(BODY, False)) is None
    replies = await stream.handle(ep.ProcessingRequest(request_trailers=ep.HttpTrailers()))
    assert replies[0].HasField("request_headers") and replies[-1].HasField("request_trailers")
    _, ends = streamed(replies[1:-1], "request_body")
    assert not any(ends)


TOOL_CALL = orjson.dumps({"model": "qwen3-32b", "choices": [{"message": {"tool_calls": [
    {"id": "call_d", "function": {"name": "t"}}]}, "finish_reason": "tool_calls"}]})


async def test_a_json_answer_streams_through_and_commits_before_its_last_chunk(replica):
    stream = replica.stream()
    replies = await routed(stream, BODY)
    replay_id = replies[0].dynamic_metadata.fields["saar"].struct_value.fields[
        "replay_id"].string_value
    reply = await stream.handle(response_headers("200", "application/json"))
    assert not reply.HasField("mode_override")
    shown = set_headers(reply.response_headers.response)
    assert shown["x-replay-id"] == replay_id  # for gateways that do not render our metadata
    first = await stream.handle(answer_chunk(TOOL_CALL[:20], False))
    assert streamed(first, "response_body") == (TOOL_CALL[:20], [False])  # not held
    assert replica.session(replay_id) is None
    last = await stream.handle(answer_chunk(TOOL_CALL[20:], True))
    assert streamed(last, "response_body") == (TOOL_CALL[20:], [True])
    assert replica.owner(replay_id, "call_d").model == "qwen3-32b"  # before the client has it
    assert replica.session(replay_id).phase.value == "tool_loop"
    stream.close()


CALL = {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_e"}]}}]}


async def test_an_sse_answer_claims_each_id_before_its_chunk_passes(replica):
    stream = replica.stream()
    replies = await routed(stream, STREAMED)
    replay_id = replies[0].dynamic_metadata.fields["saar"].struct_value.fields[
        "replay_id"].string_value
    await stream.handle(response_headers("200", "text/event-stream"))
    assert replica.session(replay_id).turns == 1
    events = sse(CALL)
    reply = await stream.handle(answer_chunk(events[:30], False))
    assert streamed(reply, "response_body")[0] == events[:30]
    await stream.handle(answer_chunk(events[30:], False))
    assert replica.owner(replay_id, "call_e").model == "qwen3-32b"
    await stream.handle(answer_chunk(b"", True))
    assert replica.session(replay_id).phase.value == "tool_loop"
    stream.close()


async def test_the_served_endpoint_is_read_from_envoy_lb_metadata(config, clock):
    replica = Replica(assemble(two_workers(config), clock=clock))
    stream = replica.stream()
    replies = await routed(stream, BODY)
    meta = replies[0].dynamic_metadata.fields["saar"].struct_value.fields
    replay_id = meta["replay_id"].string_value
    picked = set_headers(replies[0].request_headers.response)["x-gateway-destination-endpoint"]
    other = next(a for a in ("10.0.0.1:80", "10.0.0.2:80") if a != picked)
    headers = response_headers("200", "application/json")
    headers.metadata_context.filter_metadata["envoy.lb"].update(
        {"x-gateway-destination-endpoint-served": other})
    await stream.handle(headers)
    await stream.handle(answer_chunk(b"{}", True))
    assert replica.replay.get(replay_id)["outcome"]["served_worker"] == other
    assert replica.session(replay_id).worker == other


async def test_a_tool_result_for_a_physical_model_is_pinned_to_the_issuing_worker(config, clock):
    """Behind the model router the picker sees physical names only: the pin still holds."""
    replica = Replica(assemble(pool_config(two_workers(config), "qwen3-32b"), clock=clock))
    ask = orjson.dumps({"model": "qwen3-32b", "messages": [
        {"role": "user", "content": "please refactor " + "the module " * 50}]})
    picks = set()
    for _ in range(6):
        stream = replica.stream()
        replies = await routed(stream, ask, {**CHAT, "x-session-id": f"s{len(picks)}"})
        headers = set_headers(replies[0].request_headers.response)
        picks.add(headers["x-gateway-destination-endpoint"])
        await stream.handle(response_headers("200", "application/json"))
        await stream.handle(answer_chunk(orjson.dumps({"choices": [{"message": {
            "tool_calls": [{"id": f"call_{len(picks)}_{_}", "function": {"name": "t"}}]}}]}),
            True))
        stream.close()
        issuer = headers["x-gateway-destination-endpoint"]
        result = orjson.dumps({"model": "qwen3-32b", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": f"call_{len(picks)}_{_}", "type":
                                                  "function", "function": {"name": "t",
                                                                           "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"call_{len(picks)}_{_}", "content": "ok"}]})
        follow = await routed(replica.stream(), result, {**CHAT, "x-session-id": "other"})
        assert set_headers(follow[0].request_headers.response)[
            "x-gateway-destination-endpoint"] == issuer


def test_options_default_to_the_gateway_model_header(config):
    assert assemble(config).options.model_header == "x-gateway-model-name"
