"""What one simulated run measured, and its summary in the report's units."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class RunMetrics:
    duration_s: float = 0.0
    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reprefill_tokens: int = 0
    """Prompt tokens computed again although this session (or the parent it inherited from)
    had computed them before: the cost of eviction."""
    ttfts: list[float] = field(default_factory=list)
    censored: int = 0
    """TTFT samples still waiting at the horizon, counted with their wait so far."""
    held_turns: int = 0
    max_paused: int = 0

    def turn_done(self, prompt: int, cached: int, output: int, reprefill: int) -> None:
        self.turns += 1
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.output_tokens += output
        self.reprefill_tokens += reprefill

    def summary(self) -> dict[str, float]:
        """The report's fields: throughput counts prompt and output tokens of completed turns."""
        duration = max(self.duration_s, 1e-9)
        return {
            "prefix_hit_rate": round(self.cached_tokens / max(self.prompt_tokens, 1), 4),
            "throughput_tok_s": round((self.prompt_tokens + self.output_tokens) / duration, 1),
            "ttft_p50_s": round(percentile(self.ttfts, 0.50), 3),
            "ttft_p99_s": round(percentile(self.ttfts, 0.99), 3),
            "reprefill_tokens": self.reprefill_tokens,
        }

    def extra(self) -> dict[str, float]:
        """Context for the table: output rate, turns, admission activity."""
        duration = max(self.duration_s, 1e-9)
        return {
            "output_tok_s": round(self.output_tokens / duration, 1),
            "turns": self.turns,
            "held_turns": self.held_turns,
            "max_paused": self.max_paused,
            "censored": self.censored,
        }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no samples)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
