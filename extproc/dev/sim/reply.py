"""What the simulated model answers, decided once and independent of the wire format.

The decision is the agent-loop contract routing depends on: tools offered and no tool results in
the newest turn -> call the first tool; otherwise answer in text. A request from an agent CLI
(one offering a shell or sub-agent tool ``agent`` knows) gets ``agent``'s answer instead: the
steps its task names, with calls the CLI really runs, then a text quoting their results. Text
is a pure function of the model and the prompt, so replays are reproducible; ids come from the
oracle, so they are owned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from ...types import RequestSummary
from . import agent
from .oracle import ContinuityOracle
from .prefix_cache import tokenize
from .prompt import generate_words

REASONING_TOKENS = 8
_CAP_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


@dataclass(frozen=True, slots=True)
class IdStyle:
    """How one API spells the ids it issues."""

    response_prefix: str
    call_prefix: str
    opaque_kind: str
    """Fingerprint kind of this API's provider-bound blobs (see ``request.fingerprint``)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    item_id: str
    name: str
    arguments: str
    """Compact JSON with sorted keys, so every API and the prompt renderer agree on the text;
    the raw input text of a ``custom`` tool."""
    namespace: str | None = None
    """The namespace the tool was offered in (Responses): the call names it."""
    custom: bool = False
    """A free-form tool (Responses ``custom_tool_call``), its input text in ``arguments``."""


@dataclass(frozen=True, slots=True)
class Reasoning:
    item_id: str
    words: tuple[str, ...]
    opaque: str
    """Encrypted content (Responses) or signature (Messages) that only this instance accepts."""


@dataclass(frozen=True, slots=True)
class Reply:
    id: str
    item_id: str
    model: str
    created: int
    words: tuple[str, ...]
    tool_call: ToolCall | None
    reasoning: Reasoning | None
    prompt_tokens: int
    cached_tokens: int
    truncated: bool

    @property
    def text(self) -> str:
        return "".join(self.words)

    @property
    def output_tokens(self) -> int:
        tokens = len(self.words)
        if self.tool_call is not None:
            tokens += len(tokenize(f"{self.tool_call.name} {self.tool_call.arguments}"))
        if self.reasoning is not None:
            tokens += len(self.reasoning.words)
        return tokens


def build_reply(
    summary: RequestSummary,
    *,
    prompt: str,
    prompt_tokens: int | None = None,
    cached_tokens: int,
    output_tokens: int,
    style: IdStyle,
    reasoning: bool,
    oracle: ContinuityOracle,
) -> Reply:
    """Decide the answer to ``summary`` and issue (and record) the ids it carries; its usage
    counts ``prompt_tokens`` (the tokens the server cached and computed) where given."""
    seed = f"{summary.model}\n{prompt}"
    cap = next((summary.body[f] for f in _CAP_FIELDS if isinstance(summary.body.get(f), int)), None)
    budget = output_tokens if cap is None else max(min(output_tokens, cap), 0)
    tool_call = None
    words: tuple[str, ...] = ()
    step = agent.decide(summary.api, summary.body)
    if isinstance(step, agent.Call):
        tool_call = ToolCall(
            call_id=oracle.issue_tool_call(style.call_prefix),
            item_id=oracle.new_id("ctc_" if step.tool.custom else "fc_"),
            name=step.tool.name,
            arguments=step.arguments,
            namespace=step.tool.namespace,
            custom=step.tool.custom,
        )
    elif step is None and summary.tools_offered and not summary.tool_result_ids:
        arguments = {"input": "".join(generate_words(f"args\n{seed}", 3))}
        tool_call = ToolCall(
            call_id=oracle.issue_tool_call(style.call_prefix),
            item_id=oracle.new_id("fc_"),
            name=summary.tools_offered[0],
            arguments=orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode(),
        )
    else:
        words = generate_words(seed, budget)
        if isinstance(step, agent.Answer):
            words += tuple(f"\n{quote}" for quote in step.quotes)
    thought = None
    if reasoning:
        thought = Reasoning(
            item_id=oracle.new_id("rs_"),
            words=generate_words(f"reasoning\n{seed}", REASONING_TOKENS),
            opaque=oracle.issue_opaque(style.opaque_kind),
        )
    return Reply(
        id=oracle.new_id(style.response_prefix),
        item_id=oracle.new_id("msg_"),
        model=summary.model,
        created=int(time.time()),
        words=words,
        tool_call=tool_call,
        reasoning=thought,
        prompt_tokens=len(tokenize(prompt)) if prompt_tokens is None else prompt_tokens,
        cached_tokens=cached_tokens,
        truncated=tool_call is None and budget < output_tokens,
    )
