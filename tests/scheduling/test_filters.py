from __future__ import annotations

import pytest

from extproc.scheduling.filters import HealthyFilter, SubsetFilter
from extproc.scheduling.types import SchedulingRequest, Worker

WORKERS = [Worker("a", "m"), Worker("b", "m", healthy=False), Worker("c", "m")]


@pytest.mark.parametrize(
    ("subset", "expected"),
    [
        (None, ["a", "b", "c"]),
        (frozenset(), []),
        (frozenset({"c", "z"}), ["c"]),
        (frozenset({"z"}), []),
    ],
)
def test_subset_filter(subset: frozenset[str] | None, expected: list[str]) -> None:
    request = SchedulingRequest("m", None, (), 0, subset=subset)
    assert [w.address for w in SubsetFilter().filter(request, WORKERS)] == expected


def test_healthy_filter() -> None:
    request = SchedulingRequest("m", None, (), 0)
    assert [w.address for w in HealthyFilter().filter(request, WORKERS)] == ["a", "c"]
