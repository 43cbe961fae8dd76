"""Agent sessions driven with the official SDKs over the three APIs, streaming or not.

Each agent runs the loop a harness runs: ask with tools, answer every tool call, go on. It keeps
what each turn was served by (``x-saar-selected-model`` and ``x-saar-worker``, the latter from
Envoy itself), so a test can check that every tool result went to the worker that issued the
call and every ``previous_response_id`` to the worker that stored it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from anthropic import Anthropic
from openai import OpenAI

HARD = "Please refactor the storage layer and debug the failing test."
TOOL = {"type": "function", "function": {"name": "run_tests", "description": "Run the tests",
                                         "parameters": {"type": "object", "properties": {}}}}
RESPONSES_TOOL = {"type": "function", "name": "run_tests", "description": "Run the tests",
                  "parameters": {"type": "object", "properties": {}}}
MESSAGES_TOOL = {"name": "run_tests", "description": "Run the tests",
                 "input_schema": {"type": "object", "properties": {}}}


@dataclass(frozen=True)
class Served:
    model: str
    worker: str
    phase: str
    replay_id: str
    continues: str | None
    """What this turn leaned on (a tool call id, a response id), None for a fresh ask."""


@dataclass
class Agent:
    """One session. ``retries`` is the SDK's own (its default is 2)."""

    url: str
    session: str
    stream: bool = False
    retries: int = 2
    served: list[Served] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    """Tool calls the last answer made, to be answered next turn."""
    issuers: dict[str, Served] = field(default_factory=dict)
    """id (tool call or response) → the turn that issued it."""
    model: str = "auto"
    task: str = HARD
    """The first turn's user message (a long one makes a long first prefill)."""
    options: dict[str, Any] = field(default_factory=dict)
    """More arguments for every create call (``tool_choice``, ``max_tokens``...)."""
    tools: list[dict[str, Any]] | None = None
    """The tools offered (None: the API's ``run_tests``)."""

    def __post_init__(self) -> None:
        """Each API's agent makes its SDK client here."""

    def turn(self) -> Served:
        raise NotImplementedError

    def broken(self) -> list[tuple[Served, Served]]:
        """(issuing turn, continuing turn) pairs served by another model or worker."""
        out = []
        for turn in self.served:
            issuer = self.issuers.get(turn.continues) if turn.continues else None
            if issuer is not None and (issuer.model, issuer.worker) != (turn.model, turn.worker):
                out.append((issuer, turn))
        return out

    def _served(self, headers: Any, continues: str | None) -> Served:
        served = Served(headers["x-saar-selected-model"], headers["x-saar-worker"],
                        headers["x-saar-session-phase"], headers["x-replay-id"], continues)
        self.served.append(served)
        return served


class ChatAgent(Agent):
    def __post_init__(self) -> None:
        self.client = OpenAI(base_url=f"{self.url}/v1", api_key=f"key-{self.session}",
                             max_retries=self.retries,
                             default_headers={"x-session-id": self.session})
        self.messages: list[dict[str, Any]] = []

    def turn(self) -> Served:
        continues = self.pending[0] if self.pending else None
        if self.pending:
            self.messages += [{"role": "tool", "tool_call_id": c, "content": "3 passed"}
                              for c in self.pending]
        else:
            self.messages.append({"role": "user", "content": self.task})
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=self.messages, tools=self.tools or [TOOL],
            stream=self.stream, **self.options,
            **({"stream_options": {"include_usage": True}} if self.stream else {}))
        served = self._served(raw.headers, continues)
        calls, text = self._read(raw.parse())
        self.pending = [c["id"] for c in calls]
        for call in self.pending:
            self.issuers[call] = served
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = calls
        self.messages.append(message)
        return served

    def _read(self, parsed: Any) -> tuple[list[dict[str, Any]], str]:
        if not self.stream:
            message = parsed.choices[0].message
            calls = [{"id": c.id, "type": "function",
                      "function": {"name": c.function.name, "arguments": c.function.arguments}}
                     for c in message.tool_calls or ()]
            return calls, message.content or ""
        calls: dict[int, dict[str, Any]] = {}
        text = []
        for chunk in parsed:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                for call in choice.delta.tool_calls or ():
                    entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                          "function": {"name": "",
                                                                       "arguments": ""}})
                    entry["id"] += call.id or ""
                    if call.function is not None:
                        entry["function"]["name"] += call.function.name or ""
                        entry["function"]["arguments"] += call.function.arguments or ""
        return [calls[i] for i in sorted(calls)], "".join(text)


