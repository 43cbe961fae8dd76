"""Which requests are LLM API calls, told from their method and path, as Envoy normalises it.

Envoy's listener normalises every path before any filter sees it (``normalize_path``: RFC 3986
dot segments and percent-decoding of unreserved characters, ``merge_slashes``, and
``path_with_escaped_slashes_action: UNESCAPE_AND_FORWARD`` for ``%2F`` / ``%5C``); the
processor canonicalises once more the same way, plus case and a trailing slash, so the two
agree even behind a proxy configured otherwise. A variant of an API's path (``/V1/Chat/...``,
``/v1/chat/completions/``) is that API, and its ``:path`` is rewritten to the canonical one for
the upstream.

Four kinds of request:

* an **API** the router serves: ``POST /v1/chat/completions``, ``/v1/responses``,
  ``/v1/messages`` and the legacy ``/v1/completions``;
* an operation on a **stored response** (``GET`` / ``DELETE /v1/responses/{id}``, ``GET
  /v1/responses/{id}/input_items``, ``POST /v1/responses/{id}/cancel``): the id is
  provider-bound, so the request goes to the model and worker whose answer issued it, as a
  hard lock sends a turn (``Router.issuer``); one the router does not know passes through;
* **passed through** to the default cluster untouched: every other method (``GET
  /v1/models``…), and the stateless POSTs of ``PASS_THROUGH`` and ``PASS_THROUGH_PREFIXES``
  (embeddings, token counts, vLLM's tokenizer, rerank and score, moderations, audio, images);
* **unknown**: any other POST that looks like an LLM call — under ``/v1/``, or ending like one
  of the APIs (``/chat/completions`` without ``/v1``) — answered 404 ``path_not_found`` in the
  client's format instead of reaching a model server with no body limit, no locks and no
  admission. Provider storage is among them (``/v1/files``, ``/v1/batches``, Anthropic's
  message batches, ``/v1/conversations``, ``/v1/responses/compact``): what one worker of a
  pool stored, another cannot serve, and no answer the router read issued those ids.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ..types import API_PATHS, Api

PASS_THROUGH = frozenset({
    "/v1/embeddings", "/v1/messages/count_tokens", "/v1/responses/input_tokens",
    "/v1/tokenize", "/v1/detokenize", "/v1/rerank", "/v1/score", "/v1/moderations",
})
"""POSTs under /v1/ that carry no session state and continue no conversation: forwarded as
they are, as every peer router forwards them."""
PASS_THROUGH_PREFIXES = ("/v1/audio/", "/v1/images/")
"""Families of stateless POSTs (speech, transcriptions, translations; image generations and
edits): forwarded as they are."""
STORED_RESPONSE_OPERATIONS = frozenset({
    ("GET", ""), ("DELETE", ""), ("GET", "input_items"), ("POST", "cancel"),
})
"""(method, what follows the id) of the operations on ``/v1/responses/{id}``."""
_API_TAILS = ("/chat/completions", "/responses", "/messages", "/completions")
_SLASHES = re.compile(r"/{2,}")


@dataclass(frozen=True, slots=True)
class PathKind:
    api: Api | None = None
    """The API the router serves, or None."""
    path: str | None = None
    """The canonical path, with the query, when it differs from the request's."""
    unknown: bool = False
    """An LLM-looking POST to nothing the router serves or passes: a 404."""
    response_id: str | None = None
    """The stored response the path names, as sent (ids are case-sensitive): its issuer
    answers the request."""


PASS = PathKind()


def canonical(path: str) -> str:
    """``path`` without its query, decoded, with slashes merged, dot segments resolved, lower
    case and no trailing slash: what two spellings of one endpoint have in common."""
    return _normalised(path).lower()


def _normalised(path: str) -> str:
    """``canonical`` with the case kept (an id in the path keeps its own)."""
    bare = unquote(path.split("?", 1)[0]).replace("\\", "/")
    merged = _SLASHES.sub("/", bare if bare.startswith("/") else "/" + bare)
    return posixpath.normpath(merged).rstrip("/") or "/"


def classify(method: str, path: str) -> PathKind:
    """What the router does with a request to ``path``."""
    stored = _stored_response(method, path)
    if stored is not None:
        return stored
    if method != "POST":
        return PASS
    api = API_PATHS.get(path.split("?", 1)[0])
    if api is not None:
        return PathKind(api)
    clean = canonical(path)
    api = API_PATHS.get(clean)
    if api is not None:
        return PathKind(api, _with_query(clean, path))
    if clean in PASS_THROUGH or clean.startswith(PASS_THROUGH_PREFIXES):
        return PASS
    if clean.startswith("/v1/") or clean.endswith(_API_TAILS):
        return PathKind(unknown=True)
    return PASS


def _stored_response(method: str, path: str) -> PathKind | None:
    """An operation on ``/v1/responses/{id}``: the id, and the canonical path (its case
    kept) when the request spells it otherwise; None for any other request."""
    parts = _normalised(path).split("/")  # "", "v1", "responses", id[, operation]
    if len(parts) not in (4, 5) or parts[1].lower() != "v1" or parts[2].lower() != "responses":
        return None
    operation = parts[4].lower() if len(parts) == 5 else ""
    if (method, operation) not in STORED_RESPONSE_OPERATIONS:
        return None
    named = "/".join(("/v1/responses", quote(parts[3], safe=""), operation)).rstrip("/")
    clean = _with_query(named, path)
    return PathKind(path=None if clean == path else clean, response_id=parts[3])


def _with_query(clean: str, path: str) -> str:
    query = path.partition("?")[2]
    return clean + ("?" + query if query else "")


def api_for(method: str, path: str) -> Api | None:
    """The LLM API of a request, or None for traffic that passes through untouched (or is
    refused as an unknown path)."""
    return classify(method, path).api


def error_style(path: str, headers: Mapping[str, str]) -> str:
    """The error format of a request whose API is unknown: Anthropic's for its paths and for
    its SDK (``anthropic-version``), OpenAI's elsewhere."""
    if "anthropic-version" in headers or canonical(path).startswith("/v1/messages"):
        return "anthropic"
    return "openai"
