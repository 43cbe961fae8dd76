"""Issue 9, item 13: which requests are LLM API calls, whatever the spelling of their path."""

from __future__ import annotations

import pytest

from extproc.core.paths import PASS, PathKind, canonical, classify, error_style
from extproc.types import Api

UNKNOWN = PathKind(unknown=True)


@pytest.mark.parametrize(("method", "path", "kind"), [
    ("POST", "/v1/chat/completions", PathKind(Api.CHAT)),
    ("POST", "/v1/chat/completions?api-version=1", PathKind(Api.CHAT)),
    ("POST", "/v1/responses", PathKind(Api.RESPONSES)),
    ("POST", "/v1/messages", PathKind(Api.MESSAGES)),
    ("POST", "/V1/Chat/Completions", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "//v1//chat/completions", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "/v1/./chat/completions", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "/v1/x/../responses", PathKind(Api.RESPONSES, "/v1/responses")),
    ("POST", "/v1%2Fchat%2Fcompletions", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "/v1%5cmessages", PathKind(Api.MESSAGES, "/v1/messages")),
    ("POST", "/v1/chat/completions/", PathKind(Api.CHAT, "/v1/chat/completions")),
    ("POST", "/V1/messages?beta=true", PathKind(Api.MESSAGES, "/v1/messages?beta=true")),
    # Passed through: other methods, and the stateless POSTs.
    ("GET", "/v1/models", PASS),
    ("GET", "/v1/chat/completions", PASS),
    ("DELETE", "/v1/responses/resp_1", PASS),
    ("POST", "/v1/embeddings", PASS),
    ("POST", "/V1/Embeddings", PASS),
    ("POST", "/v1/messages/count_tokens", PASS),
    ("POST", "/healthz", PASS),
    ("POST", "/tokenize", PASS),
    # LLM-looking and unknown: 404.
    ("POST", "/v1/completions", UNKNOWN),
    ("POST", "/v1/chat/complete", UNKNOWN),
    ("POST", "/v1/files", UNKNOWN),
    ("POST", "/v1/responses/resp_1/cancel", UNKNOWN),
    ("POST", "/v1/messages/batches", UNKNOWN),
    ("POST", "/chat/completions", UNKNOWN),
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
