"""The predicted cost form: each worker's time to first token in seconds, term by term, the
rates it learns, and the picks it makes (tables, on an injected clock)."""

from __future__ import annotations

import random
from dataclasses import replace

import orjson
import pytest

from extproc.config import Scheduling
from extproc.scheduling.predicted import PredictedCost
from extproc.scheduling.prefix_index import ApproximatePrefixIndex
from extproc.scheduling.rates import Priors
from extproc.scheduling.scheduler import Scheduler, from_config
from extproc.scheduling.sessions import ActiveSessionsScorer
from extproc.scheduling.types import EngineTotals, SchedulingRequest, Worker
from tests.conftest import FakeClock

PRIORS = Priors(prefill_tokens_per_s=10_000.0, overhead_s=0.0, step_s=0.02, seq_s=0.001,
                chunk_tokens=1000, uncached_tokens=500.0, session_tokens=1000.0)
"""Round numbers: a token prefills in 0.1 ms, a step of n decoding requests takes
20 + n ms, a waiting request brings 500 tokens, a session grows to 1,000 tokens."""


def worker(address: str, **signals: object) -> Worker:
    return Worker(address, "m", scraped_at=0.0, **signals)  # type: ignore[arg-type]


def ask(tokens: int = 2000, blocks: int = 20, session: str | None = "t/s",
        **fields: object) -> SchedulingRequest:
    return SchedulingRequest("m", session, tuple(range(blocks)), tokens,
                             **fields)  # type: ignore[arg-type]


# -- the prediction ----------------------------------------------------------------------------


@pytest.mark.parametrize(("signals", "matched", "terms"), [
    # idle: its own prefill only
    ({}, 0, {"wait_s": 0.0, "prefill_s": 0.2, "steps_s": 0.0, "interference_s": 0.0}),
    # half the prompt cached there: half the prefill
    ({}, 10, {"wait_s": 0.0, "prefill_s": 0.1, "steps_s": 0.0, "interference_s": 0.0}),
    # two waiting requests scraped: 2 x 500 tokens ahead
    ({"waiting": 2}, 0, {"wait_s": 0.1, "prefill_s": 0.2, "steps_s": 0.0,
                         "interference_s": 0.0}),
    # a stale scrape's queue is not believed
    ({"waiting": 2, "stale": True}, 0, {"wait_s": 0.0, "prefill_s": 0.2}),
    # three decoding: a step with each of its two prefill chunks, and each of the three
    # waits out its 0.2 s of prefill
    ({"running": 3}, 0, {"wait_s": 0.0, "prefill_s": 0.2, "steps_s": 2 * 0.023,
                         "interference_s": 0.6}),
])
def test_each_term_in_seconds(signals: dict[str, object], matched: int,
                              terms: dict[str, float]) -> None:
    model = PredictedCost(priors=PRIORS, clock=FakeClock())
    w = worker("a", **signals)
    predicted = model.predict(ask(), [w], {"a": matched})["a"]
    for name, seconds in terms.items():
        assert getattr(predicted, name) == pytest.approx(seconds), name
    assert predicted.ttft_s == pytest.approx(
        predicted.overhead_s + predicted.adapter_s + predicted.wait_s + predicted.prefill_s
        + predicted.steps_s)
    assert predicted.cost_s == pytest.approx(
        predicted.ttft_s + predicted.interference_s + predicted.evicts_s)


def test_a_routed_request_waits_ahead_until_its_first_token_and_its_end_unqueues_it() -> None:
    clock = FakeClock()
    model = PredictedCost(priors=PRIORS, clock=clock)
    a = worker("a")
    first = ask(request_id="r1")
    model.picked(first, a, model.predict(first, [a], {"a": 0})["a"])
    second = ask(request_id="r2")
    assert model.predict(second, [a], {"a": 0})["a"].wait_s == pytest.approx(0.2)
    model.first_token("r1")
    assert model.predict(second, [a], {"a": 0})["a"].wait_s == 0.0
    model.picked(second, a, model.predict(second, [a], {"a": 0})["a"])
    model.finished("r2")  # ended without a first token (a JSON answer, an error)
    model.answered("r2", 2000, 0, 10)  # its usage, late: nothing to learn
    assert model.predict(ask(), [a], {"a": 0})["a"].wait_s == 0.0
    unnamed = ask()
    model.picked(unnamed, a, model.predict(unnamed, [a], {"a": 0})["a"])
    clock.advance(121)  # nothing heard of it: it stops counting
    assert model.predict(ask(), [a], {"a": 0})["a"].wait_s == 0.0


