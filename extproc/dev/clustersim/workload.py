"""Agentic session workloads: scripts of turns the simulator plays, synthetic or from a trace.

A coding-agent session opens with a large prefill (a system prompt and tool definitions shared
by every session, then its own task and repository context), then runs 10-40 turns; each turn
resends the whole context plus the previous answer and the tool output, and tools run for
seconds to minutes in between. Some sessions hand a sub-task to sub-agents that start from the
parent's context (sharing its prefix) while the parent waits for them, as a Task tool does.

With ``adapters``, each session runs with one LoRA adapter of the base model, drawn with a
Zipf skew (a few hot adapters, a long tail), and its system prompt's KV is the adapter's own:
sessions share a prefix only with sessions of the same adapter.

A workload is one tenant's traffic: its sessions carry the tenant, a priority class and a TTFT
target (flow control's inputs); a tenant that bursts gives every session many sub-agents, some
of them in a sheddable class. Sessions of different tenants share no blocks (their own system
prompt, their own owners).
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field

from .blocks import Stream

SYSTEM_OWNER = 0
"""Stream owner of the default tenant's system prompt; its session owners start at 1 (another
tenant's system prompt and sessions are owned from ``_owner_base`` on)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One LLM call of a session."""

    prompt_tokens: int
    output_tokens: int
    delay_s: float = 0.0
    """Tool time between the previous step's end (or its sub-agents') and this call."""
    not_before_s: float = 0.0
    """Earliest arrival in absolute time (open-loop trace rows)."""
    hash_ids: tuple[int, ...] | None = None
    """A trace row's block ids; None means the blocks come from the session's stream."""
    children: tuple[Script, ...] = ()
    """Sub-agents started when the previous step ends; this step waits for all of them."""


@dataclass(frozen=True, slots=True)
class Script:
    key: str
    steps: tuple[Step, ...]
    start_s: float = 0.0
    parent: str | None = None
    stream: Stream | None = None
    adapter: str | None = None
    """The LoRA adapter the session runs with (None: the base model)."""
    tenant: str = "default"
    klass: str | None = None
    """Its priority class (flow control's ``x-saar-class``; None: the default class)."""
    ttft_s: float | None = None
    """Its TTFT target (the ``x-saar-slo-ttft-ms`` header; None: its class's)."""

    def turns(self) -> int:
        return len(self.steps) + sum(c.turns() for s in self.steps for c in s.children)


