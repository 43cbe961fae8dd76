"""What one simulated run measured, and its summary in the report's units.

A *prefix hit* is a prompt token the worker did not prefill: its KV was on the device when the
request was scheduled (``GPU``), or in host memory or on disk and copied to the device while the
request waited (``CPU`` / ``DISK``: no prefill, but a transfer on its critical path; a prefetch
that landed before the request was scheduled counts as a device hit). ``prefix_hit_rate`` counts
all three; ``hit_by_tier`` splits it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...scheduling.kv_events import BlockRemoved, BlockStored, KVEvent
from .tiers import CPU, DISK, GPU


@dataclass
class Share:
    """One tenant's or one class's part of a run (flow control's figures)."""

    ttfts: list[float] = field(default_factory=list)
    met: int = 0
    """Turns whose first token came within their TTFT target."""
    targeted: int = 0
    """Turns with a TTFT target, shed ones included (a shed turn misses it)."""
    shed: Counter[str] = field(default_factory=Counter)
    """Turns refused, by reason (``flow.REASONS``)."""
    tokens: int = 0
    """Prompt and output tokens of its completed turns."""
    longest_wait_s: float = 0.0
    """The longest a turn that was served waited at the router (queued or held)."""
    first_shed_s: float | None = None

    def first_token(self, ttft: float, target: float | None) -> None:
        self.ttfts.append(ttft)
        if target is not None:
            self.targeted += 1
            self.met += ttft <= target

    def refused(self, reason: str, target: float | None, now: float) -> None:
        self.shed[reason] += 1
        if self.first_shed_s is None:
            self.first_shed_s = now
        self.targeted += target is not None

    def summary(self, duration_s: float) -> dict[str, object]:
        return {
            "ttft_p50_s": round(percentile(self.ttfts, 0.50), 3),
            "ttft_p99_s": round(percentile(self.ttfts, 0.99), 3),
            "slo_attainment": round(self.met / self.targeted, 4) if self.targeted else None,
            "shed": sum(self.shed.values()),
            "throughput_tok_s": round(self.tokens / max(duration_s, 1e-9), 1),
            "turns": len(self.ttfts),
        }


@dataclass
class RunMetrics:
    duration_s: float = 0.0
    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    lower_tokens: Counter[str] = field(default_factory=Counter)
    """Of ``cached_tokens``, those copied from CPU / DISK on the critical path."""
    output_tokens: int = 0
    reprefill_tokens: int = 0
    """Prompt tokens computed again although this session (or the parent it inherited from)
    had computed them before: the cost of eviction."""
    ttfts: list[float] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)
    """Each completed turn's mean inter-token latency (after its first token)."""
    routed: int = 0
    split: int = 0
    """Turns whose prefill went to a prefill worker (of ``routed``)."""
    tool_loop_routed: int = 0
    tool_loop_split: int = 0
    """Of those, the turns continuing a session (a tool result on a warm context)."""
    adapter_loads: int = 0
    """LoRA adapters loaded into a worker's GPU slot."""
    censored: int = 0
    """TTFT samples still waiting at the horizon, counted with their wait so far."""
    held_turns: int = 0
    max_paused: int = 0
    hints: Counter[str] = field(default_factory=Counter)
    """Hints delivered, by kind, and ``<kind>_ignored`` for those the engine did not apply."""
    kv_blocks: Counter[str] = field(default_factory=Counter)
    """Blocks in the workers' KV events, by ``stored|removed`` and medium (``stored CPU``)."""
    tenants: dict[str, Share] = field(default_factory=dict)
    classes: dict[str, Share] = field(default_factory=dict)
    predictor_error: float | None = None
    """The latency predictor's median relative TTFT error over the run, if one was fitted."""

    def shares(self, tenant: str, klass: str) -> tuple[Share, Share]:
        return (self.tenants.setdefault(tenant, Share()),
                self.classes.setdefault(klass, Share()))

    def turn_done(self, prompt: int, cached: int, lower: Mapping[str, int], output: int,
                  reprefill: int) -> None:
        self.turns += 1
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.lower_tokens.update(lower)
        self.output_tokens += output
        self.reprefill_tokens += reprefill

    def dispatched(self, *, tool_loop: bool, split: bool) -> None:
        self.routed += 1
        self.split += split
        self.tool_loop_routed += tool_loop
        self.tool_loop_split += tool_loop and split

    def hint(self, kind: str, taken: bool) -> None:
        self.hints[kind if taken else f"{kind}_ignored"] += 1

    def kv_event(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            self.kv_blocks[f"stored {event.medium}"] += len(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            self.kv_blocks[f"removed {event.medium}"] += len(event.block_hashes)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / max(self.prompt_tokens, 1)

    def hit_by_tier(self) -> dict[str, float]:
        prompt = max(self.prompt_tokens, 1)
        lower = sum(self.lower_tokens.values())
        return {GPU: (self.cached_tokens - lower) / prompt, CPU: self.lower_tokens[CPU] / prompt,
                DISK: self.lower_tokens[DISK] / prompt}

    @property
    def throughput(self) -> float:
        """Prompt and output tokens of completed turns per second."""
        return (self.prompt_tokens + self.output_tokens) / max(self.duration_s, 1e-9)

    @property
    def output_rate(self) -> float:
        return self.output_tokens / max(self.duration_s, 1e-9)

    def ttft(self, q: float) -> float:
        return percentile(self.ttfts, q)

    def summary(self) -> dict[str, object]:
        """The report's fields (JSON)."""
        return {
            "prefix_hit_rate": round(self.hit_rate, 4),
            "hit_by_tier": {m: round(v, 4) for m, v in self.hit_by_tier().items()},
            "throughput_tok_s": round(self.throughput, 1),
            "ttft_p50_s": round(self.ttft(0.50), 3),
            "ttft_p99_s": round(self.ttft(0.99), 3),
            "itl_p50_s": round(percentile(self.itls, 0.5), 4),
            "split_fraction": round(self.split / max(self.routed, 1), 4),
            "tool_loop_split_fraction": round(self.tool_loop_split
                                              / max(self.tool_loop_routed, 1), 4),
            "adapter_loads": self.adapter_loads,
            "reprefill_tokens": self.reprefill_tokens,
            "hints": dict(sorted(self.hints.items())),
            "kv_event_blocks": dict(sorted(self.kv_blocks.items())),
        }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no samples)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
