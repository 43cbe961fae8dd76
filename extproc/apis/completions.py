"""OpenAI's legacy Completions: ``prompt`` in, a ``text_completion`` (or its chunks) out.

The prompt is a string, an array of strings, an array of token ids or an array of those (a
batch: one sequence each, as vLLM runs them); each is one entry, and it renders as it is, with
no chat template and no roles: the text the engine caches. A completion has no history the
router can read, so it carries no tool state and no provider state (``previous_response_id``
is not read), and its answer issues no id: the session is the one its headers name, or none.
What the router learns from the answer is its usage and how it finished
(``choices[].finish_reason``); a stream is ``data:`` chunks ending with ``data: [DONE]``, its
usage in a last chunk with no choices when the client asked for it
(``stream_options.include_usage``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeGuard

from ..errors import MalformedRequest
from ..types import ResponseSummary
from .common import (
    Facts,
    Turn,
    as_dict,
    as_list,
    latest,
    nonempty_str,
    record_output,
    record_usage,
)

_SHAPE = '"prompt" must be a string, an array of strings, or token ids (an array of them)'


def entries(body: dict[str, Any]) -> list[Any]:
    """Each prompt of the body as an entry (``{"prompt": text or token ids}``), whatever its
    type (``parse`` rejects what is neither); none without a prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and not _token_ids(prompt):
        return [{"prompt": p} for p in prompt]
    return [] if prompt is None else [{"prompt": prompt}]


def tools(body: dict[str, Any]) -> list[Any]:
    """A completion offers no tools."""
    return []


def system(body: dict[str, Any]) -> Any:
    """A completion has no system prompt: the prompt is all the text."""
    return None


def parse(body: dict[str, Any]) -> Facts:
    prompts = [entry["prompt"] for entry in entries(body)]
    if not prompts or not all(isinstance(prompt, str) or _token_ids(prompt) for prompt in prompts):
        raise MalformedRequest(_SHAPE)
    return Facts(entries=len(prompts), latest_text=latest(reversed(prompts)))


def turns(entry: dict[str, Any]) -> Iterator[Turn]:
    """The prompt as the engine sees it: no role (``prompt._join`` renders it bare)."""
    prompt = entry.get("prompt")
    if isinstance(prompt, str):
        if prompt:
            yield "", prompt
    elif _token_ids(prompt):
        yield "", "".join(f"{t} " for t in prompt)


def _token_ids(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


# -- the answer ------------------------------------------------------------------------------


def document(summary: ResponseSummary, doc: dict[str, Any]) -> None:
    _choices(summary, doc.get("choices"))
    record_usage(summary, doc.get("usage"))


def event(summary: ResponseSummary, chunk: dict[str, Any]) -> bool:
    """A ``text_completion`` chunk; the stream ends with ``data: [DONE]``, not an event."""
    summary.model = nonempty_str(chunk.get("model")) or summary.model
    _choices(summary, chunk.get("choices"))
    record_usage(summary, chunk.get("usage"))
    return False


def _choices(summary: ResponseSummary, choices: Any) -> None:
    for choice in as_list(choices):
        record_output(summary, as_dict(choice).get("text"))
        reason = nonempty_str(as_dict(choice).get("finish_reason"))
        summary.finish_reason = reason or summary.finish_reason
