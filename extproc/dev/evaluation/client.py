"""A simulated agent harness: one seeded session that emits real request bodies turn by turn.

Everything random is drawn from the session's own ``random.Random`` before the request is
routed, so every policy replays the same script; only the ids in the bodies differ, because the
model that served a turn minted them. Chat sessions resend the whole conversation; Responses
sessions either chain with ``previous_response_id`` (sending only new items) or resend everything
with the last answer's encrypted reasoning, and sometimes send a portable full turn instead.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from ...types import Api
from .backend import Answer, Reply
from .oracle import Carried
from .workloads import FOLLOWUPS, PHRASES, WorkloadMix, filler, pick_topic, tool_output

IDLE_GAP_SECONDS = (420.0, 1800.0)
"""Beyond the 300 s idle timeout of the published defaults, short of the 3600 s session TTL."""

TOOLS = (
    ("read_file", "Read a file of the repository"),
    ("run_shell", "Run a shell command in the sandbox"),
    ("search_code", "Search the repository for a pattern"),
    ("edit_file", "Replace a span of a file"),
)
_PARAMS = {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}
_CHAT_TOOLS = orjson.dumps(
    [
        {"type": "function", "function": {"name": n, "description": d, "parameters": _PARAMS}}
        for n, d in TOOLS
    ]
)
_RESPONSES_TOOLS = orjson.dumps(
    [{"type": "function", "name": n, "description": d, "parameters": _PARAMS} for n, d in TOOLS]
)
TOOL_TOKENS = len(_CHAT_TOOLS) // 4


@dataclass(frozen=True, slots=True)
class Request:
    api: Api
    raw: bytes
    headers: dict[str, str]
    carried: Carried
    reply: Reply
    task: str
    """The decision the user's task needs (ground truth, not the selector's reading)."""
    gap: float
    """Seconds of virtual time since the session's previous turn."""


