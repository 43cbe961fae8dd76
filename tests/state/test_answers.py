"""What an answer passing through a replica binds is in the shared store before the client has
the chunk that carries it: whichever replica the continuation reaches, however long the
replica's writes off the request path take (here they never leave: its writer is not started,
so only an awaited write reaches the store). Real Redis / Valkey, the adapter's own loop."""

from __future__ import annotations

import time

import orjson
import pytest

from extproc.assembly import assemble
from extproc.state.layer import StateLayer
from extproc.state.memory import MemoryStore
from extproc.state.records import owner_key
from extproc.state.store import Query
from tests.adapter.support import (
    BODY,
    CHAT,
    STREAMED,
    TOOLS,
    Replica,
    body_msg,
    headers_msg,
    response_headers,
    two_workers,
)
from tests.adapter.test_duplex import answer_chunk, routed, streamed
from tests.adapter.test_stream import sse
from tests.state.conftest import redis_store

TOOL_CALL = orjson.dumps({"model": "qwen3-32b", "choices": [{"message": {"tool_calls": [
    {"id": "call_j", "function": {"name": "t"}}]}, "finish_reason": "tool_calls"}]})
SSE_CALL = sse({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_s"}]}}]})


def shared_replica(config, url: str, prefix: str) -> Replica:
    """A replica whose shared store is ``url``; its background writer is never started."""
    parts = assemble(config, clock=time.time, shared=True)
    local = MemoryStore.from_config(config, time.time)
    return Replica(parts, StateLayer(local, redis_store(url, prefix), clock=time.time,
                                     metrics=parts.metrics, timeout=1.0))


@pytest.mark.parametrize(("answer", "kind", "call"), [
    (TOOL_CALL, "application/json", "call_j"),
    (SSE_CALL, "text/event-stream", "call_s"),
], ids=["json", "sse"])
async def test_a_binding_id_is_in_the_shared_store_before_its_chunk_passes(
        config, server, prefix, shared, answer, kind, call):
    """``shared``: another replica's client of the same store."""
    replica = shared_replica(config, server[1], prefix)
    stream = replica.stream()
    replies = await routed(stream, STREAMED if kind == "text/event-stream" else BODY)
    replay_id = replies[0].dynamic_metadata.fields["saar"].struct_value.fields[
        "replay_id"].string_value
    tenant = replica.replay.get(replay_id)["session"]["tenant"]
    key = owner_key(tenant, call)
    await stream.handle(response_headers("200", kind))
    passed = await stream.handle(answer_chunk(answer, kind == "application/json"))
    assert streamed(passed, "response_body")[0] == answer  # the client may have it now
    owners = (await shared.load(Query(None, (key,)))).owners
    assert owners[key].model == replica.owner(replay_id, call).model
    assert owners[key].worker == replica.owner(replay_id, call).worker
    stream.close()
    await replica.state.stop()


def continuation(call: str) -> bytes:
    """The session's next request: the result of the tool call ``call``."""
    return orjson.dumps({"model": "auto", "tools": TOOLS, "messages": [
        {"role": "user", "content": "refactor it"},
        {"role": "assistant", "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call, "content": "ok"}]})


async def test_a_streamed_answers_continuation_on_another_replica_goes_to_its_worker(
        config, server, prefix):
    """The observe stream that would claim a streamed answer's ids lags (here it never runs):
    the other replica waits its settle bound for the claim, then goes by the session's
    record, which the answer's commit put in the store before the client had a byte."""
    config = two_workers(config)
    first = shared_replica(config, server[1], prefix)
    other = shared_replica(config, server[1], prefix)
    for session in ("s0", "s1", "s2", "s3"):
        headers = {**CHAT, "x-session-id": session}
        stream = first.stream()
        await stream.handle(headers_msg(headers))
        reply = await stream.handle(body_msg(STREAMED))
        replay_id = reply.dynamic_metadata.fields["saar"].struct_value.fields[
            "replay_id"].string_value
        await stream.handle(response_headers("200", "text/event-stream"))
        issuer = first.replay.get(replay_id)["worker"]["picked"]
        follow = other.stream()
        await follow.handle(headers_msg(headers))
        replies = await follow.handle(body_msg(continuation(f"call_{session}")))
        assert isinstance(replies, list)  # held (settle) first, then routed
        reply = replies[-1]
        record = other.replay.get(reply.dynamic_metadata.fields["saar"].struct_value.fields[
            "replay_id"].string_value)
        assert (record["lock"], record["worker"]["picked"]) == ("tool_loop", issuer)
        stream.close()
        follow.close()
    await first.state.stop()
    await other.state.stop()
