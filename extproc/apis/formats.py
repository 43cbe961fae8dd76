"""The contract each API module fulfils, and the modules by ``Api``.

A new API is one module with these seven functions and one line in ``FORMATS``; ``parse``,
``observer`` and ``prompt`` dispatch through it and know no API's shape themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..types import Api, ResponseSummary
from . import chat, completions, messages, responses
from .common import Facts, Turn


class ApiFormat(Protocol):
    def parse(self, body: dict[str, Any]) -> Facts:
        """The API's facts of a JSON object body; ``MalformedRequest`` if it has not the
        API's shape (its entries are not an array of objects)."""
        ...

    def entries(self, body: dict[str, Any]) -> list[Any]:
        """The conversation's entries (messages or input items), in order; none if the body
        has no array of them (``parse`` rejects such a body, rendering does not)."""
        ...

    def tools(self, body: dict[str, Any]) -> list[Any]:
        """The tool definitions the body offers, as sent (``tools.offered`` reads them)."""
        ...

    def system(self, body: dict[str, Any]) -> Any:
        """The top-level system prompt (a string or text blocks), if the API has one."""
        ...

    def turns(self, entry: dict[str, Any]) -> Iterator[Turn]:
        """One entry as the prompt turns a chat template would render."""
        ...

    def document(self, summary: ResponseSummary, doc: dict[str, Any]) -> None:
        """Read a whole JSON answer into ``summary``. Never raises."""
        ...

    def event(self, summary: ResponseSummary, data: dict[str, Any]) -> bool:
        """Read one SSE event's data into ``summary``; True if it ends the answer. Never raises."""
        ...


FORMATS: dict[Api, ApiFormat] = {Api.CHAT: chat, Api.RESPONSES: responses, Api.MESSAGES: messages,
                                  Api.COMPLETIONS: completions}
