from __future__ import annotations

import json
from dataclasses import replace

import pytest

from extproc.cli import main
from extproc.config import Scheduling
from extproc.dev.clustersim.blocks import Stream
from extproc.dev.clustersim.engine import CostModel, EngineWorker, SimRequest, WorkerSpec
from extproc.dev.clustersim.runner import SCENARIOS, Experiment, run_matrix, to_json
from extproc.dev.clustersim.simulation import ClusterSpec
from extproc.dev.clustersim.trace import read_trace, scripts_from_trace
from extproc.dev.clustersim.workload import AgenticWorkload
from extproc.observability.trace import MooncakeTraceWriter

SMALL = Experiment(
    cluster=ClusterSpec(workers=2, worker=WorkerSpec(capacity_tokens=256_000)),
    concurrencies=(8,),
    horizon_s=300.0,
    warmup_s=0.0,
)


def test_kv_aware_reuses_prefixes_that_round_robin_scatters() -> None:
    """Four small workers (no host memory): the sessions fit once, not once per worker."""
    cluster = ClusterSpec(workers=4, worker=WorkerSpec(capacity_tokens=128_000, cpu_tokens=0))
    results = run_matrix(replace(SMALL, cluster=cluster, policies=("round_robin", "kv_aware")))
    kv, rr = results["kv_aware"]["8"], results["round_robin"]["8"]
    assert kv.hit_rate > rr.hit_rate + 0.1
    assert kv.reprefill_tokens < rr.reprefill_tokens


def test_runs_are_deterministic() -> None:
    experiment = replace(SMALL, policies=("kv_aware_admission",), horizon_s=120.0)
    assert to_json(run_matrix(experiment)) == to_json(run_matrix(experiment))


def test_admission_holds_only_at_tool_boundaries() -> None:
    """Oversubscribed: admission pauses sessions, yet no turn already sent is held or lost."""
    experiment = replace(SMALL, cluster=replace(SMALL.cluster,
                                                worker=WorkerSpec(capacity_tokens=96_000)))
    sim = experiment.simulation("kv_aware_admission")
    dispatched: list[str] = []
    violations: list[str] = []
    dispatch, tick = sim._dispatch, sim._tick

    def checked_dispatch(run):  # type: ignore[no-untyped-def]
        dispatched.append(run.script.key)
        dispatch(run)

    def checked_tick() -> None:
        tick()
        in_flight = {run.script.key for run, _ in sim._in_flight.values()}
        violations.extend(in_flight & {run.script.key for run in sim._held})

    sim._dispatch, sim._tick = checked_dispatch, checked_tick  # type: ignore[method-assign]
    metrics = sim.run_closed(experiment.workload, 8, experiment.horizon_s)
    assert metrics.max_paused > 0 and metrics.held_turns > 0
    assert not violations
    assert len(dispatched) == metrics.turns + len(sim._in_flight)


def test_a_held_turn_goes_ahead_when_its_hold_runs_out() -> None:
    """As the exchange lets a held request go after ``hold_timeout_seconds``: no turn waits
    longer, and some did wait that long (the pool is oversubscribed)."""
    experiment = replace(SMALL, cluster=replace(SMALL.cluster,
                                                worker=WorkerSpec(capacity_tokens=96_000)))
    for timeout in (5.0, 30.0):
        admission = replace(experiment.scheduling.admission, hold_timeout_seconds=timeout)
        sim = replace(experiment, scheduling=replace(experiment.scheduling, admission=admission)
                      ).simulation("kv_aware_admission")
        metrics = sim.run_closed(experiment.workload, 8, experiment.horizon_s)
        waits = [share.longest_wait_s for share in metrics.tenants.values()]
        assert metrics.held_turns > 0
        assert max(waits) == pytest.approx(timeout), timeout


def test_a_paused_turn_is_refused_when_admission_rejects() -> None:
    experiment = replace(SMALL, cluster=replace(SMALL.cluster,
                                                worker=WorkerSpec(capacity_tokens=96_000)))
    admission = replace(experiment.scheduling.admission, on_paused="reject")
    sim = replace(experiment, scheduling=replace(experiment.scheduling, admission=admission)
                  ).simulation("kv_aware_admission")
    metrics = sim.run_closed(experiment.workload, 8, experiment.horizon_s)
    assert metrics.held_turns == 0
    assert sum(share.shed["paused"] for share in metrics.tenants.values()) > 0


