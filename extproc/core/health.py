"""Which physical models currently have a working backend, learnt from upstream answers.

Envoy health-checks endpoints; this only tells SAAR that a whole model is failing (consecutive
answers that mean the backend is unavailable: 502, 503, 504, or Anthropic's 529), so a locked
session gets a clear 503 with Retry-After instead of having its state silently moved, and an
unlocked one fails over. A 500 is not counted: a caller can provoke one with a bad request, and
one caller must not take a model away from everyone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..types import Clock

UNAVAILABLE = frozenset({502, 503, 504, 529})


@dataclass(slots=True)
class _ModelHealth:
    failures: int = 0
    down_until: float = 0.0


class ModelHealth:
    def __init__(self, *, clock: Clock, failure_threshold: int = 3, cooldown: float = 5.0) -> None:
        self._clock = clock
        self._threshold = failure_threshold
        self._cooldown = cooldown
        self._models: dict[str, _ModelHealth] = {}

    def available(self, model: str) -> bool:
        health = self._models.get(model)
        return health is None or health.down_until <= self._clock()

    def down_for(self, model: str) -> float:
        """Seconds until ``model`` is available again (0: it is)."""
        health = self._models.get(model)
        return max(0.0, health.down_until - self._clock()) if health else 0.0

    def retry_after(self, model: str) -> int:
        health = self._models.get(model)
        wait = health.down_until - self._clock() if health else 0.0
        return max(1, math.ceil(wait))

    def record(self, model: str, status: int) -> None:
        health = self._models.setdefault(model, _ModelHealth())
        if status not in UNAVAILABLE:
            health.failures = 0
            return
        health.failures += 1
        if health.failures >= self._threshold:
            health.down_until = self._clock() + self._cooldown
            health.failures = 0
