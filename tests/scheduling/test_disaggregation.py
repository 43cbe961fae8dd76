"""The P/D decision as a table: the mode, what the decode worker holds (the index's match or,
on the session's own worker, its previous prompt), the threshold and the prefill pool's state."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from extproc.config import Disaggregation, Scheduling
from extproc.scheduling.disaggregation import Disaggregator
from extproc.scheduling.prefix_index import ApproximatePrefixIndex
from extproc.scheduling.types import SchedulingRequest, Worker

TOKENS_PER_BLOCK = 16


def pool(*prefill_loads: int, prefill_healthy: bool = True) -> list[Worker]:
    decode = [Worker("d1", "m", role="decode"), Worker("d2", "m", role="decode")]
    return decode + [Worker(f"p{i}", "m", role="prefill", running=load,
                            healthy=prefill_healthy)
                     for i, load in enumerate(prefill_loads)]


def disaggregator(mode: str = "session_aware", threshold: int = 1000) -> Disaggregator:
    scheduling = Scheduling(disaggregation=Disaggregation(
        mode=mode, threshold_tokens=threshold))  # type: ignore[arg-type]
    return Disaggregator.from_config(scheduling, index=ApproximatePrefixIndex(),
                                     rng=random.Random(0), tokens_per_block=TOKENS_PER_BLOCK)


def request(tokens: int, *, bound: str | None = None, reused: int = 0,
            session: str = "t/s") -> SchedulingRequest:
    return SchedulingRequest("m", session, tuple(range(tokens // TOKENS_PER_BLOCK)), tokens,
                             bound_worker=bound, reused=reused)


@pytest.mark.parametrize(("mode", "tokens", "matched", "bound", "reused", "loads", "expected"), [
    # a first turn: 20k tokens, nothing cached on the decode worker
    ("session_aware", 20_000, 0, None, 0, (0,), ("p0", "cold", 20_000)),
    # the index holds most of it there: below the threshold, local
    ("session_aware", 20_000, 1200, None, 0, (0,), (None, "warm", 800)),
    # a tool-loop turn on its own worker: its previous prompt counts as held
    ("session_aware", 20_400, 0, "d1", 1250, (0,), (None, "warm", 400)),
    # ... but not on another worker (the session moved: a re-prefill)
    ("session_aware", 20_400, 0, "d2", 1250, (0,), ("p0", "cold", 20_400)),
    # a tool result that adds more than the threshold: split even when warm
    ("session_aware", 22_000, 0, "d1", 1250, (0,), ("p0", "cold", 2_000)),
    # every prefill worker full: prefill locally rather than queue behind them
    ("session_aware", 20_000, 0, None, 0, (2, 5), (None, "prefill_busy", 20_000)),
    # the least loaded prefill worker with room
    ("session_aware", 20_000, 0, None, 0, (2, 1), ("p1", "cold", 20_000)),
    ("always", 100, 0, "d1", 6, (3,), ("p0", "always", 4)),
    ("never", 20_000, 0, None, 0, (0,), (None, "never", 20_000)),
])
def test_the_split_decision(mode: str, tokens: int, matched: int, bound: str | None,
                            reused: int, loads: tuple[int, ...],
                            expected: tuple[str | None, str, int]) -> None:
    split = disaggregator(mode).decide(request(tokens, bound=bound, reused=reused), "d1",
                                       {"d1": matched, "d2": 0}, pool(*loads))
    assert split is not None
    assert (split.prefill, split.reason, split.uncached_tokens) == expected
    assert (split.scores != {}) == (split.prefill is not None)


def test_a_pool_without_prefill_workers_decides_nothing() -> None:
    assert disaggregator().decide(request(20_000), "d1", {}, pool()) is None


def test_no_healthy_prefill_worker_prefills_locally() -> None:
    split = disaggregator().decide(request(20_000), "d1", {}, pool(0, prefill_healthy=False))
    assert split is not None and (split.prefill, split.reason) == (None, "no_prefill_worker")


def test_the_prefill_phase_has_its_own_binding_and_learns_its_prefix() -> None:
    chooser = disaggregator()
    workers = pool(0, 0)
    first = chooser.decide(request(20_000), "d1", {}, workers)
    assert first is not None and first.prefill is not None
    assert chooser.bound("t/s") == first.prefill
    # the same prompt grown: the prefill worker that computed it has its prefix
    again = chooser.decide(request(24_000), "d1", {}, workers)
    assert again is not None and again.prefill == first.prefill
    other = chooser.decide(replace(request(20_000), session_key="t/other"), "d1", {}, workers)
    assert other is not None and chooser.bound("t/other") == other.prefill
