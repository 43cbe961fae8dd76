"""Issue 9's property test through the servicer: 10,000 generated bodies and headers fed to a
stream (codec, loop and exchange) as Envoy sends them. Never an ``internal_error``; every error
in the client's format (Anthropic's on /v1/messages, OpenAI's elsewhere) with a client status;
a rewritten body equal to the original except its model; a client's routing headers always
removed."""

from __future__ import annotations

from random import Random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.assembly import assemble
from tests.adapter.support import Replica, body_msg, headers_msg
from tests.apis.generate import JsonText, Shapes, join

PATHS = {"/v1/chat/completions": 0, "/v1/responses": 1, "/v1/messages": 2}
SPOOFS = ("x-saar-cluster", "x-gateway-destination-endpoint", "x-saar-selected-model",
          "x-saar-anything", "x-gateway-model-name")
SESSION_HEADERS = ("x-session-id", "x-dynamo-session-id", "x-claude-code-session-id",
                   "thread-id", "x-claude-code-agent-id", "x-dynamo-session-final",
                   "x-codex-turn-metadata", "authorization", "x-api-key")
CLIENT_STATUSES = {400, 404, 413, 429, 503}


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None)


@pytest.fixture(scope="module")
def replica(session_config):
    from tests.conftest import FakeClock

    return Replica(assemble(session_config, clock=FakeClock()))


@pytest.fixture(scope="module")
def session_config():
    from extproc.config import parse_config
    from tests.conftest import session_config_data

    data = session_config_data()
    data["limits"]["max_body_bytes"] = 1 << 16
    return parse_config(data)


def headers(r: Random, path: str) -> dict[str, str]:
    text = JsonText(r)
    out = {":method": "POST", ":path": path, "content-type": "application/json"}
    for name in r.sample(SESSION_HEADERS, r.randrange(4)):
        out[name] = text.text() if r.random() < 0.7 else "x" * r.randrange(200, 600)
    for name in r.sample(SPOOFS, r.randrange(3)):
        out[name] = "10.9.9.9:80"
    return out


def body(r: Random, api_index: int) -> bytes:
    if r.random() < 0.7:
        raw = orjson.dumps(Shapes(r).request(api_index))
    else:
        members = JsonText(r).members()
        members.insert(r.randrange(len(members) + 1), (b'"model"', b'"auto"'))
        raw = join(members, r)
    if r.random() < 0.05:
        raw = raw[: r.randrange(len(raw) + 1)]  # cut short: not JSON any more
    return raw


async def drive(replica: Replica, path: str, sent: dict[str, str], raw: bytes) -> None:
    stream = replica.stream()
    first = await stream.handle(headers_msg(sent))
    if first.HasField("immediate_response"):
        check_error(first.immediate_response, path)
        return
    removed = set(first.request_headers.response.header_mutation.remove_headers)
    assert {h for h in sent if h in SPOOFS or h.startswith("x-saar-")} <= removed
    reply = await stream.handle(body_msg(raw))
    stream.close()
    if reply.HasField("immediate_response"):
        check_error(reply.immediate_response, path)
        return
    common = reply.request_body.response
    if common.body_mutation.body:
        rewritten = orjson.loads(common.body_mutation.body)
        original = orjson.loads(raw)
        assert rewritten == {**original, "model": rewritten["model"]}
        assert rewritten["model"] in replica.parts.config.models


def check_error(immediate, path: str) -> None:
    assert immediate.status.code in CLIENT_STATUSES, immediate.body[:300]
    payload = orjson.loads(immediate.body)
    if path == "/v1/messages":
        assert payload["type"] == "error" and payload["error"]["message"]
    else:
        assert payload["error"]["code"] != "internal_error" and payload["error"]["message"]
    assert len(immediate.body) < 4096  # nothing of the client's echoed back whole


@fuzz(10_000)
@given(st.randoms(use_true_random=True))
async def test_generated_requests_never_fail_inside_and_only_model_changes(replica, r):
    path = r.choice(list(PATHS))
    await drive(replica, path, headers(r, path), body(r, PATHS[path]))
    metrics = replica.parts.metrics
    assert metrics.errors.labels("internal_error")._value.get() == 0
    assert metrics.stream_failures._value.get() == 0
