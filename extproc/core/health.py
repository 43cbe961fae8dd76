"""Which physical models currently have a working backend, learnt from upstream answers.

Envoy health-checks endpoints; this only tells SAAR that a whole model is failing (consecutive
5xx or no healthy upstream), so a locked session gets a clear 503 with Retry-After instead of
having its state silently moved, and an unlocked one fails over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..types import Clock


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

    def retry_after(self, model: str) -> int:
        health = self._models.get(model)
        wait = health.down_until - self._clock() if health else 0.0
        return max(1, math.ceil(wait))

    def record(self, model: str, status: int) -> None:
        health = self._models.setdefault(model, _ModelHealth())
        if status < 500:
            health.failures = 0
            return
        health.failures += 1
        if health.failures >= self._threshold:
            health.down_until = self._clock() + self._cooldown
            health.failures = 0