@dataclass(frozen=True)
class AgenticWorkload:
    """Shape of the synthetic agent traffic (token counts, turn counts, tool times)."""

    block_size: int = 64
    system_tokens: int = 6144
    context_tokens: tuple[int, int] = (2048, 14000)
    turns: tuple[int, int] = (10, 40)
    output_median: float = 300.0
    output_sigma: float = 0.6
    tool_tokens_median: float = 800.0
    tool_tokens_sigma: float = 1.0
    tool_wait_median_s: float = 4.0
    tool_wait_sigma: float = 1.2
    subagent_probability: float = 0.2
    subagents: tuple[int, int] = (1, 3)
    subagent_turns: tuple[int, int] = (5, 15)
    subagent_task_tokens: tuple[int, int] = (500, 2000)
    adapters: int = 0
    """LoRA adapters the sessions use (0: every session runs on the base model)."""
    adapter_skew: float = 1.0
    """Zipf exponent of the adapters' popularity."""
    tenant: str = "default"
    """Whose sessions these are; another tenant's keys start with its name."""
    klass: str | None = None
    """The sessions' priority class (None: the default class)."""
    subagent_class: str | None = None
    """Their sub-agents' class (None: the parent's)."""
    sheddable_fraction: float = 0.0
    """Share of the sub-agents sent in the ``sheddable`` class instead."""
    ttft_s: float | None = None
    """A TTFT target every turn sends (None: the class's)."""
    seed: int = 0
    _system: Stream = field(init=False, repr=False, compare=False)
    _adapter_systems: tuple[Stream, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_system", Stream(SYSTEM_OWNER + self._owner_base - 1,
                                                   self.block_size))
        object.__setattr__(self, "_adapter_systems", tuple(
            Stream(-1 - a, self.block_size) for a in range(self.adapters)))

    @property
    def _owner_base(self) -> int:
        """Stream owners of this tenant's sessions start here, its system prompt's just below."""
        return 1 if self.tenant == "default" else 1 + zlib.crc32(self.tenant.encode()) * 2**32

    @property
    def _stride(self) -> int:
        """Owners one session and its sub-agents take."""
        return max(16, self.subagents[1] + 1)

    @property
    def _prefix(self) -> str:
        return "" if self.tenant == "default" else f"{self.tenant}-"

    @staticmethod
    def adapter_name(index: int) -> str:
        return f"adapter-{index}"

    def session(self, index: int, start_s: float = 0.0) -> Script:
        """Session ``index`` of the endless sequence; the same for every policy and run."""
        rng = random.Random(self.seed * 1_000_003 + index)
        owner = self._owner_base + index * self._stride
        system_blocks = self.system_tokens // self.block_size
        system, adapter = self._system, None
        if self.adapters:
            weights = [1 / (a + 1) ** self.adapter_skew for a in range(self.adapters)]
            chosen = rng.choices(range(self.adapters), weights)[0]
            system, adapter = self._adapter_systems[chosen], self.adapter_name(chosen)
        stream = Stream(owner, self.block_size, system, system_blocks)
        initial = system_blocks * self.block_size + rng.randint(*self.context_tokens)
        spawn_at = -1
        n_turns = rng.randint(*self.turns)
        if rng.random() < self.subagent_probability:
            spawn_at = rng.randint(2, n_turns - 1)
        steps: list[Step] = []
        context = initial
        for turn in range(n_turns):
            children: tuple[Script, ...] = ()
            if turn == spawn_at:
                children = tuple(
                    self._child(rng, f"{self._prefix}s{index}/sub{n}", owner + 1 + n, stream,
                                context, adapter)
                    for n in range(rng.randint(*self.subagents))
                )
            delay = self._tool_wait(rng) if turn else 0.0
            output = self._output(rng)
            steps.append(Step(context, output, delay, children=children))
            context += output + self._tool_tokens(rng)
        return Script(f"{self._prefix}s{index}", tuple(steps), start_s, stream=stream,
                      adapter=adapter, tenant=self.tenant, klass=self.klass, ttft_s=self.ttft_s)

    def _child(self, rng: random.Random, key: str, owner: int, parent: Stream,
               parent_context: int, adapter: str | None) -> Script:
        inherit = parent_context // self.block_size
        stream = Stream(owner, self.block_size, parent, inherit)
        context = inherit * self.block_size + rng.randint(*self.subagent_task_tokens)
        steps: list[Step] = []
        for turn in range(rng.randint(*self.subagent_turns)):
            output = self._output(rng)
            steps.append(Step(context, output, self._tool_wait(rng) if turn else 0.0))
            context += output + self._tool_tokens(rng)
        klass = self.subagent_class or self.klass
        if self.sheddable_fraction and rng.random() < self.sheddable_fraction:
            klass = "sheddable"
        return Script(key, tuple(steps), parent=key.split("/")[0], stream=stream,
                      adapter=adapter, tenant=self.tenant, klass=klass, ttft_s=self.ttft_s)

    def _output(self, rng: random.Random) -> int:
        return _lognormal_int(rng, self.output_median, self.output_sigma, 16, 4096)

    def _tool_tokens(self, rng: random.Random) -> int:
        return _lognormal_int(rng, self.tool_tokens_median, self.tool_tokens_sigma, 16, 16000)

    def _tool_wait(self, rng: random.Random) -> float:
        value = rng.lognormvariate(math.log(self.tool_wait_median_s), self.tool_wait_sigma)
        return min(max(value, 0.2), 600.0)


def _lognormal_int(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(max(int(rng.lognormvariate(math.log(median), sigma)), low), high)
