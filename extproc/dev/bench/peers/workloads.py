"""The four workloads, generated from a seed so every router is sent the same sessions.

- ``agents``: agent sessions with ``x-session-id`` (sub-agents with ``x-parent-session-id``):
  one system prompt shared by every session (and another by every sub-agent), a first request,
  then turns whose context grows by the answer and a tool result; some sessions start a
  sub-agent and wait for its answer, which comes back into their next turn.
- ``agents_no_session``: the same shape (its own text) without any session header.
- ``shared_prefix``: a Mooncake trace (``hash_ids`` blocks; several sessions sharing system
  prompts and documents), each row sent as its own prompt (``trace_replay.prompt``), no
  session header; ``--trace FILE`` replaces the generated trace.
- ``oversubscribed``: agent sessions with headers and larger tool results, as many as it takes
  for their final contexts to add up to ``oversubscription`` times the pool's KV.

Text is the simulator's one-token words (``sim.prompt.generate_words``), so a word is a token
there and roughly one elsewhere; the answers come from the engines and go back into the
context as an agent resends them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...clustersim.trace import TraceRow, scripts_from_trace
from ...sim.prompt import generate_words
from ...trace_replay import prompt as trace_prompt
from .settings import WORKLOADS

SESSION_HEADER = "x-session-id"
PARENT_HEADER = "x-parent-session-id"


@dataclass(frozen=True, slots=True)
class Call:
    """One request of a session."""

    text: str
    """Appended as the user's message (a growing session), or the whole prompt (a trace row)."""
    max_tokens: int
    delay_s: float = 0.0
    """Tool or think time after the previous answer (and the sub-agents) before it is sent."""
    not_before_s: float = 0.0
    """Sent no earlier than this long after the workload started (a trace row's timestamp)."""
    children: tuple[Session, ...] = ()
    """Sub-agents run before this call, at once; their last answers open its text."""


@dataclass(frozen=True, slots=True)
class Session:
    key: str
    system: str | None
    calls: tuple[Call, ...]
    start_s: float = 0.0
    parent: str | None = None
    grows: bool = True
    """Each call resends the conversation so far (an agent); False: each call's text is the
    whole prompt (a trace row)."""

    def requests(self) -> int:
        return len(self.calls) + sum(c.requests() for call in self.calls for c in call.children)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    sessions: tuple[Session, ...]
    session_headers: bool

    def requests(self) -> int:
        return sum(s.requests() for s in self.sessions)

    def headers(self, session: Session) -> dict[str, str]:
        """The session headers a request of ``session`` carries (none without them)."""
        if not self.session_headers:
            return {}
        out = {SESSION_HEADER: session.key}
        if session.parent is not None:
            out[PARENT_HEADER] = session.parent
        return out


@dataclass(frozen=True, slots=True)
class Shape:
    """The sizes of a workload, in words (one token each on the simulator)."""

    sessions: int = 12
    turns: int = 8
    system_words: int = 600
    subagent_system_words: int = 400
    first_words: tuple[int, int] = (150, 400)
    tool_words: tuple[int, int] = (60, 250)
    answer_tokens: int = 32
    delay_s: tuple[float, float] = (0.05, 0.3)
    ramp_s: float = 2.0
    """Sessions start spread over this long."""
    subagent_share: float = 0.5
    """Share of the sessions that start one sub-agent (at a turn after the first)."""
    subagent_turns: int = 3

    def final_words(self) -> int:
        """A session's context at its last turn, on average (sub-agents' own not counted)."""
        tool = sum(self.tool_words) / 2 + self.answer_tokens
        return int(self.system_words + sum(self.first_words) / 2
                   + (self.turns - 1) * tool + self.answer_tokens)


OVERSUBSCRIBED_TOOL_WORDS = (200, 600)


def _words(rng: random.Random, tag: str, count: int) -> str:
    return "".join(generate_words(f"{tag}:{rng.random()}", max(1, count)))


def agent_sessions(shape: Shape, seed: str) -> tuple[Session, ...]:
    """``shape.sessions`` agent sessions drawn from ``seed`` (the same seed, the same
    sessions, whatever else runs)."""
    rng = random.Random(seed)
    system = _words(rng, "system", shape.system_words)
    sub_system = _words(rng, "subagent-system", shape.subagent_system_words)
    out = []
    for index in range(shape.sessions):
        key = f"{seed}-s{index}"
        start = shape.ramp_s * index / max(1, shape.sessions) + rng.uniform(0, 0.05)
        spawn_at = (rng.randrange(1, shape.turns) if shape.turns > 1
                    and rng.random() < shape.subagent_share else None)
        calls = []
        for turn in range(shape.turns):
            if turn == 0:
                text = _words(rng, "task", rng.randint(*shape.first_words))
            else:
                text = "tool result: " + _words(rng, "tool", rng.randint(*shape.tool_words))
            children: tuple[Session, ...] = ()
            if turn == spawn_at:
                child_calls = tuple(
                    Call(("task: " if t == 0 else "tool result: ")
                         + _words(rng, "sub", rng.randint(*shape.tool_words)),
                         shape.answer_tokens, 0.0 if t == 0 else rng.uniform(*shape.delay_s))
                    for t in range(shape.subagent_turns))
                children = (Session(f"{key}-agent", sub_system, child_calls, parent=key),)
            delay = 0.0 if turn == 0 else rng.uniform(*shape.delay_s)
            calls.append(Call(text, shape.answer_tokens, delay, children=children))
        out.append(Session(key, system, tuple(calls), start_s=start))
    return tuple(out)


