"""The in-process store's bounded, expiring map against a plain reference model."""

from __future__ import annotations

import random

import pytest

from extproc.state.memory import Expiring


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_after_their_last_write_and_the_oldest_write_leaves_first():
    clock = Clock()
    table: Expiring[str, int] = Expiring(2, 10.0, clock)
    table["a"], table["b"] = 1, 2
    clock.now = 5
    table["a"] = 3  # rewritten: now the newest
    table["c"] = 4  # full: "b", the oldest write, leaves
    assert (table.get("a"), table.get("b"), table.get("c")) == (3, None, 4)
    clock.now = 15  # "a" and "c" were written at 5: they live until 15
    assert len(table) == 0 and table.get("a") is None


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_match_a_reference(seed):
    rnd = random.Random(seed)
    clock = Clock()
    size, ttl = rnd.randint(1, 6), rnd.uniform(1, 20)
    table: Expiring[int, int] = Expiring(size, ttl, clock)
    model: dict[int, tuple[int, float, int]] = {}  # key -> (value, written, order of writes)
    for step in range(400):
        clock.now += rnd.uniform(0, 3)
        key, op = rnd.randrange(10), rnd.random()
        live = {k: v for k, v in model.items() if v[1] + ttl > clock.now}
        if op < 0.5:
            table[key] = step
            live[key] = (step, clock.now, step)
            while len(live) > size:
                del live[min(live, key=lambda k: live[k][2])]
        elif op < 0.6:
            table.pop(key)
            live.pop(key, None)
        elif op < 0.7:
            table.setdefault(key, step)
            if key not in live:
                live[key] = (step, clock.now, step)
                while len(live) > size:
                    del live[min(live, key=lambda k: live[k][2])]
        model = live
        assert table.get(key) == (model[key][0] if key in model else None)
        assert len(table) == len(model)
        assert dict(table.items()) == {k: v[0] for k, v in model.items()}