def test_the_kv_a_request_would_evict_from_live_sessions_is_priced() -> None:
    """Two live sessions of 1,000 tokens fill a 2,000-token worker: a third session's 2,000
    tokens there are prefilled again by someone (all of it: no host memory), 0.2 s; beside
    host memory only a copy back is (a quarter of a prefill at the default tier weight)."""
    clock = FakeClock()
    sessions = ActiveSessionsScorer(clock=clock)
    model = PredictedCost(priors=PRIORS, clock=clock, sessions=sessions)
    full = worker("a", num_blocks=125)  # 125 x 16 = 2,000 tokens
    for key in ("t/1", "t/2"):
        sessions.picked(ask(tokens=1000, session=key), "a")
    assert model.predict(ask(), [full], {"a": 0})["a"].evicts_s == pytest.approx(0.2)
    hosted = worker("a", num_blocks=125, cpu_blocks=1000)
    assert model.predict(ask(), [hosted], {"a": 0})["a"].evicts_s == pytest.approx(0.05)
    roomy = worker("a", num_blocks=1000)
    assert model.predict(ask(), [roomy], {"a": 0})["a"].evicts_s == 0.0
    # a live session's next turn there grows its own KV only
    assert model.predict(ask(tokens=1100, session="t/1"), [full],
                         {"a": 0})["a"].evicts_s == pytest.approx(0.01)


def test_a_sessions_expected_size_is_learnt_from_the_sessions_that_lapse() -> None:
    """Before any session of the model ended, a new one is expected to grow to the prior
    (1,000 tokens here; 0 by default: its prompt); sessions that lapsed at 4,000 tokens
    make the next ones larger."""
    clock = FakeClock()
    sessions = ActiveSessionsScorer(clock=clock, idle_seconds=10.0)
    model = PredictedCost(priors=PRIORS, clock=clock, sessions=sessions)
    w = worker("a", num_blocks=180)  # 2,880 tokens
    sessions.picked(ask(tokens=100, session="t/live"), "a")
    assert model.predict(ask(tokens=100), [w], {"a": 0})["a"].evicts_s == 0.0
    for i in range(30):
        sessions.picked(ask(tokens=4000, session=f"t/{i}"), "b")
    clock.advance(11)
    assert sessions.count("b") == 0  # lapsed, and told
    sessions.picked(ask(tokens=100, session="t/live"), "a")
    assert model.predict(ask(tokens=100), [w], {"a": 0})["a"].evicts_s > 0.0


@pytest.mark.parametrize(("signals", "seconds"), [
    ({"adapters_running": frozenset({"x"}), "max_lora": 2}, 0.0),  # loaded: nothing to do
    ({"adapters_running": frozenset({"y"}), "max_lora": 2}, 0.25),  # a free slot: a load
    # every slot taken: a wait, its load, and the reload of the adapter it evicts
    ({"adapters_running": frozenset({"y", "z"}), "max_lora": 2}, 1.5),
    ({}, 0.25),  # no max_lora reported: a slot is assumed free
])
def test_a_lora_adapter_not_in_a_slot_costs_its_load(signals: dict[str, object],
                                                     seconds: float) -> None:
    model = PredictedCost(priors=replace(PRIORS, adapter_load_s=0.25, slot_wait_s=1.0),
                          clock=FakeClock())
    w = worker("a", **signals)
    assert model.predict(ask(adapter="x"), [w], {"a": 0})["a"].adapter_s == seconds
    assert model.predict(ask(), [w], {"a": 0})["a"].adapter_s == 0.0  # the base model


# -- the rates ---------------------------------------------------------------------------------


