"""Which requests are LLM API calls, told from their method and path, as Envoy normalises it.

Envoy's listener normalises every path before any filter sees it (``normalize_path``: RFC 3986
dot segments and percent-decoding of unreserved characters, ``merge_slashes``, and
``path_with_escaped_slashes_action: UNESCAPE_AND_FORWARD`` for ``%2F`` / ``%5C``); the
processor canonicalises once more the same way, plus case and a trailing slash, so the two
agree even behind a proxy configured otherwise. A variant of an API's path (``/V1/Chat/...``,
``/v1/chat/completions/``) is that API, and its ``:path`` is rewritten to the canonical one for
the upstream.

Three kinds of request:

* an **API** the router serves: ``POST /v1/chat/completions``, ``/v1/responses``,
  ``/v1/messages``;
* **passed through** to the default cluster untouched: every method but POST (``GET
  /v1/models``, ``GET`` / ``DELETE /v1/responses/{id}``…), and the stateless POSTs of
  ``PASS_THROUGH`` (embeddings, Anthropic's token count);
* **unknown**: any other POST that looks like an LLM call — under ``/v1/``, or ending like one
  of the APIs (``/chat/completions`` without ``/v1``) — answered 404 ``path_not_found`` in the
  client's format instead of reaching a model server with no body limit, no locks and no
  admission. Legacy ``/v1/completions`` and the provider-state operations on stored responses
  (``/v1/responses/{id}/cancel``) are among them: the router could not keep them with their
  session.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from ..types import API_PATHS, Api

PASS_THROUGH = frozenset({"/v1/embeddings", "/v1/messages/count_tokens"})
"""POSTs under /v1/ that carry no session state and generate nothing: forwarded as they are."""
_API_TAILS = ("/chat/completions", "/responses", "/messages", "/completions")
_SLASHES = re.compile(r"/{2,}")


@dataclass(frozen=True, slots=True)
class PathKind:
    api: Api | None = None
    """The API the router serves, or None."""
    path: str | None = None
    """The canonical path of that API, with the query, when it differs from the request's."""
    unknown: bool = False
    """An LLM-looking POST to nothing the router serves or passes: a 404."""


PASS = PathKind()


def canonical(path: str) -> str:
    """``path`` without its query, decoded, with slashes merged, dot segments resolved, lower
    case and no trailing slash: what two spellings of one endpoint have in common."""
    bare = unquote(path.split("?", 1)[0]).replace("\\", "/")
    merged = _SLASHES.sub("/", bare if bare.startswith("/") else "/" + bare)
    resolved = posixpath.normpath(merged)
    return resolved.lower().rstrip("/") or "/"


def classify(method: str, path: str) -> PathKind:
    """What the router does with a request to ``path``."""
    if method != "POST":
        return PASS
    api = API_PATHS.get(path.split("?", 1)[0])
    if api is not None:
        return PathKind(api)
    clean = canonical(path)
    api = API_PATHS.get(clean)
    if api is not None:
        query = path.partition("?")[2]
        return PathKind(api, clean + ("?" + query if query else ""))
    if clean in PASS_THROUGH:
        return PASS
    if clean.startswith("/v1/") or clean.endswith(_API_TAILS):
        return PathKind(unknown=True)
    return PASS


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
