from __future__ import annotations

import random
import time
from collections.abc import Sequence

import pytest

from extproc.apis import prompt_blocks
from extproc.config import Scheduling
from extproc.scheduling.filters import SubsetFilter
from extproc.scheduling.picker import MaxScorePicker
from extproc.scheduling.prefix_index import ApproximatePrefixIndex
from extproc.scheduling.scheduler import Scheduler, from_config
from extproc.scheduling.scorers import QueueScorer
from extproc.scheduling.types import SchedulingRequest, Worker

BLOCKS = (1, 2, 3, 4)


class Fixed:
    """A scorer that answers what it is told (out-of-range values included)."""

    def __init__(self, name: str, scores: dict[str, float]) -> None:
        self.name = name
        self.scores = scores

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        return self.scores


class Broken:
    name = "broken"

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        raise RuntimeError("plugin bug")

    def filter(self, request: SchedulingRequest, workers: Sequence[Worker]) -> list[Worker]:
        raise RuntimeError("plugin bug")


def request(subset: frozenset[str] | None = None, session: str | None = "t/s") -> SchedulingRequest:
    return SchedulingRequest("m", session, BLOCKS, prompt_tokens=1000, subset=subset)


def pool(*addresses: str) -> list[Worker]:
    return [Worker(a, "m") for a in addresses]


def scheduler(scorers, filters=(), **kwargs) -> Scheduler:  # type: ignore[no-untyped-def]
    return Scheduler(
        scorers, MaxScorePicker(random.Random(1)), filters, ApproximatePrefixIndex(), **kwargs
    )


def test_weighted_totals_are_clamped_and_ordered_best_first() -> None:
    s = scheduler([
        (Fixed("x", {"a": 2.0, "b": 0.5, "c": float("nan")}), 2.0),
        (Fixed("y", {"a": -1.0, "b": 0.5, "c": 1.0}), 1.0),
    ])
    result = s.schedule(request(), pool("a", "b", "c"))
    assert result.scores == {
        "x": {"a": 1.0, "b": 0.5, "c": 0.0},
        "y": {"a": 0.0, "b": 0.5, "c": 1.0},
    }
    assert result.total == {"a": 2.0, "b": 1.5, "c": 1.0}
    assert result.ordered == ("a", "b", "c")
    assert set(result.durations) >= {"x", "y", "picker", "prefix_index"}
    assert result.failed == ()


def test_a_raising_scorer_counts_as_zero_and_a_raising_filter_as_a_no_op() -> None:
    scorers = [(Broken(), 5.0), (Fixed("y", {"a": 0.2, "b": 0.9}), 1.0)]
    s = scheduler(scorers, filters=[Broken()])
    result = s.schedule(request(), pool("a", "b"))
    assert result.ordered == ("b", "a")
    assert result.scores["broken"] == {}
    assert result.failed == ("broken", "broken")


def test_an_empty_subset_leaves_no_worker() -> None:
    s = scheduler([(QueueScorer(), 1.0)], filters=[SubsetFilter()])
    assert s.schedule(request(subset=frozenset()), pool("a", "b")).ordered == ()
    assert s.schedule(request(subset=frozenset({"b"})), pool("a", "b")).ordered == ("b",)


def test_load_is_shed_when_every_queue_is_over_the_limit() -> None:
    s = scheduler([(QueueScorer(), 1.0)], max_waiting=3)
    busy = [Worker("a", "m", waiting=4), Worker("b", "m", waiting=5)]
    assert s.schedule(request(), busy).shed
    busy[1].waiting = 3
    result = s.schedule(request(), busy)
    assert (result.ordered[0], result.shed) == ("b", False)


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.picks: list[str] = []

    def picked(self, request: SchedulingRequest, address: str) -> None:
        self.picks.append(address)


