"""The wire formats the simulator speaks, keyed by API."""

from __future__ import annotations

from ....types import Api
from .base import ApiFormat, SseEvent
from .chat import ChatFormat
from .completions import CompletionsFormat
from .messages import MessagesFormat
from .responses import ResponsesFormat

FORMATS: dict[Api, ApiFormat] = {
    Api.CHAT: ChatFormat(),
    Api.RESPONSES: ResponsesFormat(),
    Api.MESSAGES: MessagesFormat(),
    Api.COMPLETIONS: CompletionsFormat(),
}

__all__ = ["FORMATS", "ApiFormat", "SseEvent"]
