"""Issue 2 end to end: routing, rewriting, diagnostics, spoofing, streaming and errors."""

from __future__ import annotations

import httpx
import pytest
from anthropic import Anthropic
from openai import OpenAI

from extproc.adapter.contract import DIAGNOSTIC_HEADERS, WORKER_HEADER
from tests.e2e.conftest import get_json, replay_outcome

pytestmark = pytest.mark.e2e
HARD = "Please refactor the storage layer."


def openai_client(stack, session: str = "e2e", **headers: str) -> OpenAI:
    return OpenAI(base_url=f"{stack.url}/v1", api_key="key-1", max_retries=0,
                  default_headers={"x-session-id": session, **headers})


def test_routes_auto_to_a_physical_model_with_every_diagnostic(stack):
    raw = openai_client(stack, "diag").chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": HARD}])
    completion = raw.parse()
    # The simulator answers 404 unless the body names its own model: the rewrite happened.
    assert completion.model == "qwen3-32b"
    for name in [*DIAGNOSTIC_HEADERS, WORKER_HEADER]:
        assert raw.headers.get(name), name
    assert raw.headers["x-saar-selected-model"] == "qwen3-32b"
    assert raw.headers["x-saar-action"] == "new"
    assert raw.headers["x-saar-worker"] == stack.sims["qwen3-32b"][0].removeprefix("http://")
    assert raw.headers["x-sim-instance"] == "qwen3-32b-0"
    assert int(raw.headers["x-saar-context-tokens"]) > 0
    record = replay_outcome(stack, raw.headers["x-replay-id"])
    assert record["model"] == "qwen3-32b"
    assert record["outcome"]["status"] == 200


def test_spoofed_routing_headers_never_reach_routing_or_upstream(stack):
    spoof = {"x-saar-cluster": "qwen3-8b", "x-gateway-destination-endpoint": "10.0.0.1:80",
             "x-saar-selected-model": "forged", "x-replay-id": "forged"}
    raw = openai_client(stack, "spoof", **spoof).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": HARD}])
    assert raw.parse().model == "qwen3-32b"
    assert raw.headers["x-saar-selected-model"] == "qwen3-32b"
    assert raw.headers["x-replay-id"] != "forged"
    seen = get_json(f"{stack.sims['qwen3-32b'][0]}/admin/state")["last_request_headers"]
    assert "x-gateway-destination-endpoint" not in seen
    assert "x-saar-selected-model" not in seen
    assert seen.get("x-saar-cluster") == "qwen3-32b"


def test_physical_model_passes_through(stack):
    raw = openai_client(stack, "direct").chat.completions.with_raw_response.create(
        model="qwen3-8b", messages=[{"role": "user", "content": HARD}])
    assert raw.parse().model == "qwen3-8b"
    assert raw.headers["x-saar-decision"] == "direct"


def test_streaming_chat_keeps_chunks_and_diagnostics(stack):
    client = openai_client(stack, "stream")
    with client.chat.completions.with_streaming_response.create(
        model="auto", messages=[{"role": "user", "content": HARD}], stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers["x-saar-selected-model"] == "qwen3-32b"
        chunks = list(response.parse())
        replay_id = response.headers["x-replay-id"]
    assert len(chunks) > 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None
    outcome = replay_outcome(stack, replay_id, until=("usage",))["outcome"]
    assert outcome["usage"]["prompt_tokens"] == chunks[-1].usage.prompt_tokens


def test_anthropic_tool_loop_stays_on_the_issuing_model(stack):
    client = Anthropic(base_url=stack.url, api_key="key-2", max_retries=0,
                       default_headers={"x-claude-code-session-id": "claude-1"})
    tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
    messages = [{"role": "user", "content": HARD}]
    raw = client.messages.with_raw_response.create(
        model="auto", max_tokens=64, messages=messages, tools=tools)
    first = raw.parse()
    tool_use = next(b for b in first.content if b.type == "tool_use")
    assert first.model == "qwen3-32b"
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                      "content": "ok"}]},
    ]
    raw = client.messages.with_raw_response.create(
        model="auto", max_tokens=64, messages=messages, tools=tools)
    assert raw.parse().model == "qwen3-32b"
    assert raw.headers["x-saar-action"] == "locked_keep"
    assert raw.headers["x-saar-session-phase"] == "tool_loop"
    assert raw.headers["x-sim-continuity-violations"] == "0"


def test_non_llm_paths_pass_through(stack):
    response = httpx.get(f"{stack.url}/v1/models")
    assert response.status_code == 200
    assert response.json()["data"]


@pytest.mark.parametrize(
    ("path", "content", "status", "check"),
    [
        ("/v1/chat/completions", b"{not json", 400,
         lambda j: j["error"]["code"] == "malformed_request"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}', 400,
         lambda j: j["error"]["code"] == "missing_model"),
        ("/v1/chat/completions",
         b'{"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}', 404,
         lambda j: j["error"]["code"] == "model_not_found"),
        ("/v1/messages", b"{not json", 400,
         lambda j: j["type"] == "error" and j["error"]["type"] == "invalid_request_error"),
        ("/v1/chat/completions", b'{"model": "auto", "messages": [{"role": "user", "content": "'
         + b"x" * (2 << 20) + b'"}]}', 413, lambda j: j["error"]["code"] == "body_too_large"),
    ],
)
def test_errors_in_the_clients_format(stack, path, content, status, check):
    response = httpx.post(f"{stack.url}{path}", content=content,
                          headers={"content-type": "application/json"}, timeout=10)
    assert response.status_code == status
    assert check(response.json())


def test_sdk_error_types(stack):
    import anthropic
    import openai

    with pytest.raises(openai.NotFoundError):
        openai_client(stack).chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}])
    client = Anthropic(base_url=stack.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="no-such-model", max_tokens=8,
                               messages=[{"role": "user", "content": "x"}])
    assert info.value.body["error"]["type"] == "not_found_error"


def test_processor_metrics_count_what_happened(stack):
    text = httpx.get(f"{stack.processor_http}/metrics").text
    assert 'saar_stripped_headers_total{header="x-saar-cluster"}' in text
    assert 'saar_errors_total{code="malformed_request"}' in text
    assert 'saar_locks_total{kind="tool_loop"}' in text
