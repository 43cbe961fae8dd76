"""Issue 9, items 13 and 14, through the real Envoy with the official SDKs: path variants are
routed like the API they spell (the body limit, the locks), unknown LLM paths are a 404 in
the client's format, and the errors Envoy makes itself — a body over its buffer, an upstream
it cannot reach, the processor down — reach the SDKs as their API's JSON error, raised as
their typed errors with the message."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from extproc.dev.harness import Stack, run_stack
from tests.e2e.conftest import e2e_config

pytestmark = pytest.mark.e2e
HARD = "Please refactor the storage layer."
CHAT = {"model": "auto", "messages": [{"role": "user", "content": HARD}]}
OVER_ENVOYS_BUFFER = "x" * (33 << 20)


def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="key-edges", max_retries=0)


def claude(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="key-edges", max_retries=0)


@pytest.mark.parametrize("path", ["//v1//chat/completions", "/V1/Chat/Completions",
                                  "/v1/./chat/completions", "/v1/x/../chat/completions",
                                  "/v1%2Fchat%2Fcompletions", "/v1/chat/completions/"])
def test_a_path_variant_is_routed_as_its_api(stack, path):
    response = httpx.post(f"{stack.url}{path}", json=CHAT, timeout=10,
                          headers={"x-session-id": f"variant-{path}"})
    assert response.status_code == 200
    assert response.headers["x-saar-selected-model"] == "qwen3-32b"  # routed, rewritten
    assert response.json()["model"] == "qwen3-32b"


def test_a_path_variant_gets_the_body_limit(stack):
    big = {"model": "auto", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    response = httpx.post(f"{stack.url}//V1/chat/completions", json=big, timeout=10)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


def test_unknown_llm_paths_are_a_404_the_sdks_raise(stack):
    with pytest.raises(openai.NotFoundError) as info:
        oai(stack.url).batches.create(completion_window="24h", endpoint="/v1/chat/completions",
                                      input_file_id="file-1")
    assert info.value.body["code"] == "path_not_found"
    assert "Invalid URL (POST /v1/batches)" in info.value.message
    with pytest.raises(anthropic.NotFoundError) as found:
        claude(stack.url).messages.batches.create(requests=[])
    assert found.value.body["error"]["type"] == "not_found_error"
    assert "Invalid URL (POST /v1/messages/batches)" in found.value.message
    metrics = httpx.get(f"{stack.processor_http}/metrics").text
    assert 'saar_errors_total{code="path_not_found"}' in metrics


def test_stateless_endpoints_pass_through(stack):
    assert httpx.get(f"{stack.url}/v1/models").json()["data"]
    response = httpx.post(f"{stack.url}/v1/embeddings", json={"model": "m", "input": "x"})
    assert "x-sim-instance" in response.headers  # it reached a model server, unrouted
    assert "x-replay-id" not in response.headers


def test_a_body_over_envoys_buffer_is_the_sdks_413(stack):
    with pytest.raises(openai.APIStatusError) as info:
        oai(stack.url).chat.completions.create(
            model="auto", messages=[{"role": "user", "content": OVER_ENVOYS_BUFFER}])
    assert info.value.status_code == 413
    assert info.value.body["code"] == "body_too_large"
    assert "buffer limit" in info.value.message
    with pytest.raises(anthropic.ContentTooLargeError) as too_large:
        claude(stack.url).messages.create(
            model="auto", max_tokens=8,
            messages=[{"role": "user", "content": OVER_ENVOYS_BUFFER}])
    assert too_large.value.body["error"]["type"] == "request_too_large"
    assert "buffer limit" in too_large.value.message


def test_the_processors_own_errors_are_left_as_they_are(stack):
    response = httpx.post(f"{stack.url}/v1/messages", json={"model": "gpt-17", "messages": []})
    assert response.status_code == 404
    assert response.json() == {"type": "error", "error": {
        "type": "not_found_error", "message": "The model `gpt-17` does not exist."}}


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Iterator[Stack]:
    """A stack of its own, to break: its qwen3-8b worker is stopped for good."""
    with run_stack(e2e_config(), workdir=tmp_path_factory.mktemp("edges")) as running:
        next(s for s in running.services if s.name == "sim-qwen3-8b-0").stop()
        yield running


def test_an_unreachable_upstream_is_the_sdks_typed_503(broken):
    with pytest.raises(openai.InternalServerError) as info:
        oai(broken.url).chat.completions.create(
            model="qwen3-8b", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 503
    assert info.value.body["code"] == "upstream_unavailable"
    assert "no model server answered" in info.value.message
    assert info.value.response.headers["x-replay-id"].startswith("rp-")  # it was routed
    with pytest.raises(anthropic.ServiceUnavailableError) as unavailable:
        claude(broken.url).messages.create(
            model="qwen3-8b", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert unavailable.value.body["error"]["type"] == "overloaded_error"
    assert "no model server answered" in unavailable.value.message


def test_the_processor_down_is_the_sdks_typed_503_with_retry_after(broken):
    broken.processors[0].service.stop()
    with pytest.raises(openai.InternalServerError) as info:
        oai(broken.url).chat.completions.create(**CHAT)
    assert info.value.status_code == 503
    assert info.value.body["code"] == "router_unavailable"
    assert "the router could not be reached" in info.value.message
    assert info.value.response.headers["retry-after"] == "2"
    with pytest.raises(anthropic.ServiceUnavailableError) as unavailable:
        claude(broken.url).messages.create(
            model="auto", max_tokens=8, messages=[{"role": "user", "content": HARD}])
    assert unavailable.value.body["error"]["type"] == "overloaded_error"
    assert "the router could not be reached" in unavailable.value.message