def test_admission_with_hints_keeps_an_oversubscribed_pool_cached() -> None:
    """Oversubscribed (48 sessions on 4 x 128k), with clients that wait as long as admission
    holds them (``hold_timeout_seconds`` of an hour): admission sends each resumed turn back to
    its worker, so the hit rate stays above KV-aware routing alone (85% predicted, 69%
    weighted), with hints or without, and a tenth of its re-prefill at most; the engines apply
    most hints (demote, prefetch, release), and none go to the plain policy."""
    cluster = ClusterSpec(workers=4, worker=WorkerSpec(capacity_tokens=128_000,
                                                       cpu_tokens=256_000))
    admission = replace(SMALL.scheduling.admission, hold_timeout_seconds=3600.0)
    experiment = replace(SMALL, cluster=cluster, concurrencies=(48,), warmup_s=60.0,
                         policies=("kv_aware", "kv_aware_admission", "kv_aware_admission_hints"),
                         scheduling=replace(SMALL.scheduling, admission=admission))
    results = run_matrix(experiment)
    kv, plain = results["kv_aware"]["48"], results["kv_aware_admission"]["48"]
    hinted = results["kv_aware_admission_hints"]["48"]
    assert min(plain.hit_rate, hinted.hit_rate) > kv.hit_rate + 0.05
    assert hinted.reprefill_tokens < 0.1 * kv.reprefill_tokens
    for kind in ("demote", "prefetch", "release"):
        assert hinted.hints[kind] > hinted.hints[f"{kind}_ignored"]
    assert not plain.hints


def test_trace_round_trip_and_replay(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "trace.jsonl"
    shared = [2**60 + i for i in range(4)]
    with path.open("w") as out:
        writer = MooncakeTraceWriter(lambda row: out.write(json.dumps(row) + "\n"))
        for turn in range(3):
            for session in ("a", "b"):
                blocks = [*shared, hash((session, turn)) & (2**63 - 1)]
                writer.write(session_id=session, timestamp_ms=1000.0 * turn,
                             input_length=5 * 64, output_length=20, block_hashes=blocks,
                             delay_ms=500.0 if turn else None)
    rows = read_trace(path)
    assert len(rows) == 6
    assert all(r.hash_ids[:4] == (0, 1, 2, 3) for r in rows)
    assert max(max(r.hash_ids) for r in rows) == 9
    assert rows[1].session_id == "b" and rows[2].delay_ms == 500.0

    experiment = replace(SMALL, cluster=replace(SMALL.cluster, block_size=64),
                         policies=("kv_aware",))
    metrics = experiment.simulation("kv_aware").run_scripts(scripts_from_trace(rows))
    assert metrics.turns == 6
    assert metrics.cached_tokens > 0


def test_bad_trace_row_names_its_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []}\n'
                    '{"timestamp": 1}\n')
    with pytest.raises(ValueError, match=":2:"):
        read_trace(path)


def test_sub_agents_share_the_parent_prefix() -> None:
    parent = Stream(1, 16)
    child = Stream(2, 16, parent, inherit_blocks=3)
    assert child.hashes(80)[:3] == parent.hashes(80)[:3]
    assert child.hashes(80)[3] != parent.hashes(80)[3]
    workload = AgenticWorkload(subagent_probability=1.0)
    script = workload.session(0)
    assert any(step.children for step in script.steps)


def test_prefill_time_follows_uncached_tokens() -> None:
    worker = EngineWorker("w", WorkerSpec(), CostModel(), block_size=64)
    blocks = Stream(1, 64).hashes(64_000)

    def time_to_first_token() -> float:
        worker.submit(SimRequest("s", 64_000, 1, blocks, blocks, 0.0), 0.0)
        elapsed = 0.0
        while True:
            duration = worker.start_step(elapsed)
            assert duration is not None
            elapsed += duration
            first, _ = worker.finish_step(elapsed)
            if first:
                worker.finish_step(elapsed)
                return elapsed

    cold, warm = time_to_first_token(), time_to_first_token()
    assert cold > 10 * warm


def test_cli_json_shape(capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["simulate", "--json", "--concurrency", "2,4", "--workers", "2",
                 "--horizon", "60", "--warmup", "0", "--policies", "round_robin,kv_aware"])
    assert code == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last["policies"]) == {"round_robin", "kv_aware"}
    assert set(last["policies"]["kv_aware"]) == {"2", "4"}
    row = last["policies"]["kv_aware"]["4"]
    assert set(row) == {"prefix_hit_rate", "hit_by_tier", "throughput_tok_s", "ttft_p50_s",
                        "ttft_p99_s", "itl_p50_s", "split_fraction", "tool_loop_split_fraction",
                        "adapter_loads", "reprefill_tokens", "hints", "kv_event_blocks"}
    assert set(row["hit_by_tier"]) == {"GPU", "CPU", "DISK"}
    assert row["prefix_hit_rate"] == pytest.approx(sum(row["hit_by_tier"].values()), abs=2e-4)


