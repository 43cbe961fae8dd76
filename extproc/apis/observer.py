"""Reads what a model sent back, whole or as an SSE stream, into a ``ResponseSummary``.

The router needs three things from a response: the ids the model now owns (tool calls, the
response id, provider-bound reasoning), the usage it reported (cached tokens included) and how it
finished. Chunks are fed as they pass through; nothing is buffered for a stream beyond one
partial line. This module does the framing; each API's module reads its documents and events.
An upstream's answer is as untrusted as a client's body: nothing here raises on its content.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..types import Api, ResponseSummary
from .common import nonempty_str
from .formats import FORMATS

MAX_BUFFERED_BODY = 16 * 1024 * 1024


class ResponseObserver:
    """Feed body chunks with ``feed``; ``summary`` is complete once ``done``.

    ``done`` does not wait for the end of the HTTP body: a client that stops reading at the
    stream's terminal event (``[DONE]``, ``response.completed``, ``message_stop``) and hangs up
    leaves Envoy without an end-of-stream, so the terminal event completes the response.
    """

    def __init__(self, api: Api, *, streaming: bool) -> None:
        self.api = api
        self.streaming = streaming
        self.summary = ResponseSummary()
        self.done = False
        self._format = FORMATS[api]
        self._buffer = bytearray()
        self._overflow = False

    def feed(self, chunk: bytes, *, end: bool = False) -> None:
        if self.done:
            return
        if self.streaming:
            self._buffer += chunk
            *lines, rest = self._buffer.split(b"\n")
            self._buffer = bytearray(rest)
            for line in lines:
                self._on_line(bytes(line))
            if end and self._buffer:
                self._on_line(bytes(self._buffer))
                self._buffer.clear()
            self.done = self.done or end
            return
        if len(self._buffer) + len(chunk) > MAX_BUFFERED_BODY:
            self._overflow = True
        if not self._overflow:
            self._buffer += chunk
        if end:
            if not self._overflow:
                doc = _load(bytes(self._buffer))
                self.summary.model = nonempty_str(doc.get("model")) or self.summary.model
                self._format.document(self.summary, doc)
            self._buffer.clear()
            self.done = True

    def _on_line(self, line: bytes) -> None:
        if self.done:
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
        elif payload:
            self.done = self._format.event(self.summary, _load(payload))


def _load(data: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}