def test_the_pick_teaches_the_index_and_the_observers() -> None:
    recorder = Recorder()
    s = scheduler([(Fixed("y", {"a": 0.0, "b": 1.0}), 1.0)], observers=[recorder])
    first = s.schedule(request(), pool("a", "b"))
    assert first.matched_blocks == {"a": 0, "b": 0}
    second = s.schedule(request(), pool("a", "b"))
    assert second.matched_blocks == {"a": 0, "b": 4}
    assert recorder.picks == ["b", "b"]


def test_a_pinned_worker_goes_first_while_it_is_eligible() -> None:
    """A hard lock's worker (the tool calls' issuer) beats every score, unless it is gone."""
    s = scheduler([(Fixed("y", {"a": 0.0, "b": 1.0}), 1.0)])
    pinned = SchedulingRequest("m", "t/s", (1, 2, 3, 4), prompt_tokens=64, pinned="a")
    assert s.schedule(pinned, pool("a", "b")).ordered == ("a", "b")
    gone = SchedulingRequest("m", "t/s", (1, 2, 3, 4), prompt_tokens=64, pinned="c")
    assert s.schedule(gone, pool("a", "b")).ordered[0] == "b"


@pytest.mark.parametrize(
    ("workers", "cached", "expected"),
    [
        # Same load: the worker holding the prompt's prefix is cheapest.
        ([Worker("a", "m"), Worker("b", "m")], {"b": 4}, ("b", "a")),
        # Fresh reports: active KV = kv_usage * capacity tokens beats a full prefix hit.
        (
            [Worker("a", "m", kv_usage=0.0, num_blocks=1000),
             Worker("b", "m", kv_usage=0.5, num_blocks=1000)],
            {"b": 4},
            ("a", "b"),  # a: 1000 prefill; b: 0 prefill + 8000 active
        ),
        # Stale: a stale ``running`` is dropped, in-flight requests times the average prompt.
        (
            [Worker("a", "m", running=9, stale=True),
             Worker("b", "m", in_flight=1, stale=True)],
            {},
            ("a", "b"),
        ),
    ],
)
def test_dynamo_cost_orders_lowest_first(
    workers: list[Worker], cached: dict[str, int], expected: tuple[str, ...]
) -> None:
    s = from_config(
        Scheduling(cost_form="dynamo"), index=ApproximatePrefixIndex(), rng=random.Random(3)
    )
    for address, blocks in cached.items():
        s.index.routed(address, BLOCKS[:blocks])
    result = s.schedule(request(), workers)
    assert result.ordered == expected
    assert (result.scores, s.scorers, s.observers) == ({}, (), ())
    assert all(total <= 0 for total in result.total.values())  # total = -cost


def test_dynamo_ties_are_broken_at_random() -> None:
    s = from_config(
        Scheduling(cost_form="dynamo"), index=ApproximatePrefixIndex(), rng=random.Random(3)
    )
    workers = pool("a", "b", "c")
    unrelated = [SchedulingRequest("m", None, (i,), 100) for i in range(60)]  # no prefix hits
    firsts = [s.schedule(r, workers).ordered[0] for r in unrelated]
    assert set(firsts) == {"a", "b", "c"}


def test_from_config_builds_the_gie_defaults() -> None:
    s = from_config(Scheduling(), index=ApproximatePrefixIndex(), rng=random.Random(0))
    assert [(scorer.name, w) for scorer, w in s.scorers] == [
        ("prefix", 3.0), ("queue", 2.0), ("kv_utilization", 2.0), ("session_affinity", 1.0),
        ("active_sessions", 3.0), ("lora_affinity", 8.0), ("slo", 2.0),
    ]
    assert [f.name for f in s.filters] == ["subset", "healthy", "decode_role"]
    observers = [o.name for o in s.observers]  # type: ignore[attr-defined]
    assert observers == ["active_sessions", "lora_affinity"]
    assert s.cost is None and s.predicted is not None  # the scorers break its ties
    assert s.predicted.sessions is s.active_sessions
    no_affinity = from_config(
        Scheduling(cost_form="weighted", scorers={"queue": 1.0, "session_affinity": 0.0}),
        index=ApproximatePrefixIndex(), rng=random.Random(0),
    )
    assert [scorer.name for scorer, _ in no_affinity.scorers] == ["queue"]
    assert no_affinity.observers == () and no_affinity.predicted is None
    ledger = from_config(
        Scheduling(scorers={"queue": 1.0, "active_sessions": 0.0}),
        index=ApproximatePrefixIndex(), rng=random.Random(0),
    )
    assert [scorer.name for scorer, _ in ledger.scorers] == ["queue"]
    # the live sessions' placements the prediction's ``evicts`` reads: kept, not scored
    assert [o.name for o in ledger.observers] == ["active_sessions"]  # type: ignore[attr-defined]
    assert ledger.session_slots == ledger.observers


