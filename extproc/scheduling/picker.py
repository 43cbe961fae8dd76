"""Max-score picking with random tie-break, the Gateway API Inference Extension's default."""

from __future__ import annotations

import random
from collections.abc import Mapping


class MaxScorePicker:
    """All addresses, highest total first; equal totals in an order drawn from ``rng`` (seeded
    by the caller, so a replay picks the same), which spreads load across equal workers
    instead of always favouring the first configured."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, totals: Mapping[str, float]) -> list[str]:
        addresses = list(totals)
        self._rng.shuffle(addresses)
        addresses.sort(key=totals.__getitem__, reverse=True)
        return addresses
