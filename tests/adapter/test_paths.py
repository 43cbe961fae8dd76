"""Issue 29 in the adapter, fed protobuf messages as Envoy sends them: a legacy completion is
routed like the other APIs, and an operation on a stored response goes to the model and worker
whose answer issued it (every retry included), while a response nobody here issued, or
another tenant's, passes through."""

from __future__ import annotations

import orjson
import pytest

from extproc.adapter.contract import DESTINATION_HEADER, LB_NAMESPACE, MODEL_RETRIES
from extproc.assembly import assemble

from .support import (
    Replica,
    body_msg,
    headers_msg,
    response_body,
    response_headers,
    set_headers,
    two_workers,
)

KEY = {"authorization": "Bearer k-1", "x-session-id": "s"}
RESPONSES = {":method": "POST", ":path": "/v1/responses", **KEY}
ASK = orjson.dumps({"model": "auto", "input": "refactor the parser"})
ANSWER = orjson.dumps({"id": "resp_AbC1", "object": "response", "status": "completed",
                       "output": [{"type": "message", "role": "assistant",
                                   "content": [{"type": "output_text", "text": "done"}]}]})


@pytest.fixture
def replica(session_config, clock) -> Replica:
    return Replica(assemble(two_workers(session_config), clock=clock))


async def issue(replica: Replica) -> str:
    """A Responses turn answered with ``resp_AbC1``: the worker that answered it."""
    stream = replica.stream()
    await stream.handle(headers_msg(RESPONSES))
    routed = await stream.handle(body_msg(ASK))
    worker = set_headers(routed.request_body.response)[DESTINATION_HEADER]
    await stream.handle(response_headers("200", "application/json"))
    await stream.handle(response_body(ANSWER))
    stream.close()
    return worker


def lb_workers(reply) -> list[str]:
    lb = reply.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
    return lb[DESTINATION_HEADER].string_value.split(",") if DESTINATION_HEADER in lb else []


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/responses/resp_AbC1"),
    ("DELETE", "/v1/responses/resp_AbC1"),
    ("GET", "/v1/responses/resp_AbC1/input_items?limit=5"),
    ("POST", "/v1/responses/resp_AbC1/cancel"),
])
async def test_an_operation_on_a_stored_response_goes_to_its_issuer(replica, method, path):
    worker = await issue(replica)
    spoofed = {"x-saar-cluster": "qwen3-8b", DESTINATION_HEADER: "6.6.6.6:1"}
    reply = await replica.stream().handle(
        headers_msg({":method": method, ":path": path, **KEY, **spoofed}, end=True))
    common = reply.request_headers.response
    assert set_headers(common) == {"x-saar-cluster": "qwen3-32b", DESTINATION_HEADER: worker,
                                   "x-gateway-model-name": "qwen3-32b"}
    assert not set(common.header_mutation.remove_headers) & set(spoofed)  # overwritten
    assert common.clear_route_cache
    assert lb_workers(reply) == [worker] * (MODEL_RETRIES + 1)  # a lock: retries stay there
    assert reply.HasField("mode_override")  # nothing more of it is seen here


async def test_a_variant_of_the_path_is_made_canonical_with_the_ids_case_kept(replica):
    worker = await issue(replica)
    reply = await replica.stream().handle(
        headers_msg({":method": "GET", ":path": "//V1/Responses/resp_AbC1/", **KEY}, end=True))
    headers = set_headers(reply.request_headers.response)
    assert headers[":path"] == "/v1/responses/resp_AbC1"
    assert headers[DESTINATION_HEADER] == worker


@pytest.mark.parametrize("headers", [
    {**KEY, ":path": "/v1/responses/resp_unknown"},
    {**KEY, ":path": "/v1/responses/resp_abc1"},  # ids are case-sensitive
    {**KEY, "authorization": "Bearer k-2", ":path": "/v1/responses/resp_AbC1"},
])
async def test_a_response_nobody_here_issued_to_the_caller_passes_through(replica, headers):
    await issue(replica)
    spoofed = {"x-saar-cluster": "qwen3-8b"}
    reply = await replica.stream().handle(
        headers_msg({":method": "GET", **headers, **spoofed}, end=True))
    common = reply.request_headers.response
    assert set_headers(common) == {}
    assert list(common.header_mutation.remove_headers) == ["x-saar-cluster"]
    assert lb_workers(reply) == []
    assert reply.HasField("mode_override")


async def test_a_legacy_completion_is_routed_with_its_model_rewritten(replica):
    stream = replica.stream()
    headers = {":method": "POST", ":path": "/v1/completions", **KEY}
    first = await stream.handle(headers_msg(headers))
    assert not first.HasField("mode_override")  # the body is read: limits and locks apply
    body = orjson.dumps({"model": "auto", "prompt": "Refactor the parser:\n", "max_tokens": 8})
    reply = await stream.handle(body_msg(body))
    common = reply.request_body.response
    sent = orjson.loads(common.body_mutation.body)
    assert sent == {**orjson.loads(body), "model": "qwen3-32b"}
    assert set_headers(common)["x-saar-cluster"] == "qwen3-32b"
    assert set_headers(common)[DESTINATION_HEADER] in ("10.0.0.1:80", "10.0.0.2:80")
