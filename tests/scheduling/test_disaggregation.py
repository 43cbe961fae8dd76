"""The P/D decision as a table: the mode, what the decode worker holds (the index's match or,
on the session's own worker, its previous prompt), the threshold and the prefill pool's state."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from extproc.config import Disaggregation, Scheduling
from extproc.scheduling.disaggregation import Disaggregator, Split
from extproc.scheduling.prefix_index import ApproximatePrefixIndex
from extproc.scheduling.types import SchedulingRequest, Worker

TOKENS_PER_BLOCK = 16


DEVICE_BLOCKS = HOST_BLOCKS = 2000
"""The decode workers' tiers: 32k tokens on the device, 32k in host memory."""


def pool(*prefill_loads: int, prefill_healthy: bool = True, waiting: int = 0) -> list[Worker]:
    decode = [Worker(f"d{i}", "m", role="decode", num_blocks=DEVICE_BLOCKS,
                     cpu_blocks=HOST_BLOCKS, waiting=waiting) for i in (1, 2)]
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
    """A prompt of ``session``'s own blocks (sessions share none): its longer prompts extend
    its shorter ones."""
    base = 1_000_000 * int(session.removeprefix("t/s") or 0)
    return SchedulingRequest("m", session, tuple(range(base, base + tokens // TOKENS_PER_BLOCK)),
                             tokens, bound_worker=bound, reused=reused)


Sent = tuple[tuple[str, str, int], ...]
"""Earlier requests the disaggregator decided: (session, decode worker, prompt tokens)."""
OWN: Sent = (("t/s", "d1", 20_000),)


@pytest.mark.parametrize(
    ("mode", "tokens", "matched", "before", "bound", "loads", "waiting", "expected"), [
    # a first turn: 20k tokens, nothing cached on the decode worker
    ("session_aware", 20_000, 0, (), None, (0,), 0, ("p0", "cold", 20_000)),
    # the index holds most of it there: below the threshold, local
    ("session_aware", 20_000, 1200, (), None, (0,), 0, (None, "warm", 800)),
    # a tool-loop turn on its own worker: its previous prompt is held there
    ("session_aware", 20_400, 0, OWN, "d1", (0,), 0, (None, "warm", 400)),
    # ... but not on another worker (the session moved: a re-prefill)
    ("session_aware", 20_400, 0, (("t/s", "d2", 20_000),), "d2", (0,), 0,
     ("p0", "cold", 20_400)),
    # ... still held when another session's prompt pushed it off the device into host memory
    ("session_aware", 20_400, 0, (*OWN, ("t/s1", "d1", 20_000)), "d1", (0,), 0,
     (None, "warm", 400)),
    # ... gone when more than device and host memory hold came after it: a re-prefill
    ("session_aware", 20_400, 0, (*OWN, ("t/s1", "d1", 25_000), ("t/s2", "d1", 25_000)),
     "d1", (0,), 0, ("p0", "cold", 20_400)),
    # ... the one that came after on another worker does not push it out
    ("session_aware", 20_400, 0, (*OWN, ("t/s1", "d2", 25_000), ("t/s2", "d2", 25_000)),
     "d1", (0,), 0, (None, "warm", 400)),
    # a tool result that adds more than the threshold: split even when warm
    ("session_aware", 22_000, 0, OWN, "d1", (0,), 0, ("p0", "cold", 2_000)),
    # every prefill worker full: prefill locally rather than queue behind them
    ("session_aware", 20_000, 0, (), None, (2, 5), 3, (None, "prefill_busy", 20_000)),
    # a busy prefill worker, nothing waiting on the decode worker: local prefill starts now
    ("session_aware", 20_000, 0, (), None, (1,), 0, (None, "prefill_busy", 20_000)),
    # ... with requests waiting there a local prefill would wait too: queue at the prefill worker
    ("session_aware", 20_000, 0, (), None, (1,), 1, ("p0", "cold", 20_000)),
    # the least loaded prefill worker with room
    ("session_aware", 20_000, 0, (), None, (2, 1), 1, ("p1", "cold", 20_000)),
    ("always", 100, 0, (("t/s", "d1", 96),), "d1", (3,), 0, ("p0", "always", 4)),
    ("never", 20_000, 0, (), None, (0,), 0, (None, "never", 20_000)),
])
def test_the_split_decision(mode: str, tokens: int, matched: int, before: Sent,
                            bound: str | None, loads: tuple[int, ...], waiting: int,
                            expected: tuple[str | None, str, int]) -> None:
    chooser = disaggregator(mode)
    workers = pool(*loads, waiting=waiting)
    for session, worker, sent in before:
        chooser.decide(request(sent, session=session), worker, {}, workers)
    reused = before[0][2] // TOKENS_PER_BLOCK if before else 0
    split = chooser.decide(request(tokens, bound=bound, reused=reused), "d1",
                           {"d1": matched, "d2": 0}, workers)
    assert split is not None
    assert (split.prefill, split.reason, split.uncached_tokens) == expected
    assert (split.scores != {}) == (split.prefill is not None)


def test_a_prefill_worker_busy_at_the_last_scrape_is_free_once_its_prefill_ended() -> None:
    """The scrape caught the previous first turn's prefill; its answer has begun since (the
    router was told), so the next first turn is split, not kept local as ``prefill_busy``."""
    workers = pool(1)
    prefill = workers[-1]
    assert disaggregator().decide(request(20_000), "d1", {}, workers) == Split(
        None, "prefill_busy", 20_000)
    prefill.since_scrape = -1  # one finished since the scrape: what the registry counts
    split = disaggregator().decide(request(20_000), "d1", {}, workers)
    assert split is not None and (split.prefill, split.reason) == ("p0", "cold")


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
