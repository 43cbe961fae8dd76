"""OpenAI Chat Completions, as vLLM serves it (``/v1/chat/completions``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ....types import RequestSummary
from ..reply import IdStyle, Reply
from .base import SseEvent

ARGUMENT_CHUNK_CHARS = 8


class ChatFormat:
    ids = IdStyle(response_prefix="chatcmpl-", call_prefix="call_", opaque_kind="reasoning")

    def wants_reasoning(self, body: dict[str, Any]) -> bool:
        return False

    def document(self, reply: Reply, summary: RequestSummary) -> dict[str, Any]:
        message = self.history(reply)[0]
        return {
            **self._envelope(reply, "chat.completion"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _finish_reason(reply),
                }
            ],
            "usage": openai_usage(reply),
        }

    def events(self, reply: Reply, summary: RequestSummary) -> Iterator[SseEvent]:
        include_usage = bool((summary.body.get("stream_options") or {}).get("include_usage"))
        yield self._chunk(reply, {"role": "assistant", "content": ""}, include_usage)
        for word in reply.words:
            yield self._chunk(reply, {"content": word}, include_usage)
        call = reply.tool_call
        if call is not None:
            head = {"index": 0, "id": call.call_id, "type": "function"}
            yield self._chunk(
                reply,
                {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]},
                include_usage,
            )
            for start in range(0, len(call.arguments), ARGUMENT_CHUNK_CHARS):
                piece = call.arguments[start : start + ARGUMENT_CHUNK_CHARS]
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                yield self._chunk(reply, delta, include_usage)
        yield self._chunk(reply, {}, include_usage, finish_reason=_finish_reason(reply))
        if include_usage:
            yield SseEvent(
                {
                    **self._envelope(reply, "chat.completion.chunk"),
                    "choices": [],
                    "usage": openai_usage(reply),
                }
            )
        yield SseEvent("[DONE]")

    def history(self, reply: Reply) -> list[dict[str, Any]]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_call is not None:
            call = reply.tool_call
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ]
        return [message]

    def _envelope(self, reply: Reply, kind: str) -> dict[str, Any]:
        return {"id": reply.id, "object": kind, "created": reply.created, "model": reply.model}

    def _chunk(
        self,
        reply: Reply,
        delta: dict[str, Any],
        include_usage: bool,
        *,
        finish_reason: str | None = None,
    ) -> SseEvent:
        chunk = {
            **self._envelope(reply, "chat.completion.chunk"),
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if include_usage:
            chunk["usage"] = None
        return SseEvent(chunk)


def _finish_reason(reply: Reply) -> str:
    if reply.tool_call is not None:
        return "tool_calls"
    return "length" if reply.truncated else "stop"


def openai_usage(reply: Reply) -> dict[str, Any]:
    """OpenAI's usage object, as vLLM writes it for Chat and legacy Completions."""
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.prompt_tokens + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
    }
