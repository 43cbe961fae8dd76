"""``--json``'s last line: its shape exactly, a missing peer reported as missing."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from extproc.dev.bench.peers.backends import Pool
from extproc.dev.bench.peers.install import PeerMissing
from extproc.dev.bench.peers.run import Results, report, rotated, run, table
from extproc.dev.bench.peers.settings import WORKLOADS, Settings
from extproc.dev.bench.peers.stats import FIGURES, Measure, Overhead, PreciseCount


def measured(round_: int = 0) -> Measure:
    return Measure(round_, hit_tokens=9, query_tokens=10, ttfts_s=[0.01, 0.02], output_tokens=64,
                   wall_s=1.0, requests=2, rss_mib=50.0,
                   overhead=Overhead(added_p50_ms_c1=0.5, rps_c16=100.0, cpu_ms_per_req_c16=1.0))


def test_the_last_line_has_exactly_the_issue_shape():
    results = Results("sim", ("saar", "vllm-router:round_robin"), WORKLOADS,
                      missing={"vllm-router:round_robin": "pip install vllm-router failed"})
    for workload in WORKLOADS:
        results.add(workload, "saar", measured())
    doc = json.loads(json.dumps(report(results)))
    assert list(doc) == ["runs"]
    assert [r["workload"] for r in doc["runs"]] == list(WORKLOADS)
    for run_ in doc["runs"]:
        assert {"workload", "backend", "routers"} <= set(run_)
        assert run_["backend"] == "sim"
        assert list(run_["routers"]) == ["saar", "vllm-router:round_robin"]
        assert list(run_["routers"]["saar"]) == list(FIGURES)
        assert all(isinstance(v, float) for v in run_["routers"]["saar"].values())
        assert run_["routers"]["vllm-router:round_robin"] == {
            "missing": "pip install vllm-router failed"}
    assert "missing: pip install" in table(doc)


def test_a_router_measured_on_no_workload_is_missing_too():
    doc = report(Results("vllm", ("saar",), ("agents",)))
    assert doc["runs"][0]["routers"]["saar"] == {"missing": "not measured"}


def test_rounds_rotate_the_order():
    names = ["a", "b", "c"]
    assert [rotated(names, r) for r in range(4)] == [  # type: ignore[arg-type]
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


@dataclass(frozen=True)
class Uninstallable:
    name: str = "sglang-router:cache_aware"

    def prepare(self) -> None:
        raise PeerMissing("pip install sglang-router==0.3.2 failed: no network")

    def start(self, pool: Pool, workdir: Path):  # pragma: no cover - never started
        raise AssertionError("a missing peer is not started")


@dataclass(frozen=True)
class NoWorkers:
    name: str = "sim"

    @contextlib.contextmanager
    def pool(self, workdir: Path) -> Iterator[Pool]:
        yield Pool((), "m", 1000, dict, lambda: None)


def test_a_peer_that_cannot_be_installed_is_reported_missing(tmp_path):
    results = run(Settings(rounds=2), NoWorkers(), [Uninstallable()], tmp_path)
    doc = report(results)
    for run_ in doc["runs"]:
        assert run_["routers"] == {"sglang-router:cache_aware": {
            "missing": "pip install sglang-router==0.3.2 failed: no network"}}


def test_a_real_vllm_run_adds_the_precise_index_of_saar_over_its_rounds():
    results = Results("vllm", ("saar", "vllm-router:round_robin"), ("agents", "oversubscribed"),
                      precise=True)
    for round_, counts in enumerate([PreciseCount(10, 10), PreciseCount(8, 7)]):
        measure = measured(round_)
        measure.precise = counts
        results.add("agents", "saar", measure)
        results.add("agents", "vllm-router:round_robin", measured(round_))
    doc = json.loads(json.dumps(report(results)))
    agents, oversubscribed = doc["runs"]
    assert list(agents) == ["workload", "backend", "routers", "details", "precise_index"]
    assert agents["precise_index"] == {"requests": 18, "within_one_block": 17}
    assert oversubscribed["precise_index"] == {"requests": 0, "within_one_block": 0}
    assert list(agents["routers"]["saar"]) == list(FIGURES)
    assert "17 of 18 requests within one block" in table(doc)


def test_other_backends_have_no_precise_index():
    results = Results("sim", ("saar",), ("agents",))
    results.add("agents", "saar", measured())
    assert "precise_index" not in report(results)["runs"][0]


@dataclass(frozen=True)
class Broken:
    name: str = "vllm"

    @contextlib.contextmanager
    def pool(self, workdir: Path) -> Iterator[Pool]:
        raise RuntimeError("vllm on port 1 exited 1: no memory")
        yield  # pragma: no cover


@dataclass(frozen=True)
class Installable:
    name: str = "saar"

    def prepare(self) -> None:
        pass

    def start(self, pool: Pool, workdir: Path):  # pragma: no cover - never started
        raise AssertionError("no pool, no start")


def test_a_backend_that_cannot_start_makes_every_router_missing(tmp_path):
    doc = report(run(Settings(rounds=1), Broken(), [Installable(), Uninstallable()], tmp_path))
    for run_ in doc["runs"]:
        assert run_["routers"] == {
            "saar": {"missing": "backend vllm did not start: vllm on port 1 exited 1: "
                                "no memory"},
            "sglang-router:cache_aware": {
                "missing": "pip install sglang-router==0.3.2 failed: no network"}}