def serve(model: PredictedCost, clock: FakeClock, w: Worker, key: str, tokens: int,
          ttft: float, output: int = 0, itl: float = 0.0) -> None:
    request = ask(tokens=tokens, blocks=0, request_id=key)
    model.picked(request, w, model.predict(request, [w], {})[w.address])
    clock.advance(ttft)
    model.first_token(key)
    clock.advance(itl * max(0, output - 1))
    model.answered(key, tokens, None, output)
    model.finished(key)


def test_rates_start_at_the_priors_and_follow_the_answers_timings() -> None:
    clock = FakeClock()
    model = PredictedCost(priors=PRIORS, clock=clock)
    a, b, c = worker("a"), worker("b"), worker("c")
    assert model.rates("m", "a").prefill_tokens_per_s == pytest.approx(10_000)
    # a prefills 40,000 tokens a second behind 30 ms of overhead; it decodes in 10 ms + 2 ms
    # per request decoding
    for i in range(60):
        tokens = 1000 + 500 * (i % 5)
        serve(model, clock, a, f"a{i}", tokens, 0.03 + tokens / 40_000, output=33,
              itl=0.010 + 0.002 * 1)
    learnt = model.rates("m", "a")  # the priors still pull a little
    assert learnt.prefill_tokens_per_s == pytest.approx(40_000, rel=0.25)
    assert learnt.overhead_s == pytest.approx(0.03, abs=0.015)
    # b was never measured: it starts from its pool's measurements, not the priors
    assert model.rates("m", "b").prefill_tokens_per_s > 30_000
    # c, four times slower than a, is learnt apart from it
    for i in range(60):
        serve(model, clock, c, f"c{i}", 2000, 0.03 + 2000 / 10_000)
    assert model.rates("m", "c").prefill_tokens_per_s < 15_000
    assert model.rates("m", "a").prefill_tokens_per_s > 30_000
    assert model.rates("m", "a").step_s + model.rates("m", "a").seq_s == pytest.approx(
        0.012, rel=0.2)
    assert b.address == "b"


def test_rates_follow_the_engines_own_totals_between_scrapes() -> None:
    """Between two scrapes vLLM prefilled 5 requests (12,000 prompt tokens, 2,000 of them
    cached: 2,000 uncached each) in 0.1 s each: 20,000 tokens a second."""
    model = PredictedCost(priors=PRIORS, clock=FakeClock())
    w = worker("a", engine=EngineTotals(prompt_tokens=0.0, cached_tokens=0.0,
                                        prefill_seconds=0.0, prefills=0.0))
    for scrape in range(1, 40):
        w.scraped_at = float(scrape)
        w.engine = EngineTotals(prompt_tokens=12_000.0 * scrape, cached_tokens=2000.0 * scrape,
                                prefill_seconds=0.5 * scrape, prefills=5.0 * scrape)
        model.predict(ask(), [w], {})
    rates = model.rates("m", "a")
    assert rates.overhead_s + 2000 * rates.s_per_token == pytest.approx(0.1, rel=0.05)
    w.scraped_at, w.engine = 40.0, EngineTotals(prompt_tokens=5.0)  # a restart: no sample
    model.predict(ask(), [w], {})
    assert model.rates("m", "a") == rates


# -- the pick ----------------------------------------------------------------------------------


def predicted(clock: FakeClock | None = None, **scheduling: object) -> Scheduler:
    config = replace(Scheduling(), cost_form="predicted", **scheduling)  # type: ignore[arg-type]
    s = from_config(config, index=ApproximatePrefixIndex(), rng=random.Random(0),
                    clock=clock or FakeClock())
    assert s.predicted is not None
    s.predicted.priors = PRIORS
    return s


SUBAGENT = tuple(range(1000, 1431))
"""The issue's sub-agent: its first request, 431 blocks."""