class ResponsesAgent(Agent):
    """Chains every turn with ``previous_response_id`` (state the provider keeps)."""

    def __post_init__(self) -> None:
        self.client = OpenAI(base_url=f"{self.url}/v1", api_key=f"key-{self.session}",
                             max_retries=self.retries,
                             default_headers={"x-session-id": self.session})
        self.previous: str | None = None

    def turn(self) -> Served:
        if self.pending:
            items: list[dict[str, Any]] = [
                {"type": "function_call_output", "call_id": c, "output": "3 passed"}
                for c in self.pending]
        else:
            items = [{"type": "message", "role": "user", "content": self.task}]
        extra = {"previous_response_id": self.previous} if self.previous else {}
        raw = self.client.responses.with_raw_response.create(
            model=self.model, input=items, tools=self.tools or [RESPONSES_TOOL],
            stream=self.stream, **extra, **self.options)
        served = self._served(raw.headers, self.previous)
        response = raw.parse()
        if self.stream:
            response = next(e.response for e in response if e.type == "response.completed")
        self.previous = response.id
        self.issuers[response.id] = served
        self.pending = [item.call_id for item in response.output if item.type == "function_call"]
        for call in self.pending:
            self.issuers[call] = served
        return served


class MessagesAgent(Agent):
    def __post_init__(self) -> None:
        self.client = Anthropic(base_url=self.url, api_key=f"key-{self.session}",
                                max_retries=self.retries,
                                default_headers={"x-session-id": self.session})
        self.messages: list[dict[str, Any]] = []

    def turn(self) -> Served:
        """A turn that failed changes nothing: the same turn may be played again."""
        continues = self.pending[0] if self.pending else None
        if self.pending:
            asked: dict[str, Any] = {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c, "content": "3 passed"}
                for c in self.pending]}
        else:
            asked = {"role": "user", "content": self.task}
        raw = self.client.messages.with_raw_response.create(
            model=self.model, messages=[*self.messages, asked],
            tools=self.tools or [MESSAGES_TOOL], stream=self.stream,
            **{"max_tokens": 64, **self.options})
        served = self._served(raw.headers, continues)
        blocks = self._read(raw.parse())
        self.pending = [b["id"] for b in blocks if b["type"] == "tool_use"]
        for call in self.pending:
            self.issuers[call] = served
        self.messages += [asked, {"role": "assistant", "content": blocks}]
        return served

    def _read(self, parsed: Any) -> list[dict[str, Any]]:
        if not self.stream:
            return [_object_input(b.model_dump(exclude_none=True)) for b in parsed.content]
        blocks: list[dict[str, Any]] = []
        for event in parsed:
            if event.type == "content_block_start":
                blocks.append(event.content_block.model_dump(exclude_none=True))
            elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                blocks[-1]["text"] = blocks[-1].get("text", "") + event.delta.text
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                blocks[-1]["_json"] = blocks[-1].get("_json", "") + event.delta.partial_json
        for block in blocks:
            if block["type"] == "tool_use":
                try:
                    block["input"] = json.loads(block.pop("_json", "") or "{}")
                except ValueError:
                    block["input"] = {}
        return [_object_input(b) for b in blocks]


def _object_input(block: dict[str, Any]) -> dict[str, Any]:
    """A tool call's input as Anthropic's API guarantees it, an object: a random-weight model
    behind vLLM may emit any JSON there, which vLLM then refuses to take back."""
    if block.get("type") == "tool_use" and not isinstance(block.get("input"), dict):
        block["input"] = {}
    return block


KINDS = (ChatAgent, ResponsesAgent, MessagesAgent)


def agents(url: str, count: int, prefix: str, **options: Any) -> list[Agent]:
    """``count`` sessions cycling through the three APIs, streamed and not."""
    return [KINDS[i % 3](url, f"{prefix}-{i}", stream=bool((i // 3) % 2), **options)
            for i in range(count)]
