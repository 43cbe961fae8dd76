"""Anthropic Messages (``/v1/messages``): content blocks, and the named event stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from ....types import RequestSummary
from ..reply import IdStyle, Reply
from .base import SseEvent

ARGUMENT_CHUNK_CHARS = 8


class MessagesFormat:
    ids = IdStyle(response_prefix="msg_", call_prefix="toolu_", opaque_kind="thinking")

    def wants_reasoning(self, body: dict[str, Any]) -> bool:
        thinking = body.get("thinking")
        return isinstance(thinking, dict) and thinking.get("type", "disabled") != "disabled"

    def document(self, reply: Reply, summary: RequestSummary) -> dict[str, Any]:
        return {
            **self._envelope(reply, _stop_reason(reply)),
            "content": self.history(reply)[0]["content"],
            "usage": {**_input_usage(reply), "output_tokens": reply.output_tokens},
        }

    def events(self, reply: Reply, summary: RequestSummary) -> Iterator[SseEvent]:
        start = {
            **self._envelope(reply, None),
            "content": [],
            "usage": {**_input_usage(reply), "output_tokens": 1},
        }
        yield _event("message_start", message=start)
        for index, block in enumerate(self.history(reply)[0]["content"]):
            yield from _block_events(index, block, reply)
        yield _event(
            "message_delta",
            delta={"stop_reason": _stop_reason(reply), "stop_sequence": None},
            usage={"output_tokens": reply.output_tokens},
        )
        yield _event("message_stop")

    def history(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.reasoning is not None:
            thinking = "".join(reply.reasoning.words)
            blocks.append(
                {"type": "thinking", "thinking": thinking, "signature": reply.reasoning.opaque}
            )
        if reply.tool_call is not None:
            call = reply.tool_call
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.call_id,
                    "name": call.name,
                    "input": orjson.loads(call.arguments),
                }
            )
        else:
            blocks.append({"type": "text", "text": reply.text})
        return [{"role": "assistant", "content": blocks}]

    def _envelope(self, reply: Reply, stop_reason: str | None) -> dict[str, Any]:
        return {
            "id": reply.id,
            "type": "message",
            "role": "assistant",
            "model": reply.model,
            "stop_reason": stop_reason,
            "stop_sequence": None,
        }


def _event(kind: str, **payload: Any) -> SseEvent:
    return SseEvent({"type": kind, **payload}, event=kind)


def _block_events(index: int, block: dict[str, Any], reply: Reply) -> Iterator[SseEvent]:
    """start, deltas, stop of one content block; the start carries the block with empty fields."""
    kind = block["type"]
    deltas: list[dict[str, Any]]
    empty: dict[str, Any]
    if kind == "thinking":
        empty = {"thinking": "", "signature": ""}
        thoughts = reply.reasoning.words if reply.reasoning else ()
        deltas = [{"type": "thinking_delta", "thinking": word} for word in thoughts]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "tool_use":
        empty = {"input": {}}
        arguments = orjson.dumps(block["input"], option=orjson.OPT_SORT_KEYS).decode()
        deltas = [
            {"type": "input_json_delta", "partial_json": arguments[at : at + ARGUMENT_CHUNK_CHARS]}
            for at in range(0, len(arguments), ARGUMENT_CHUNK_CHARS)
        ]
    else:
        empty = {"text": ""}
        deltas = [{"type": "text_delta", "text": word} for word in reply.words]
    yield _event("content_block_start", index=index, content_block={**block, **empty})
    for delta in deltas:
        yield _event("content_block_delta", index=index, delta=delta)
    yield _event("content_block_stop", index=index)


def _stop_reason(reply: Reply) -> str:
    if reply.tool_call is not None:
        return "tool_use"
    return "max_tokens" if reply.truncated else "end_turn"


def _input_usage(reply: Reply) -> dict[str, int]:
    """Anthropic counts only uncached input as ``input_tokens``; cache reads are separate."""
    return {
        "input_tokens": reply.prompt_tokens - reply.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": reply.cached_tokens,
    }