@pytest.mark.parametrize(("form", "expected"), [("weighted", "b"), ("predicted", "a")])
def test_the_issues_sub_agent_goes_where_430_of_its_431_blocks_are(form: str,
                                                                    expected: str) -> None:
    """It matched 430 blocks on a and 1 on b; the only live session on a was its parent,
    idle while it ran (known to the scorer as just another session). Weighted, ``prefix``
    1.0 vs 0.0023 lost to ``active_sessions`` 0.0 vs 1.0 (17.007 vs 17.0); predicted, a
    prefills one block where b prefills 430."""
    clock = FakeClock()
    config = replace(Scheduling(), cost_form=form)  # type: ignore[arg-type]
    s = from_config(config, index=ApproximatePrefixIndex(), rng=random.Random(0), clock=clock)
    s.index.routed("a", SUBAGENT[:430])
    s.index.routed("b", SUBAGENT[:1])
    assert s.active_sessions is not None
    s.active_sessions.picked(SchedulingRequest("m", "t/parent", SUBAGENT[:430], 6880), "a")
    child = SchedulingRequest("m", "t/child", SUBAGENT, 6896)
    result = s.schedule(child, [worker("a"), worker("b")])
    assert result.ordered[0] == expected
    if form == "weighted":
        assert result.scores["prefix"]["a"] == pytest.approx(1.0, abs=0.01)
        assert result.scores["active_sessions"] == {"a": 0.0, "b": 1.0}
    else:
        a, b = result.predicted["a"], result.predicted["b"]
        assert a.uncached_tokens < 20 and b.uncached_tokens > 6800
        assert a.cost_s < b.cost_s


@pytest.mark.parametrize(("case", "a_signals", "expected"), [
    # a new session whose shared system prompt (40 of its 50 blocks) is on a
    ("new", {}, "a"),
    # ... unless a's queue costs more than the prefill it saves: 20 waiting x 500 tokens
    ("new", {"waiting": 20}, "b"),
    # a resumed session (its context on a, bound there) with a busier a
    ("resumed", {"running": 2}, "a"),
    # a sub-agent whose parent's context is on a
    ("subagent", {}, "a"),
])
def test_sessions_go_where_their_prefix_is_unless_the_wait_costs_more(
        case: str, a_signals: dict[str, object], expected: str) -> None:
    s = predicted()
    shared = tuple(range(40))
    s.index.routed("a", shared)
    own = tuple(range(100, 110))
    request = SchedulingRequest("m", "t/new", (*shared, *own), 5000)
    if case == "resumed":
        s.index.routed("a", (*shared, *own))
        request = replace(request, bound_worker="a", reused=50)
    elif case == "subagent":
        s.index.routed("a", (*shared, *own))
        request = replace(request, parent_session="t/parent")
    result = s.schedule(request, [worker("a", **a_signals), worker("b")])
    assert result.ordered[0] == expected
    assert set(result.predicted) == {"a", "b"}


def test_concurrent_identical_prompts_follow_the_first_until_its_queue_says_otherwise() -> None:
    """Routed and not answered yet, the first's blocks count as soon cached where it went,
    and its prefill as ahead there: the second costs the same there as alone elsewhere (a
    tie, broken toward the prefix), and no more do the next."""
    s = predicted()
    workers = [worker(a) for a in ("a", "b", "c", "d")]
    prompt = tuple(range(64))
    picks = [s.schedule(SchedulingRequest("m", None, prompt, 4096, request_id=f"r{i}"),
                        workers).ordered[0] for i in range(4)]
    assert len(set(picks)) == 1
    # the first's prefill is long done elsewhere, not here: a queue of 40 waiting
    busy = [worker(a, waiting=40 if a == picks[0] else 0) for a in ("a", "b", "c", "d")]
    assert s.schedule(SchedulingRequest("m", None, prompt, 4096), busy).ordered[0] != picks[0]


def test_concurrent_requests_of_one_session_stay_together() -> None:
    s = predicted()
    workers = [worker(a) for a in ("a", "b", "c", "d")]
    head = tuple(range(30))
    first = s.schedule(SchedulingRequest("m", "t/s", head, 2000, request_id="r1"), workers)
    again = s.schedule(SchedulingRequest("m", "t/s", (*head, 31, 32), 2100, bound_worker=None,
                                         request_id="r2"), workers)
    assert again.ordered[0] == first.ordered[0]


