"""Reads what a model sent back, whole or as an SSE stream, into a ``ResponseSummary``.

The router needs three things from a response: the ids the model now owns (tool calls, the
response id, provider-bound reasoning), the usage it reported (cached tokens included) and how it
finished. Chunks are fed as they pass through; nothing is buffered for a stream beyond one
partial line.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..types import Api, ResponseSummary, Usage
from .request import fingerprint

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
                self._on_document(self._load(bytes(self._buffer)))
            self._buffer.clear()
            self.done = True

    @staticmethod
    def _load(data: bytes) -> dict[str, Any]:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return {}
        return doc if isinstance(doc, dict) else {}

    def _on_line(self, line: bytes) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
        elif payload:
            self._on_event(self._load(payload))

    # -- whole documents -------------------------------------------------------------------

    def _on_document(self, doc: dict[str, Any]) -> None:
        s = self.summary
        s.model = doc.get("model") or s.model
        if self.api is Api.CHAT:
            for choice in doc.get("choices") or ():
                message = choice.get("message") or {}
                for call in message.get("tool_calls") or ():
                    self._tool_call(call.get("id"), (call.get("function") or {}).get("name"))
                s.finish_reason = choice.get("finish_reason") or s.finish_reason
            self._chat_usage(doc.get("usage"))
        elif self.api is Api.RESPONSES:
            self._responses_object(doc)
        else:
            for block in doc.get("content") or ():
                self._anthropic_block(block)
            s.finish_reason = doc.get("stop_reason") or s.finish_reason
            self._anthropic_usage(doc.get("usage"))

    def _responses_object(self, doc: dict[str, Any]) -> None:
        s = self.summary
        s.model = doc.get("model") or s.model
        s.response_id = doc.get("id") or s.response_id
        for item in doc.get("output") or ():
            self._responses_item(item)
        status = doc.get("status")
        if status:
            s.finish_reason = status
        usage = doc.get("usage")
        if isinstance(usage, dict):
            details = usage.get("input_tokens_details") or {}
            s.usage = Usage(
                prompt_tokens=int(usage.get("input_tokens") or 0),
                completion_tokens=int(usage.get("output_tokens") or 0),
                cached_tokens=int(details.get("cached_tokens") or 0),
            )

    def _responses_item(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind in ("function_call", "custom_tool_call"):
            self._tool_call(item.get("call_id"), item.get("name"))
        elif kind == "reasoning" and item.get("encrypted_content"):
            self._provider_state(fingerprint("reasoning", item["encrypted_content"]))

    def _anthropic_block(self, block: dict[str, Any]) -> None:
        kind = block.get("type")
        if kind == "tool_use":
            self._tool_call(block.get("id"), block.get("name"))
        elif kind == "thinking" and block.get("signature"):
            self._provider_state(fingerprint("thinking", block["signature"]))
        elif kind == "redacted_thinking" and block.get("data"):
            self._provider_state(fingerprint("thinking", block["data"]))

    # -- stream events ---------------------------------------------------------------------

    def _on_event(self, event: dict[str, Any]) -> None:
        s = self.summary
        if self.api is Api.CHAT:
            s.model = event.get("model") or s.model
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                for call in delta.get("tool_calls") or ():
                    if call.get("id"):
                        self._tool_call(call["id"], (call.get("function") or {}).get("name"))
                s.finish_reason = choice.get("finish_reason") or s.finish_reason
            self._chat_usage(event.get("usage"))
            return
        kind = event.get("type")
        if self.api is Api.RESPONSES:
            if kind in ("response.created", "response.completed", "response.incomplete",
                        "response.failed"):
                response = event.get("response") or {}
                if kind == "response.created":
                    s.response_id = response.get("id") or s.response_id
                else:
                    self._reset_ids()
                    self._responses_object(response)
                    self.done = True
            return
        if kind == "message_start":
            message = event.get("message") or {}
            s.model = message.get("model") or s.model
            self._anthropic_usage(message.get("usage"))
        elif kind == "content_block_start":
            self._anthropic_block(event.get("content_block") or {})
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "signature_delta" and delta.get("signature"):
                self._provider_state(fingerprint("thinking", delta["signature"]))
        elif kind == "message_stop":
            self.done = True
        elif kind == "message_delta":
            s.finish_reason = (event.get("delta") or {}).get("stop_reason") or s.finish_reason
            usage = event.get("usage") or {}
            if s.usage is not None and usage.get("output_tokens") is not None:
                s.usage.completion_tokens = int(usage["output_tokens"])

    # -- helpers ---------------------------------------------------------------------------

    def _reset_ids(self) -> None:
        """The completed Responses object restates every item; avoid counting them twice."""
        self.summary.tool_call_ids.clear()
        self.summary.tool_names.clear()
        self.summary.provider_state.clear()

    def _tool_call(self, call_id: Any, name: Any) -> None:
        if isinstance(call_id, str) and call_id:
            self.summary.tool_call_ids.append(call_id)
        if isinstance(name, str) and name:
            self.summary.tool_names.append(name)

    def _provider_state(self, key: str) -> None:
        self.summary.provider_state.append(key)

    def _chat_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        details = usage.get("prompt_tokens_details") or {}
        self.summary.usage = Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )

    def _anthropic_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        cached = int(usage.get("cache_read_input_tokens") or 0)
        created = int(usage.get("cache_creation_input_tokens") or 0)
        self.summary.usage = Usage(
            prompt_tokens=int(usage.get("input_tokens") or 0) + cached + created,
            completion_tokens=int(usage.get("output_tokens") or 0),
            cached_tokens=cached,
        )
