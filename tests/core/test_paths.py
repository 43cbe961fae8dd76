"""Issue 9, item 13: which requests are LLM API calls, whatever the spelling of their path;
issue 29: the other OpenAI paths, routed, sent to an issuer or passed through as the peer
routers pass them."""

from __future__ import annotations

import pytest

from extproc.core.paths import PASS, PathKind, canonical, classify, error_style
from extproc.types import Api

UNKNOWN = PathKind(unknown=True)


def stored(response_id: str, path: str | None = None) -> PathKind:
    return PathKind(path=path, response_id=response_id)


@pytest.mark.parametrize(("method", "path", "kind"), [
    ("POST", "/v1/chat/completions", PathKind(Api.CHAT)),
    ("POST", "/v1/chat/completions?api-version=1", PathKind(Api.CHAT)),
    ("POST", "/v1/responses", PathKind(Api.RESPONSES)),
    ("POST", "/v1/messages", PathKind(Api.MESSAGES)),
    ("POST", "/v1/completions", PathKind(Api.COMPLETIONS)),
    ("POST", "/V1/Completions/", PathKind(Api.COMPLETIONS, "/v1/completions")),
    ("POST", "/V1/Chat/Completions", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "//v1//chat/completions", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "/v1/./chat/completions", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "/v1/x/../responses", PathKind(Api.RESPONSES, "/v1/responses")),
    ("POST", "/v1%2Fchat%2Fcompletions", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "/v1%5cmessages", PathKind(Api.MESSAGES, "/v1/messages")),
    ("POST", "/v1/chat/completions/", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "/V1/messages?beta=true", PathKind(Api.MESSAGES, "/v1/messages?beta=true")),
    # A stored response: its id is provider-bound, so its issuer answers (case kept).
    ("GET", "/v1/responses/resp_AbC", stored("resp_AbC")),
    ("DELETE", "/v1/responses/resp_1", stored("resp_1")),
    ("GET", "/v1/responses/resp_1/input_items?limit=5", stored("resp_1")),
    ("POST", "/v1/responses/resp_1/cancel", stored("resp_1")),
    ("GET", "/V1/Responses/resp_AbC/", stored("resp_AbC", "/v1/responses/resp_AbC")),
    ("POST", "/v1%2Fresponses%2Fresp_1%2FCancel?x=1",
     stored("resp_1", "/v1/responses/resp_1/cancel?x=1")),
    # Passed through: other methods, and the stateless POSTs.
    ("GET", "/v1/models", PASS),
    ("GET", "/v1/chat/completions", PASS),
    ("GET", "/v1/responses", PASS),
    ("PUT", "/v1/responses/resp_1", PASS),
    ("GET", "/v1/responses/resp_1/cancel", PASS),
    ("POST", "/v1/embeddings", PASS),
    ("POST", "/V1/Embeddings", PASS),
    ("POST", "/v1/messages/count_tokens", PASS),
    ("POST", "/v1/responses/input_tokens", PASS),
    ("POST", "/v1/tokenize", PASS),
    ("POST", "/v1/detokenize", PASS),
    ("POST", "/v1/rerank", PASS),
    ("POST", "/v1/score", PASS),
    ("POST", "/v1/moderations", PASS),
    ("POST", "/v1/audio/transcriptions", PASS),
    ("POST", "/v1/audio/translations", PASS),
    ("POST", "/v1/audio/speech", PASS),
    ("POST", "/v1/images/generations", PASS),
    ("POST", "/healthz", PASS),
    ("POST", "/tokenize", PASS),
    ("POST", "/v2/rerank", PASS),
    # LLM-looking and unknown: 404.
    ("POST", "/v1/chat/complete", UNKNOWN),
    ("POST", "/v1/files", UNKNOWN),
    ("POST", "/v1/batches", UNKNOWN),
    ("POST", "/v1/conversations", UNKNOWN),
    ("POST", "/v1/responses/resp_1", UNKNOWN),
    ("POST", "/v1/responses/compact", UNKNOWN),
    ("POST", "/v1/chat/completions/chatcmpl-1", UNKNOWN),
    ("POST", "/v1/messages/batches", UNKNOWN),
    ("POST", "/v1/audio", UNKNOWN),
    ("POST", "/chat/completions", UNKNOWN),
    ("POST", "/completions", UNKNOWN),
    ("POST", "/openai/v1/chat/completions", UNKNOWN),
    ("POST", "/api/messages", UNKNOWN),
])
def test_classify(method, path, kind):
    assert classify(method, path) == kind


@pytest.mark.parametrize(("path", "clean"), [
    ("/", "/"), ("", "/"), ("v1/models", "/v1/models"), ("/v1/../..", "/"),
    ("///V1///Models///", "/v1/models"), ("/v1/models?x=/y", "/v1/models"),
])
def test_canonical(path, clean):
    assert canonical(path) == clean


def test_error_style_of_an_unknown_path():
    assert error_style("/v1/messages/batches", {}) == "anthropic"
    assert error_style("/v1/complete", {"anthropic-version": "2023-06-01"}) == "anthropic"
    assert error_style("/v1/completions", {}) == "openai"
