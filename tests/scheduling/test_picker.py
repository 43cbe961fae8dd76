from __future__ import annotations

import random
from collections import Counter

from extproc.scheduling.picker import MaxScorePicker


def test_highest_total_first() -> None:
    picker = MaxScorePicker(random.Random(0))
    assert picker.pick({"a": 0.1, "b": 3.0, "c": 1.5}) == ["b", "c", "a"]
    assert picker.pick({}) == []


def test_ties_are_broken_by_the_seeded_rng() -> None:
    totals = {"a": 1.0, "b": 2.0, "c": 2.0, "d": 2.0}
    first = [MaxScorePicker(random.Random(42)).pick(totals) for _ in range(3)]
    assert first[0] == first[1] == first[2]  # same seed, same order
    picker = MaxScorePicker(random.Random(42))
    winners = Counter(picker.pick(totals)[0] for _ in range(300))
    assert set(winners) == {"b", "c", "d"}
    assert min(winners.values()) > 60
    assert all(picker.pick(totals)[-1] == "a" for _ in range(20))
