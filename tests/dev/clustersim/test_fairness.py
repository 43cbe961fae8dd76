"""The fairness scenario: two tenants through the server's FlowController in the simulator."""

from __future__ import annotations

import json
from dataclasses import replace

from extproc.cli import main
from extproc.dev.clustersim.runner import SCENARIOS, run_fairness
from extproc.dev.clustersim.simulation import ClusterSpec
from extproc.dev.clustersim.trace import read_trace, scripts_from_trace
from extproc.dev.clustersim.workload import AgenticWorkload

QUIET = AgenticWorkload(tenant="quiet", klass="interactive")
NOISY = AgenticWorkload(tenant="noisy", klass="batch", subagent_probability=1.0,
                        subagents=(16, 32), turns=(3, 6), subagent_turns=(3, 8),
                        sheddable_fraction=0.25, seed=1)
SMALL = replace(SCENARIOS["fairness"].experiment, cluster=ClusterSpec(workers=2),
                tenants=((QUIET, 4), (NOISY, 9)), horizon_s=400.0, warmup_s=60.0)
FIGURES = {"ttft_p50_s", "ttft_p99_s", "slo_attainment", "shed", "throughput_tok_s", "turns"}


def test_flow_control_serves_the_quiet_tenant_better_than_fcfs_and_never_past_a_ttl() -> None:
    found = run_fairness(SMALL)
    policies = found["policies"]
    assert set(policies) == {"fcfs", "kv_aware_admission", "flow_control"}
    fcfs, flow = policies["fcfs"], policies["flow_control"]
    assert flow["tenants"]["quiet"]["ttft_p99_s"] < fcfs["tenants"]["quiet"]["ttft_p99_s"] / 2
    assert (flow["tenants"]["quiet"]["slo_attainment"]
            > fcfs["tenants"]["quiet"]["slo_attainment"] + 0.1)
    assert flow["throughput_tok_s"] >= 0.9 * fcfs["throughput_tok_s"]
    # Today's admission lets a held turn go after its 30 s hold, into the same full pool.
    admission = policies["kv_aware_admission"]
    assert (flow["classes"]["interactive"]["slo_attainment"]
            >= admission["classes"]["interactive"]["slo_attainment"] + 0.2)
    for row in flow["classes"].values():
        assert row["longest_wait_s"] <= row["ttl_s"]
    assert flow["classes"]["sheddable"]["shed"] > 0 == flow["tenants"]["quiet"]["shed"]
    assert flow["sheddable_shed_first"] and found["targets"]["waits_within_ttl"]
    assert fcfs["tenants"]["noisy"]["shed"] == 0   # no queue, nothing shed
    assert found["load"]["oversubscription"] > 1.5
    assert 0 < flow["predictor_median_error"] < 1
    alone = found["alone"]["quiet"]
    assert set(alone["by_policy"]) == {"fcfs", "flow_control"}
    assert alone["ttft_p99_s"] < fcfs["tenants"]["quiet"]["ttft_p99_s"]


def test_cli_fairness_json_shape(capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["simulate", "--scenario", "fairness", "--json", "--workers", "1",
                 "--horizon", "90", "--warmup", "10"])
    assert code == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last["policies"]) == {"fcfs", "kv_aware_admission", "flow_control"}
    for row in last["policies"].values():
        assert {"throughput_tok_s", "predictor_median_error", "tenants", "classes"} <= set(row)
        assert set(row["tenants"]["quiet"]) == FIGURES
        for klass in row["classes"].values():
            assert {"ttl_s", "longest_wait_s", "shed", "shed_by_reason"} <= set(klass)
    assert FIGURES | {"policy", "by_policy"} == set(last["alone"]["quiet"])
    assert set(last["targets"]) == {"quiet_p99_vs_alone", "throughput_vs_fcfs",
                                    "interactive_slo_points_over_admission",
                                    "predictor_median_error", "waits_within_ttl",
                                    "sheddable_shed_first"}


def test_a_trace_carries_tenant_class_and_target(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 0, "input_length": 128, "output_length": 4, "hash_ids": [1, 2],
             "session_id": "a", "tenant": "quiet", "class": "interactive", "ttft_ms": 500},
            {"timestamp": 10, "input_length": 192, "output_length": 4, "hash_ids": [1, 2, 3],
             "session_id": "a", "delay": 100},
            {"timestamp": 5, "input_length": 64, "output_length": 4, "hash_ids": [9]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = scripts_from_trace(read_trace(path))
    assert (a.tenant, a.klass, a.ttft_s, len(a.steps)) == ("quiet", "interactive", 0.5, 2)
    assert (b.tenant, b.klass, b.ttft_s) == ("default", None, None)


def test_tenants_share_no_blocks_and_bursts_name_their_program() -> None:
    quiet, noisy = QUIET.session(0), NOISY.session(0)
    assert quiet.key == "quiet-s0" and quiet.tenant == "quiet"
    assert quiet.stream is not None and noisy.stream is not None
    assert not set(quiet.stream.hashes(8192)) & set(noisy.stream.hashes(8192))
    children = [c for step in noisy.steps for c in step.children]
    assert len(children) >= 16
    assert {c.parent for c in children} == {noisy.key}
    assert {c.klass for c in children} == {"batch", "sheddable"}
    assert all(c.tenant == "noisy" for c in children)