class AgentSession:
    def __init__(self, mix: WorkloadMix, rng: random.Random, session_id: str, tenant: str) -> None:
        self.mix = mix
        self.session_id = session_id
        self._rng = rng
        self.api = Api.RESPONSES if rng.random() < mix.responses else Api.CHAT
        self.chained = rng.random() < 0.5
        self.task = pick_topic(rng, mix.topics)
        self._headers = {
            ":method": "POST",
            ":path": "/v1/responses" if self.api is Api.RESPONSES else "/v1/chat/completions",
            "content-type": "application/json",
            "authorization": f"Bearer sk-eval-{tenant}",
            "x-session-id": session_id,
        }
        prefill = filler(rng, rng.randint(6_000, 12_000))
        self._prefill = orjson.dumps(prefill)
        self.context = len(prefill) // 4 + TOOL_TOKENS
        self._items: list[bytes] = []
        if self.api is Api.CHAT:
            self._items.append(b'{"role":"system","content":' + self._prefill + b"}")
        self._turn = 0
        self._pending: list[str] = []
        self._mark = 0
        self._response_id: str | None = None
        self._reasoning: tuple[int, str] | None = None

    def next_request(self) -> Request:
        rng = self._rng
        carried_calls = tuple(self._pending)
        if carried_calls:
            gap = rng.uniform(1.0, 20.0)
            for call_id in carried_calls:
                output = tool_output(rng, rng.randint(150, 2_500), self.mix.tool_signal)
                self._add_tool_output(call_id, output)
        else:
            gap = (
                rng.uniform(*IDLE_GAP_SECONDS)
                if rng.random() < self.mix.idle
                else (rng.uniform(5.0, 90.0))
            )
            self._add_user(self._user_text(rng))
        stateful = self.api is Api.RESPONSES and self._turn > 0 and rng.random() < self.mix.state
        calls: tuple[str, ...] = ()
        if rng.random() < self.mix.tool:
            calls = tuple(rng.choice(TOOLS)[0] for _ in range(rng.randint(1, 3)))
        completion = 40 * len(calls) + rng.randint(20, 80) if calls else rng.randint(150, 900)
        raw, state = self._body(stateful)
        reply = Reply(
            self.session_id,
            self._turn,
            self.context,
            completion,
            calls,
            responses_api=self.api is Api.RESPONSES,
            reasoning=not self.chained,
        )
        self._turn += 1
        return Request(
            self.api, raw, self._headers, Carried(carried_calls, state), reply, self.task, gap
        )

    def observe(self, answer: Answer, reply: Reply) -> None:
        """Append the model's answer to the history, as the harness would."""
        summary = answer.summary
        self._pending = list(summary.tool_call_ids)
        self._response_id = summary.response_id
        start = len(self._items)
        self._reasoning = (start, answer.reasoning_blob) if answer.reasoning_blob else None
        if summary.tool_call_ids:
            self._add_calls(summary.tool_call_ids, summary.tool_names)
        else:
            self._add_answer(filler(self._rng, reply.completion_tokens))
        self.context += reply.completion_tokens
        self._mark = len(self._items)

    # -- building --------------------------------------------------------------------------

    def _user_text(self, rng: random.Random) -> str:
        if self._turn > 0 and rng.random() < self.mix.drift:
            self.task = rng.choice([t for t in PHRASES if t != self.task])
        if self._turn > 0 and rng.random() < self.mix.followup:
            return rng.choice(FOLLOWUPS)
        phrase = rng.choice(PHRASES[self.task])
        return f"{phrase}\n\n```\n{filler(rng, rng.randint(40, 400))}\n```"

    def _add(self, item: Mapping[str, object], text: str) -> None:
        self._items.append(orjson.dumps(item))
        self.context += len(text) // 4

    def _add_user(self, text: str) -> None:
        if self.api is Api.CHAT:
            self._add({"role": "user", "content": text}, text)
        else:
            content = [{"type": "input_text", "text": text}]
            self._add({"type": "message", "role": "user", "content": content}, text)

    def _add_tool_output(self, call_id: str, text: str) -> None:
        if self.api is Api.CHAT:
            self._add({"role": "tool", "tool_call_id": call_id, "content": text}, text)
        else:
            self._add({"type": "function_call_output", "call_id": call_id, "output": text}, text)

    def _add_answer(self, text: str) -> None:
        if self.api is Api.CHAT:
            self._add({"role": "assistant", "content": text}, "")
        else:
            content = [{"type": "output_text", "text": text}]
            self._add({"type": "message", "role": "assistant", "content": content}, "")

    def _add_calls(self, call_ids: list[str], names: list[str]) -> None:
        args = '{"arg": "src/app/handlers.py"}'
        if self.api is Api.CHAT:
            calls = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": args}}
                for i, n in zip(call_ids, names, strict=True)
            ]
            self._add({"role": "assistant", "content": None, "tool_calls": calls}, "")
            return
        for call_id, name in zip(call_ids, names, strict=True):
            item = {"type": "function_call", "call_id": call_id, "name": name, "arguments": args}
            self._add(item, "")

    def _body(self, stateful: bool) -> tuple[bytes, tuple[str, ...]]:
        """The raw body, and the provider-bound references it carries."""
        if self.api is Api.CHAT:
            return _join(b'{"model":"auto","messages":[', self._items, _CHAT_TOOLS), ()
        if stateful and self.chained and self._response_id:
            previous = orjson.dumps(self._response_id)
            head = b'{"model":"auto","store":true,"previous_response_id":' + previous
            new_items = self._items[self._mark :]
            return _join(head + b',"input":[', new_items, _RESPONSES_TOOLS), (self._response_id,)
        items = self._items
        state: tuple[str, ...] = ()
        if stateful and self._reasoning is not None:
            at, blob = self._reasoning
            reasoning = {"type": "reasoning", "summary": [], "encrypted_content": blob}
            items, state = [*items[:at], orjson.dumps(reasoning), *items[at:]], (blob,)
        head = (
            b'{"model":"auto","store":true,"instructions":'
            if self.chained
            else b'{"model":"auto","store":false,"include":["reasoning.encrypted_content"],'
            b'"instructions":'
        )
        return _join(head + self._prefill + b',"input":[', items, _RESPONSES_TOOLS), state


def _join(head: bytes, items: list[bytes], tools: bytes) -> bytes:
    return head + b",".join(items) + b'],"tools":' + tools + b"}"