PD = replace(SMALL, cluster=ClusterSpec(
        workers=2, prefill_workers=1, pin_tool_loops=True,
        worker=WorkerSpec(capacity_tokens=256_000)),
        workload=AgenticWorkload(context_tokens=(20000, 40000), turns=(4, 8)),
        policies=("pd_never", "pd_always", "pd_session_aware"))


def test_pd_policies_split_as_they_say_and_the_prefill_worker_prefills() -> None:
    results = run_matrix(PD)
    never, always, aware = (results[p]["8"] for p in PD.policies)
    assert never.split == 0 and never.routed > 0
    assert always.split == always.routed > 0
    assert 0 < aware.split < aware.routed
    assert aware.tool_loop_split <= 0.05 * aware.tool_loop_routed  # warm turns stay local
    assert aware.split >= (aware.routed - aware.tool_loop_routed) // 2  # first turns go remote
    assert never.turns > 0 and always.turns > 0 and aware.turns > 0


def test_a_split_turn_is_prefilled_on_the_prefill_worker_and_decoded_on_its_pick() -> None:
    simulation = PD.simulation("pd_always")
    simulation.run_closed(PD.workload, 4, 60.0)
    decode, prefill = simulation.workers[:2], simulation.workers[2]
    assert len(prefill.kv.device) > 0  # it computed the prompts and caches them
    assert all(not r.remote for r in prefill.running)
    assert all(len(w.kv.device) for w in decode)  # the transferred KV landed there


def test_lora_affinity_loads_fewer_adapters_than_kv_aware() -> None:
    """Weighted, the scorer at weight 8 halves the loads; predicted (an adapter not in a slot
    costs its load, and where every slot is taken a wait and the evicted one's reload), the
    scorer's placements tell which adapters are in the slots between turns: fewer loads than
    weighted KV-aware routing and no less throughput than the weighted scorer."""
    weighted = replace(Scheduling(), cost_form="weighted")
    experiment = replace(SCENARIOS["lora"].experiment, concurrencies=(32,), horizon_s=300.0,
                         warmup_s=60.0, scheduling=weighted)
    results = run_matrix(experiment)
    plain, affine = results["kv_aware"]["32"], results["lora_affinity"]["32"]
    assert plain.adapter_loads > 0
    assert affine.adapter_loads < plain.adapter_loads / 2
    assert affine.throughput >= 0.98 * plain.throughput
    predicted = run_matrix(replace(experiment, scheduling=Scheduling(),
                                   policies=("lora_affinity",)))["lora_affinity"]["32"]
    assert predicted.adapter_loads < 0.7 * plain.adapter_loads
    assert predicted.throughput >= affine.throughput


def test_an_adapter_waits_for_a_slot_and_its_load_is_counted() -> None:
    worker = EngineWorker("w", WorkerSpec(capacity_tokens=64_000, max_lora=1), CostModel(), 64)
    stream = Stream(1, 64)
    a = SimRequest("a", 640, 4, stream.hashes(640), stream.hashes(704), 0.0, adapter="x")
    b = SimRequest("b", 640, 4, stream.hashes(640), stream.hashes(704), 0.0, adapter="y")
    worker.submit(a, 0.0)
    worker.submit(b, 0.0)
    worker.start_step(0.0)
    assert worker.running == [a] and worker.waiting == 1  # one slot, busy with x
    assert worker.adapter_loads == 1 and a.loaded_s == CostModel().adapter_load_s
    assert worker.adapter_names() == (frozenset({"x"}), frozenset({"y"}))


@pytest.mark.parametrize(("concurrencies", "headline", "expected"), [
    ((32, 96, 128), 96, "96"), ((32, 48), 96, "48"), ((32, 48), None, "48")])
def test_the_headline_load_is_the_scenarios_unless_the_run_leaves_it_out(
        concurrencies: tuple[int, ...], headline: int | None, expected: str) -> None:
    assert Experiment(concurrencies=concurrencies,
                      headline_concurrency=headline).headline == expected