def test_weighted_defaults_prefer_the_cached_worker_then_spread_load() -> None:
    s = from_config(Scheduling(), index=ApproximatePrefixIndex(), rng=random.Random(0))
    workers = pool("a", "b", "c", "d")
    sessions = [SchedulingRequest("m", f"t/{i}", (i, i + 100), 10) for i in range(4)]
    picks = [s.schedule(r, workers).ordered[0] for r in sessions]
    assert all(s.schedule(r, workers).ordered[0] == p for r, p in zip(sessions, picks, strict=True))


def test_schedule_cost_for_a_64_kib_prompt_and_4_workers() -> None:
    index = ApproximatePrefixIndex()
    s = from_config(Scheduling(), index=index, rng=random.Random(0))
    text = ("def handler(event): return event['body'] # tool output line\n" * 1200)[:65536]
    blocks = prompt_blocks("m", text)
    workers = [Worker(f"10.0.0.{i}:8000", "m", waiting=i, kv_usage=i / 10) for i in range(4)]
    for worker in workers[:2]:
        index.routed(worker.address, blocks[: 700 + 100 * int(worker.address[7])])
    req = SchedulingRequest("m", "t/s", blocks, prompt_tokens=16384)
    first = s.schedule(req, workers).ordered[0]
    runs = 50
    start = time.perf_counter()
    for _ in range(runs):
        result = s.schedule(req, workers)
    micros = (time.perf_counter() - start) / runs * 1e6
    print(f"\nschedule(): 64 KiB prompt, 4 workers in {micros:.0f} us")
    assert result.matched_blocks[first] == 1024  # learnt from the first pick
    assert micros < 5000


def test_a_preferred_eligible_worker_goes_first_and_the_index_learns_it() -> None:
    wanted = {"t/s": "b", "t/gone": "z"}
    s = scheduler([(QueueScorer(), 1.0)], prefer=wanted.get)
    workers = [Worker("a", "m"), Worker("b", "m", waiting=9)]
    result = s.schedule(request(), workers)
    assert result.ordered == ("b", "a")  # the queue alone would pick a
    assert s.index.matched_blocks("b", BLOCKS) == len(BLOCKS)
    assert s.schedule(request(session="t/gone"), workers).ordered == ("a", "b")  # not eligible


def test_the_plugin_registry_is_what_config_and_the_scheduler_read(config):
    """One registry: the config's default weights, the names it accepts, and the scorers the
    scheduler builds are all its."""
    from extproc.config import ConfigError, parse_config
    from extproc.scheduling.plugins import SCORERS, Context, default_weights
    from extproc.scheduling.prefix_index import ApproximatePrefixIndex
    from tests.conftest import session_config_data

    assert config.scheduling.scorers == default_weights()
    index = ApproximatePrefixIndex.from_config(config.scheduling.prefix)
    context = Context(config.scheduling, index, lambda: 0.0, 10)
    assert {name: plugin.make(context).name for name, plugin in SCORERS.items()} == {
        name: name for name in SCORERS}
    data = session_config_data()
    data.setdefault("scheduling", {})["scorers"] = {"prefix": 1.0, "nope": 1.0}
    with pytest.raises(ConfigError, match=r"scheduling\.scorers\.nope: unknown scorer"):
        parse_config(data)
