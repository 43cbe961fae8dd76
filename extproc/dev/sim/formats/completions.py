"""OpenAI's legacy Completions, as vLLM serves it (``/v1/completions``): ``text_completion``
documents and chunks, one choice per prompt, the usage in a last chunk with no choices when
the client asked for it (``stream_options.include_usage``), then ``data: [DONE]``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ....apis.formats import FORMATS
from ....types import Api, RequestSummary
from ..reply import IdStyle, Reply
from .base import SseEvent
from .chat import openai_usage

OBJECT = "text_completion"


class CompletionsFormat:
    ids = IdStyle(response_prefix="cmpl-", call_prefix="call_", opaque_kind="reasoning")

    def wants_reasoning(self, body: dict[str, Any]) -> bool:
        return False

    def document(self, reply: Reply, summary: RequestSummary) -> dict[str, Any]:
        return {
            **_envelope(reply),
            "choices": [
                _choice(index, _echo(summary, prompt) + reply.text, _finish_reason(reply))
                for index, prompt in enumerate(_prompts(summary))
            ],
            "usage": openai_usage(reply),
        }

    def events(self, reply: Reply, summary: RequestSummary) -> Iterator[SseEvent]:
        include_usage = bool((summary.body.get("stream_options") or {}).get("include_usage"))
        extra = {"usage": None} if include_usage else {}
        for index, prompt in enumerate(_prompts(summary)):
            pieces = [p for p in (_echo(summary, prompt), *reply.words) if p] or [""]
            for at, piece in enumerate(pieces):
                finish = _finish_reason(reply) if at == len(pieces) - 1 else None
                yield SseEvent({**_envelope(reply), "choices": [_choice(index, piece, finish)],
                                **extra})
        if include_usage:
            yield SseEvent({**_envelope(reply), "choices": [], "usage": openai_usage(reply)})
        yield SseEvent("[DONE]")

    def history(self, reply: Reply) -> list[dict[str, Any]]:
        """The answer as a client continues it: appended to the prompt, which renders bare."""
        return [{"prompt": reply.text}]


def _envelope(reply: Reply) -> dict[str, Any]:
    return {"id": reply.id, "object": OBJECT, "created": reply.created, "model": reply.model}


def _choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason,
            "stop_reason": None}


def _prompts(summary: RequestSummary) -> list[Any]:
    return [entry["prompt"] for entry in FORMATS[Api.COMPLETIONS].entries(summary.body)]


def _echo(summary: RequestSummary, prompt: Any) -> str:
    """The prompt, when the client asked for it back (``echo``; token ids echo as none)."""
    return prompt if summary.body.get("echo") is True and isinstance(prompt, str) else ""


def _finish_reason(reply: Reply) -> str:
    return "length" if reply.truncated else "stop"
