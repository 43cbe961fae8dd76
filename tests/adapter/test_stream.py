"""The ext_proc adapter fed protobuf messages directly, as Envoy would send them."""

from __future__ import annotations

import orjson
import pytest
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.adapter.stream import ExtProcStream
from extproc.core.router import Router


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


def response_headers(status: str, content_type: str) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=core.HeaderMap(headers=[
        core.HeaderValue(key=":status", raw_value=status.encode()),
        core.HeaderValue(key="content-type", raw_value=content_type.encode())])))


def routed_stream(router: Router, body: bytes = BODY) -> tuple[ExtProcStream, str]:
    stream = ExtProcStream(router)
    stream.handle(headers_msg(CHAT))
    meta = stream.handle(body_msg(body)).dynamic_metadata.fields["saar"].struct_value.fields
    return stream, meta["replay_id"].string_value


TOOL_CALL = orjson.dumps({"model": "qwen3-32b", "choices": [{"message": {"tool_calls": [
    {"id": "call_9", "function": {"name": "t"}}]}, "finish_reason": "tool_calls"}]})


def test_json_answer_is_read_on_the_same_stream(router):
    stream, replay_id = routed_stream(router)
    reply = stream.handle(response_headers("200", "application/json"))
    # The upstream answered: the turn is committed, and the JSON body is asked for, buffered.
    assert reply.mode_override.response_body_mode == 2  # BUFFERED
    assert router.memory.session(router.replay.get(replay_id)["session"]["tenant"] + "/s")
    reply = stream.handle(ep.ProcessingRequest(
        response_body=ep.HttpBody(body=TOOL_CALL, end_of_stream=True)))
    assert reply.HasField("response_body")
    assert router.memory.owner(["call_9"]) == "qwen3-32b"
    outcome = router.replay.get(replay_id)["outcome"]
    assert (outcome["status"], outcome["finish_reason"]) == (200, "tool_calls")


def test_failed_upstream_does_not_commit(router):
    stream, _ = routed_stream(router)
    stream.handle(response_headers("503", "application/json"))
    assert len(router.memory) == 0


def observe(router: Router, replay_id: str, chunks: list[bytes], end: bool = True
            ) -> ExtProcStream:
    """The observe filter's stream: metadata on every message, observability_mode on all but
    the end-of-stream one (as Envoy sends it)."""
    stream = ExtProcStream(router)
    for i, chunk in enumerate(chunks):
        last = end and i == len(chunks) - 1
        msg = ep.ProcessingRequest(observability_mode=i == 0 or not last)
        msg.metadata_context.filter_metadata["saar"].update({"replay_id": replay_id})
        msg.response_body.CopyFrom(ep.HttpBody(body=chunk, end_of_stream=last))
        assert stream.handle(msg) is None
    return stream


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_streamed_answer_is_observed_without_holding_it(router):
    stream, replay_id = routed_stream(
        router, orjson.dumps({"model": "auto", "stream": True,
                              "messages": [{"role": "user", "content": "refactor it"}]}))
    reply = stream.handle(response_headers("200", "text/event-stream"))
    assert not reply.HasField("mode_override")  # no body on the blocking stream
    data = sse({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_s"}]}}]})
    observer = observe(router, replay_id, [data[:20], data[20:], b""])
    # Once the response is understood the processor ends the stream itself.
    assert observer.observed
    assert router.memory.owner(["call_s"]) == "qwen3-32b"


def test_stream_cut_short_still_closes_the_turn(router):
    stream, replay_id = routed_stream(router)
    stream.handle(response_headers("200", "text/event-stream"))
    observer = observe(router, replay_id, [b"data: {\"choices\": []}\n\n"], end=False)
    assert not observer.observed
    observer.close()
    assert router.replay.get(replay_id)["outcome"]["status"] == 200


def subset_headers_msg(subset: list[str] | str) -> ep.ProcessingRequest:
    msg = headers_msg(CHAT)
    msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].update(
        {"x-gateway-destination-endpoint-subset": subset})
    return msg


def two_worker_router(config, clock) -> Router:
    from dataclasses import replace

    models = dict(config.models)
    models["qwen3-32b"] = replace(models["qwen3-32b"], endpoints=("10.0.0.1:80", "10.0.0.2:80"))
    return Router(replace(config, models=models), clock=clock)


@pytest.mark.parametrize("hint", [["10.0.0.2:80"], "10.0.0.2:80, 10.9.9.9:80"])
def test_the_proxys_subset_hint_limits_the_pick(config, clock, hint):
    stream = ExtProcStream(two_worker_router(config, clock))
    stream.handle(subset_headers_msg(hint))
    reply = stream.handle(body_msg(BODY))
    assert set_headers(reply.request_body.response)["x-gateway-destination-endpoint"] == (
        "10.0.0.2:80")
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.2:80"


def test_an_empty_subset_is_503(config, clock):
    stream = ExtProcStream(two_worker_router(config, clock))
    stream.handle(subset_headers_msg(["10.9.9.9:80"]))
    reply = stream.handle(body_msg(BODY))
    assert reply.immediate_response.status.code == 503
    assert orjson.loads(reply.immediate_response.body)["error"]["code"] == "model_unavailable"


def test_the_served_worker_is_learnt_from_envoys_attribute(config, clock):
    router = two_worker_router(config, clock)
    long = orjson.dumps({"model": "auto", "messages": [
        {"role": "user", "content": "please refactor " + "the module " * 100}]})
    stream, replay_id = routed_stream(router, long)
    picked = router.replay.get(replay_id)["worker"]["picked"]
    other = next(a for a in ("10.0.0.1:80", "10.0.0.2:80") if a != picked)
    headers = response_headers("200", "application/json")
    headers.attributes["envoy.filters.http.ext_proc"].update({"upstream.address": other})
    stream.handle(headers)
    stream.handle(ep.ProcessingRequest(response_body=ep.HttpBody(body=b"{}", end_of_stream=True)))
    assert router.replay.get(replay_id)["outcome"]["served_worker"] == other
    # Envoy fell back to another worker: the prefix index now knows the prompt is there too.
    assert router.pools.index.held(other) == router.pools.index.held(picked) > 10
