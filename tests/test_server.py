"""The ext_proc adapter fed protobuf messages directly, as Envoy would send them."""

from __future__ import annotations

import orjson
import pytest
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.router import Router
from extproc.server import ExtProcStream


def headers_msg(headers: dict[str, str], end: bool = False) -> ep.ProcessingRequest:
    values = [core.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    return ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(
            headers=core.HeaderMap(headers=values), end_of_stream=end))


def body_msg(body: bytes) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True))


def set_headers(common: ep.CommonResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


CHAT = {":method": "POST", ":path": "/v1/chat/completions", "x-session-id": "s"}
BODY = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor it"}]})


@pytest.fixture
def router(config, clock) -> Router:
    return Router(config, clock=clock)


def test_routes_rewrites_and_emits_metadata(router):
    stream = ExtProcStream(router)
    spoofed = {**CHAT, "x-saar-cluster": "evil", "x-gateway-destination-endpoint": "1.2.3.4:80",
               "x-saar-selected-model": "fake"}
    first = stream.handle(headers_msg(spoofed))
    removed = set(first.request_headers.response.header_mutation.remove_headers)
    assert removed == {"x-saar-cluster", "x-gateway-destination-endpoint", "x-saar-selected-model"}
    assert first.request_headers.response.clear_route_cache
    reply = stream.handle(body_msg(BODY))
    common = reply.request_body.response
    body = common.body_mutation.body
    assert orjson.loads(body)["model"] == "qwen3-32b"
    assert set_headers(common) == {"x-saar-cluster": "qwen3-32b", "content-length": str(len(body))}
    assert common.clear_route_cache
    meta = reply.dynamic_metadata.fields["saar"].struct_value.fields
    assert meta["selected_model"].string_value == "qwen3-32b"
    assert meta["replay_id"].string_value.startswith("rp-")
    assert meta["action"].string_value == "new"
    assert router.metrics.stripped_headers.labels("x-saar-cluster")._value.get() == 1


def test_non_llm_path_skips_the_body_phase(router):
    reply = ExtProcStream(router).handle(headers_msg({":method": "GET", ":path": "/v1/models"}))
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
def test_errors_answer_in_the_clients_format(router, path, body, status, style_key):
    stream = ExtProcStream(router)
    stream.handle(headers_msg({":method": "POST", ":path": path}))
    reply = stream.handle(body_msg(body))
    immediate = reply.immediate_response
    assert immediate.status.code == status
    payload = orjson.loads(immediate.body)
    assert style_key in payload
    if path == "/v1/messages":
        assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"


def test_empty_body_on_llm_path_is_400(router):
    reply = ExtProcStream(router).handle(headers_msg(CHAT, end=True))
    assert reply.immediate_response.status.code == 400


def test_oversized_body_is_413(config, clock):
    from dataclasses import replace

    small = replace(config, limits=replace(config.limits, max_body_bytes=64))
    stream = ExtProcStream(Router(small, clock=clock))
    stream.handle(headers_msg(CHAT))
    assert stream.handle(body_msg(BODY)).immediate_response.status.code == 413


def observe(router: Router, replay_id: str, status: str, chunks: list[bytes],
            content_type: str = "application/json") -> None:
    stream = ExtProcStream(router)
    meta = ep.ProcessingRequest(observability_mode=True)
    meta.metadata_context.filter_metadata["saar"].update({"replay_id": replay_id})
    msg = ep.ProcessingRequest()
    msg.CopyFrom(meta)
    msg.response_headers.CopyFrom(ep.HttpHeaders(headers=core.HeaderMap(headers=[
        core.HeaderValue(key=":status", raw_value=status.encode()),
        core.HeaderValue(key="content-type", raw_value=content_type.encode())])))
    assert stream.handle(msg) is None
    for i, chunk in enumerate(chunks):
        msg = ep.ProcessingRequest()
        msg.CopyFrom(meta)
        msg.response_body.CopyFrom(ep.HttpBody(body=chunk, end_of_stream=i == len(chunks) - 1))
        assert stream.handle(msg) is None
    # Once the response is understood the processor ends the stream itself.
    assert stream.observed == bool(chunks)
    stream.close()


def test_observed_response_commits_memory_and_ownership(router):
    stream = ExtProcStream(router)
    stream.handle(headers_msg(CHAT))
    meta = stream.handle(body_msg(BODY)).dynamic_metadata.fields["saar"].struct_value.fields
    replay_id = meta["replay_id"].string_value
    doc = orjson.dumps({"model": "qwen3-32b", "choices": [{"message": {"tool_calls": [
        {"id": "call_9", "function": {"name": "t"}}]}, "finish_reason": "tool_calls"}]})
    observe(router, replay_id, "200", [doc[:10], doc[10:], b""])
    assert router.memory.owner(["call_9"]) == "qwen3-32b"
    assert router.replay.get(replay_id)["outcome"]["finish_reason"] == "tool_calls"


def test_stream_cut_short_still_closes_the_turn(router):
    stream = ExtProcStream(router)
    stream.handle(headers_msg(CHAT))
    meta = stream.handle(body_msg(BODY)).dynamic_metadata.fields["saar"].struct_value.fields
    replay_id = meta["replay_id"].string_value
    observe(router, replay_id, "200", [], content_type="text/event-stream")
    assert router.replay.get(replay_id)["outcome"]["status"] == 200
