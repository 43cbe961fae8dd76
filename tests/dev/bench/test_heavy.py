"""The heavy-body bench's kept ratio: each round's phases side by side."""

from __future__ import annotations

import pytest

from extproc.dev.bench.heavy import Phase, kept_ratios


def phase(name: str, answered: int, seconds: float = 10.0) -> Phase:
    found = Phase(name, seconds=seconds)
    found.statuses[200] = answered
    found.statuses[429] = 7  # refusals are not throughput
    return found


@pytest.mark.parametrize(("answered", "kept"), [
    ([4000, 3000], [0.75]),
    ([4000, 3000, 2000, 1800], [0.75, 0.9]),  # a slower second round keeps its own ratio
    ([0, 100], [0.0]),
])
def test_each_round_is_its_beside_phase_over_its_alone_phase(answered: list[int],
                                                             kept: list[float]) -> None:
    phases = [phase("alone" if i % 2 == 0 else "beside-heavy", n)
              for i, n in enumerate(answered)]
    assert kept_ratios(phases) == pytest.approx(kept)
