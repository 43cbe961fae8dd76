"""Errors the router answers itself, each with one HTTP status and a body in the client's format.

    RoutingError                 (base; never raised directly)
    ├── MalformedRequest   400   body is not JSON, or not the shape of its API
    ├── MissingModel       400   no "model" field
    ├── ContextTooLong     400   the context fits no candidate model's window
    ├── BodyTooLarge       413   body over ``limits.max_body_bytes``
    ├── UnknownModel       404   model is neither a logical nor a physical model
    ├── RateLimited        429   load shedding (carries Retry-After)
    │   └── SessionPaused  429   admission paused the session (held, or answered with this)
    └── ModelUnavailable   503   the model a session is locked to has no backend (Retry-After)
"""

from __future__ import annotations

import orjson

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

    def body(self, style: str) -> bytes:
        """The error as the client's SDK expects to read it (``openai`` or ``anthropic``)."""
        if style == "anthropic":
            kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
            return orjson.dumps({"type": "error", "error": {"type": kind, "message": self.message}})
        kind = _OPENAI_TYPES.get(self.status, "server_error")
        return orjson.dumps(
            {"error": {"message": self.message, "type": kind, "param": None, "code": self.code}}
        )

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


class RateLimited(RoutingError):
    status = 429
    code = "rate_limited"


class ModelUnavailable(RoutingError):
    status = 503
    code = "model_unavailable"


class SessionPaused(RateLimited):
    """Admission paused this session at its tool boundary: hold the request or answer 429."""

    code = "session_paused"

    def __init__(self, session_key: str, retry_after: int) -> None:
        super().__init__(
            "this session is paused while its worker is oversubscribed; retry shortly",
            retry_after=retry_after,
        )
        self.session_key = session_key
