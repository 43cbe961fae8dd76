"""Errors the router answers itself, each with one HTTP status and a body in the client's format.

    RoutingError                 (base; never raised directly)
    ├── MalformedRequest   400   body is not JSON, or not the shape of its API
    ├── MissingModel       400   no "model" field
    ├── ContextTooLong     400   the context fits no candidate model's window
    ├── BodyTooLarge       413   body over ``limits.max_body_bytes``
    ├── UnknownModel       404   model is neither a logical nor a physical model
    ├── PathNotFound       404   a POST under /v1/ that is no API the router serves or passes
    ├── RateLimited        429   load shedding (carries Retry-After)
    │   ├── SessionPaused  429   admission paused the session (held, or answered with this)
    │   └── TenantBusy     429   the tenant has its share of large bodies in flight
    └── ModelUnavailable   503   no backend for the model (Retry-After)
        └── LockedModelDown 503  the model a session is locked to is down (held, then this)

``document`` is the one place that shapes an error body: the processor's answers use it, and
the Envoy bootstrap renders Envoy's own local replies (processor down, upstream unreachable,
over the buffer) with it, so a client sees its API's JSON error either way.
"""

from __future__ import annotations

from typing import Any

import orjson

from .adapter.contract import DROP_REASON_HEADER

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_OPENAI_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


def error_type(style: str, status: int) -> str:
    """The ``error.type`` a client of ``style`` expects for ``status``."""
    if style == "anthropic":
        return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else
                                    "invalid_request_error")
    return _OPENAI_TYPES.get(status, "server_error" if status >= 500 else
                             "invalid_request_error")


def document(style: str, status: int, code: str, message: str) -> dict[str, Any]:
    """An error body as the client's SDK reads it: Anthropic's ``{"type": "error", "error":
    {type, message}}`` or OpenAI's ``{"error": {message, type, param, code}}``."""
    kind = error_type(style, status)
    if style == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


SHOWN_CHARS = 128


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """A client-supplied value as an error message quotes it: never more than ``limit``
    characters, so a 1 MB model name is not echoed back whole."""
    return value if len(value) <= limit else f"{value[:limit]}… ({len(value)} characters)"


class RoutingError(Exception):
    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.replay_id: str | None = None
        """The replay record of the decision this error answers, when one was recorded."""

    def body(self, style: str) -> bytes:
        """The error as the client's SDK expects to read it (``openai`` or ``anthropic``)."""
        return orjson.dumps(document(style, self.status, self.code, self.message))

    def headers(self) -> dict[str, str]:
        out = {"content-type": "application/json"}
        if self.retry_after is not None:
            out["retry-after"] = str(self.retry_after)
        return out


class MalformedRequest(RoutingError):
    status = 400
    code = "malformed_request"


class MissingModel(RoutingError):
    status = 400
    code = "missing_model"


class ContextTooLong(RoutingError):
    """Not a 503: retrying never makes a context shorter (SDKs retry 503s forever)."""

    status = 400
    code = "context_length_exceeded"


class BodyTooLarge(RoutingError):
    status = 413
    code = "body_too_large"


class UnknownModel(RoutingError):
    status = 404
    code = "model_not_found"


class PathNotFound(RoutingError):
    """An LLM-looking POST (under ``/v1/``) to no API the router serves or passes through:
    never forwarded to a default cluster without the body limit, the locks and admission."""

    status = 404
    code = "path_not_found"


class RateLimited(RoutingError):
    status = 429
    code = "rate_limited"


class TenantBusy(RateLimited):
    """The tenant already has its share of large bodies being read and routed."""

    code = "tenant_busy"


class RequestShed(RateLimited):
    """Flow control dropped the request (its pool saturated, its queue full, its wait past
    its class's TTL or its deadline, or no worker predicted to meet its TTFT target): 429
    with ``Retry-After`` and the reason in the drop-reason header."""

    code = "request_shed"

    def __init__(self, message: str, *, reason: str, klass: str, model: str, decision: Any,
                 retry_after: int = 1) -> None:
        super().__init__(message, retry_after=retry_after)
        self.reason = reason
        self.klass = klass
        self.model = model
        self.decision = decision
        self.wake: tuple[str, ...] = ()
        """Queued tickets its refusal dispatched or evicted (their holders wake)."""

    def headers(self) -> dict[str, str]:
        return {**super().headers(), DROP_REASON_HEADER: self.reason}


class ModelUnavailable(RoutingError):
    status = 503
    code = "model_unavailable"


class LockedModelDown(ModelUnavailable):
    """The model a hard lock binds the request to is taken out by model health: the request
    is held until the model comes back (at most ``health.locked_hold_seconds``), then
    answered with this. ``decision`` is the lock's decision, recorded for the replay."""

    def __init__(self, message: str, *, model: str, decision: Any, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)
        self.model = model
        self.decision = decision


class SessionPaused(RateLimited):
    """Admission paused this session at its tool boundary: hold the request or answer 429."""

    code = "session_paused"

    def __init__(self, session_key: str, retry_after: int) -> None:
        super().__init__(
            "this session is paused while its worker is oversubscribed; retry shortly",
            retry_after=retry_after,
        )
        self.session_key = session_key
