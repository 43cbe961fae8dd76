"""The contract each wire format fulfils, and the SSE framing they share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from ....types import RequestSummary
from ..reply import IdStyle, Reply


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event; ``event`` adds the ``event:`` line the Anthropic SDK dispatches on."""

    data: dict[str, Any] | str
    event: str | None = None

    def encode(self) -> bytes:
        data = self.data if isinstance(self.data, str) else orjson.dumps(self.data).decode()
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {data}\n\n".encode()


class ApiFormat(Protocol):
    """Writes a ``Reply`` the way one API's official SDK reads it."""

    ids: IdStyle

    def wants_reasoning(self, body: dict[str, Any]) -> bool:
        """Whether the request asked for provider-bound reasoning (encrypted or signed)."""
        ...

    def document(self, reply: Reply, summary: RequestSummary) -> dict[str, Any]:
        """The non-streaming response body."""
        ...

    def events(self, reply: Reply, summary: RequestSummary) -> Iterator[SseEvent]:
        """The streaming response, event by event."""
        ...

    def history(self, reply: Reply) -> list[dict[str, Any]]:
        """The reply as the client sends it back next turn (messages or input items)."""
        ...