def test_a_worker_whose_live_sessions_fill_its_kv_loses_a_new_session() -> None:
    """A quarter of the new session's prompt is on a, but a's KV is full of live sessions:
    there it would prefill three quarters and evict as much of theirs, more than its whole
    prefill on b."""
    s = predicted()
    assert s.active_sessions is not None
    shared = tuple(range(5))
    s.index.routed("a", shared)
    for i in range(4):
        s.active_sessions.picked(SchedulingRequest("m", f"t/{i}", shared, 900), "a")
    small = [worker("a", num_blocks=200), worker("b", num_blocks=200)]  # 3,200 tokens each
    result = s.schedule(SchedulingRequest("m", "t/new", (*shared, *range(50, 65)), 2000),
                        small)
    assert result.ordered[0] == "b"
    assert result.predicted["a"].evicts_s > 0 and result.predicted["b"].evicts_s == 0


def test_a_hard_locks_worker_still_goes_first() -> None:
    """Tool loops and provider state pin their worker whatever the prediction says."""
    s = predicted()
    s.index.routed("b", tuple(range(40)))
    pinned = SchedulingRequest("m", "t/s", tuple(range(40)), 4000, pinned="a")
    result = s.schedule(pinned, [worker("a", waiting=30), worker("b")])
    assert result.ordered == ("a", "b")
    assert result.predicted["a"].cost_s > result.predicted["b"].cost_s


def test_ties_are_broken_by_the_weighted_scorers_then_at_random() -> None:
    """Nothing cached anywhere, nothing queued: every worker costs the same, and new
    sessions spread by the scorers (``active_sessions``: the KV placed on each)."""
    s = predicted()
    assert s.predicted is not None
    workers = [worker(a) for a in ("a", "b", "c")]
    picks = []
    for i in range(6):
        result = s.schedule(SchedulingRequest("m", f"t/{i}", (i,), 100, request_id=f"r{i}"),
                            workers)
        assert len({p.cost_s for p in result.predicted.values()}) == 1
        picks.append(result.ordered[0])
        s.predicted.first_token(f"r{i}")
    assert sorted(picks) == ["a", "a", "b", "b", "c", "c"]


# -- through the router: the record ------------------------------------------------------------


def test_the_replay_record_gives_each_candidates_terms_in_seconds(clock) -> None:  # type: ignore[no-untyped-def]
    from extproc.assembly import assemble
    from extproc.config import parse_config
    from extproc.core.router import LocalDriver
    from extproc.types import Api, ResponseSummary
    from tests.conftest import session_config_data

    data = session_config_data()
    data["models"]["qwen3-8b"]["endpoints"] = ["10.0.0.1:80", "10.0.0.2:80"]
    data.setdefault("scheduling", {})["cost_form"] = "predicted"
    parts = assemble(parse_config(data, source="predicted"), clock=clock)
    local = LocalDriver(parts.router)
    raw = orjson.dumps({"model": "qwen3-8b", "messages": [
        {"role": "user", "content": "summarise the failing test " * 300}]})
    headers = {"authorization": "Bearer k", "x-session-id": "s1"}
    first = local.route(Api.CHAT, headers, raw)
    second = local.route(Api.CHAT, {**headers, "x-session-id": "s2"}, raw)
    assert second.placement.worker == first.placement.worker  # the same prompt, in flight
    record = parts.replay.get(second.replay_id)["worker"]
    picked = record["predicted"][record["picked"]]
    assert picked["wait_s"] > 0 and picked["ahead_tokens"] > 0  # the first, ahead of it
    for terms in record["predicted"].values():
        assert terms["ttft_s"] == pytest.approx(
            terms["overhead_s"] + terms["adapter_s"] + terms["wait_s"] + terms["prefill_s"]
            + terms["steps_s"], abs=1e-5)
        assert terms["cost_s"] == pytest.approx(
            terms["ttft_s"] + terms["interference_s"] + terms["evicts_s"], abs=1e-5)
    assert set(record["by_scorer"]) >= {"prefix", "queue"}  # the tie-breakers, recorded
    for routed in (first, second):
        local.respond(routed, ResponseSummary(status=200, model=routed.model))
    predicted_cost = parts.pools.scheduler.predicted
    assert predicted_cost is not None
    third = local.route(Api.CHAT, {**headers, "x-session-id": "s3"}, raw)
    terms = parts.replay.get(third.replay_id)["worker"]["predicted"][third.placement.worker]
    assert terms["wait_s"] == 0.0  # both answered: nothing ahead any more