def oversubscribed_shape(shape: Shape, kv_tokens: int, oversubscription: float) -> Shape:
    """``shape`` with larger tool results and as many sessions as it takes for their final
    contexts to add up to ``oversubscription`` × ``kv_tokens`` (the pool's KV, all workers)."""
    big = replace(shape, tool_words=OVERSUBSCRIBED_TOOL_WORDS)
    sessions = math.ceil(oversubscription * kv_tokens / big.final_words())
    return replace(big, sessions=max(shape.sessions, sessions))


@dataclass(frozen=True, slots=True)
class TraceShape:
    """A shared-prefix trace: ``systems`` system prompts and ``documents`` documents, each
    session one of each, then a history of its own growing turn by turn."""

    sessions: int = 12
    turns: int = 4
    systems: int = 3
    documents: int = 6
    system_blocks: int = 40
    document_blocks: int = 60
    turn_blocks: tuple[int, int] = (4, 12)
    output_tokens: int = 32
    delay_ms: tuple[float, float] = (50.0, 300.0)
    ramp_ms: float = 2000.0
    block_size: int = 16


def shared_prefix_trace(shape: TraceShape, seed: str) -> list[dict[str, Any]]:
    """Mooncake rows (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``,
    ``session_id``, ``delay``): the trace ``extproc.trace`` writes and ``replay-trace`` reads."""
    rng = random.Random(seed)
    next_id = 0

    def blocks(count: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + count))
        next_id += count
        return ids

    systems = [blocks(shape.system_blocks) for _ in range(shape.systems)]
    documents = [blocks(shape.document_blocks) for _ in range(shape.documents)]
    rows = []
    for index in range(shape.sessions):
        head = rng.choice(systems) + rng.choice(documents)
        own: list[int] = []
        start = shape.ramp_ms * index / max(1, shape.sessions) + rng.uniform(0, 50)
        for turn in range(shape.turns):
            own += blocks(rng.randint(*shape.turn_blocks))
            ids = head + own
            row: dict[str, Any] = {
                "timestamp": round(start, 3),
                "input_length": len(ids) * shape.block_size + rng.randrange(shape.block_size),
                "output_length": shape.output_tokens, "hash_ids": ids,
                "session_id": f"{seed}-t{index}"}
            if turn:
                row["delay"] = round(rng.uniform(*shape.delay_ms), 3)
            rows.append(row)
    return rows


def trace_sessions(rows: Sequence[TraceRow], block_size: int) -> tuple[Session, ...]:
    """A Mooncake trace as sessions of their own prompts, timed as ``replay-trace`` times them."""
    out = []
    for number, script in enumerate(scripts_from_trace(rows)):
        calls = tuple(
            Call(trace_prompt(step.hash_ids or (), step.prompt_tokens, block_size,
                              f"{number:x}{index:x}"),
                 max(1, step.output_tokens), step.delay_s, step.not_before_s)
            for index, step in enumerate(script.steps))
        out.append(Session(script.key, None, calls, start_s=script.start_s, grows=False))
    return tuple(out)


def rows_of(doc: Sequence[dict[str, Any]]) -> list[TraceRow]:
    """Generated rows as the trace reader's rows."""
    return [TraceRow(timestamp_ms=float(r["timestamp"]), input_length=int(r["input_length"]),
                     output_length=int(r["output_length"]),
                     hash_ids=tuple(int(h) for h in r["hash_ids"]),
                     session_id=r.get("session_id"),
                     delay_ms=None if r.get("delay") is None else float(r["delay"]))
            for r in doc]


def build(name: str, *, shape: Shape, trace: TraceShape, seed: str, kv_tokens: int,
          oversubscription: float = 3.0, trace_rows: Sequence[TraceRow] | None = None) -> Workload:
    """Workload ``name`` for ``seed``; ``kv_tokens`` is the pool's KV (all workers) the
    oversubscribed one is sized against; ``trace_rows`` replace the generated trace."""
    tag = f"{seed}-{name}"
    if name == "agents":
        return Workload(name, agent_sessions(shape, tag), session_headers=True)
    if name == "agents_no_session":
        return Workload(name, agent_sessions(shape, tag), session_headers=False)
    if name == "shared_prefix":
        rows = trace_rows if trace_rows is not None else rows_of(
            shared_prefix_trace(trace, tag))
        return Workload(name, trace_sessions(rows, trace.block_size), session_headers=False)
    if name == "oversubscribed":
        big = oversubscribed_shape(shape, kv_tokens, oversubscription)
        return Workload(name, agent_sessions(big, tag), session_headers=True)
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
