"""OpenAI Responses (``/v1/responses``): output items, and the typed event stream around them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ....types import RequestSummary
from ..reply import IdStyle, Reply
from .base import SseEvent

ENCRYPTED_REASONING = "reasoning.encrypted_content"
_CALL_EVENTS = {
    "function_call": ("arguments", "response.function_call_arguments"),
    "custom_tool_call": ("input", "response.custom_tool_call_input"),
}
"""A call item's streamed field, and the events that stream it."""


class ResponsesFormat:
    ids = IdStyle(response_prefix="resp_", call_prefix="call_", opaque_kind="reasoning")

    def wants_reasoning(self, body: dict[str, Any]) -> bool:
        return ENCRYPTED_REASONING in (body.get("include") or ())

    def document(self, reply: Reply, summary: RequestSummary) -> dict[str, Any]:
        status = "incomplete" if reply.truncated else "completed"
        return {
            **self._envelope(reply, summary, status),
            "incomplete_details": {"reason": "max_output_tokens"} if reply.truncated else None,
            "output": self.history(reply),
            "usage": {
                "input_tokens": reply.prompt_tokens,
                "input_tokens_details": {"cached_tokens": reply.cached_tokens},
                "output_tokens": reply.output_tokens,
                "output_tokens_details": {
                    "reasoning_tokens": len(reply.reasoning.words) if reply.reasoning else 0
                },
                "total_tokens": reply.prompt_tokens + reply.output_tokens,
            },
        }

    def events(self, reply: Reply, summary: RequestSummary) -> Iterator[SseEvent]:
        in_progress = {**self._envelope(reply, summary, "in_progress"), "output": [], "usage": None}
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": in_progress}),
            ("response.in_progress", {"response": in_progress}),
        ]
        for index, item in enumerate(self.history(reply)):
            events.extend(_item_events(index, item, reply))
        document = self.document(reply, summary)
        events.append((f"response.{document['status']}", {"response": document}))
        for sequence, (kind, payload) in enumerate(events):
            yield SseEvent({"type": kind, "sequence_number": sequence, **payload}, event=kind)

    def history(self, reply: Reply) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if reply.reasoning is not None:
            items.append(
                {
                    "id": reply.reasoning.item_id,
                    "type": "reasoning",
                    "summary": [],
                    "encrypted_content": reply.reasoning.opaque,
                }
            )
        if reply.tool_call is not None:
            call = reply.tool_call
            item: dict[str, Any] = {
                "id": call.item_id,
                "type": "custom_tool_call" if call.custom else "function_call",
                "status": "completed",
                "call_id": call.call_id,
                "name": call.name,
                "input" if call.custom else "arguments": call.arguments,
            }
            if call.namespace is not None:
                item["namespace"] = call.namespace
            items.append(item)
        else:
            items.append(
                {
                    "id": reply.item_id,
                    "type": "message",
                    "role": "assistant",
                    "status": "incomplete" if reply.truncated else "completed",
                    "content": [_text_part(reply.text)],
                }
            )
        return items

    def _envelope(self, reply: Reply, summary: RequestSummary, status: str) -> dict[str, Any]:
        body = summary.body
        return {
            "id": reply.id,
            "object": "response",
            "created_at": reply.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": reply.model,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": summary.previous_response_id,
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "metadata": body.get("metadata") or {},
        }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _item_events(
    index: int, item: dict[str, Any], reply: Reply
) -> list[tuple[str, dict[str, Any]]]:
    """The added/delta/done events of one output item, in the order the API sends them."""
    at = {"output_index": index}
    if item["type"] == "message":
        located = {"item_id": item["id"], **at, "content_index": 0}
        return [
            ("response.output_item.added", {**at, "item": {**item, "content": []}}),
            ("response.content_part.added", {**located, "part": _text_part("")}),
            *(
                ("response.output_text.delta", {**located, "delta": word, "logprobs": []})
                for word in reply.words
            ),
            ("response.output_text.done", {**located, "text": reply.text, "logprobs": []}),
            ("response.content_part.done", {**located, "part": _text_part(reply.text)}),
            ("response.output_item.done", {**at, "item": item}),
        ]
    if item["type"] in _CALL_EVENTS:
        field, events = _CALL_EVENTS[item["type"]]
        located = {"item_id": item["id"], **at}
        started = {**item, field: "", "status": "in_progress"}
        return [
            ("response.output_item.added", {**at, "item": started}),
            (f"{events}.delta", {**located, "delta": item[field]}),
            (f"{events}.done", {**located, "name": item["name"], field: item[field]}),
            ("response.output_item.done", {**at, "item": item}),
        ]
    return [
        ("response.output_item.added", {**at, "item": item}),
        ("response.output_item.done", {**at, "item": item}),
    ]
