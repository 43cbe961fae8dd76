from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from extproc.config import ConfigError, Model, WorkerSpec
from extproc.scheduling.workers import WorkerRegistry, load_workers_file

from .test_signals import SGLANG, sim_page

if TYPE_CHECKING:
    from tests.conftest import FakeClock

MODELS = {
    "big": Model(
        cluster="big",
        endpoints=("10.0.0.1:8000",),
        workers=(WorkerSpec("10.0.0.2:8000", metrics_url="http://m/x", kv_events="tcp://e:5557"),),
    ),
    "small": Model(cluster="small"),
}


def registry(clock: FakeClock) -> WorkerRegistry:
    return WorkerRegistry(MODELS, clock=clock, staleness_seconds=2.0)


def addresses(reg: WorkerRegistry, model: str) -> list[str]:
    return [w.address for w in reg.pool(model)]


def test_pools_come_from_endpoints_and_workers(clock: FakeClock) -> None:
    reg = registry(clock)
    first, second = reg.pool("big")
    assert (first.address, first.metrics_url) == ("10.0.0.1:8000", "http://10.0.0.1:8000/metrics")
    assert (second.metrics_url, second.kv_events) == ("http://m/x", "tcp://e:5557")
    assert reg.pool("small") == []
    assert reg.pool("unknown") == []


def test_a_scrape_sets_signals_and_staleness_follows_the_clock(clock: FakeClock) -> None:
    reg = registry(clock)
    worker = reg.pool("big")[0]
    assert worker.stale  # never scraped
    assert reg.apply_scrape("10.0.0.1:8000", sim_page(), clock())
    worker = reg.pool("big")[0]
    assert (worker.running, worker.waiting, worker.kv_usage) == (3, 2, 0.25)
    assert (worker.block_size, worker.num_blocks, worker.stale) == (16, 2048, False)
    clock.advance(2.5)
    worker = reg.pool("big")[0]
    assert worker.stale
    assert (worker.running, worker.kv_usage) == (3, 0.25)  # last values are kept


def test_sglang_page_and_a_malformed_page(clock: FakeClock) -> None:
    reg = registry(clock)
    assert reg.apply_scrape("10.0.0.2:8000", SGLANG, clock())
    worker = reg.pool("big")[1]
    assert worker.capacity_tokens == 161721
    clock.advance(5)
    broken = "vllm:num_requests_running{model_name= 1\n"
    assert not reg.apply_scrape("10.0.0.2:8000", broken, clock())
    assert reg.pool("big")[1].stale


def test_in_flight_counts_and_health(clock: FakeClock) -> None:
    reg = registry(clock)
    reg.started("10.0.0.1:8000")
    reg.started("10.0.0.1:8000")
    reg.finished("10.0.0.1:8000")
    reg.finished("10.0.0.9:8000")  # unknown: ignored
    reg.set_healthy("10.0.0.1:8000", False)
    worker = reg.pool("big")[0]
    assert (worker.in_flight, worker.healthy) == (1, False)
    reg.finished("10.0.0.1:8000")
    reg.finished("10.0.0.1:8000")
    assert reg.pool("big")[0].in_flight == 0


# The scrape says 3 running and 2 waiting (sim_page); then the router starts and finishes
# requests there. (events before the scrape, events after it, expected requests now)
@pytest.mark.parametrize(("before", "after", "expected"), [
    ("", "", 5),
    ("s", "", 5),  # one in flight, already counted by the scrape
    ("", "s", 6),  # started since the scrape: one more
    ("s", "f", 4),  # counted by the scrape, finished since: one fewer
    ("", "sf", 5),  # started and finished since: the scrape's count stands
    ("ss", "ff", 3),
    ("sss", "ffffff", 2),  # a finish with nothing in flight is no event
    ("ssssssss", "", 8),  # never below the router's own in-flight count
])
def test_requests_move_the_last_scrape_by_what_the_router_started_and_finished_since(
        clock: FakeClock, before: str, after: str, expected: int) -> None:
    reg = registry(clock)
    address = "10.0.0.1:8000"
    for event in before:
        (reg.started if event == "s" else reg.finished)(address)
    reg.apply_scrape(address, sim_page(), clock())
    for event in after:
        (reg.started if event == "s" else reg.finished)(address)
    assert reg.pool("big")[0].requests == expected
    clock.advance(2.5)  # stale: the router's own count alone
    worker = reg.pool("big")[0]
    assert worker.requests == worker.in_flight


def test_reload_replaces_file_workers_and_keeps_signals_of_those_that_stay(
    clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "workers.yaml"
    path.write_text("small: [10.0.1.1:8000, {address: '10.0.1.2:8000', kv_events: 'tcp://k'}]\n")
    reg = registry(clock)
    assert reg.reload_file(path) == ()
    assert addresses(reg, "small") == ["10.0.1.1:8000", "10.0.1.2:8000"]
    reg.apply_scrape("10.0.1.1:8000", sim_page(), clock())
    reg.started("10.0.1.1:8000")

    path.write_text("small: [10.0.1.1:8000, 10.0.1.3:8000]\nbig: [10.0.0.1:8000]\n")
    assert reg.reload_file(path) == ("10.0.1.2:8000",)
    assert addresses(reg, "small") == ["10.0.1.1:8000", "10.0.1.3:8000"]
    assert addresses(reg, "big") == ["10.0.0.1:8000", "10.0.0.2:8000"]  # no duplicate
    kept = reg.pool("small")[0]
    assert (kept.running, kept.in_flight, kept.stale) == (3, 1, False)
    assert reg.pool("small")[1].metrics_url == "http://10.0.1.3:8000/metrics"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope: [a:1]\n", "unknown model"),
        ("small: a:1\n", "expected a list"),
        ("small: [{metrics_url: x}]\n", "expected host:port"),
        ("small: [{address: a:1, port: 2}]\n", "unknown keys"),
        ("- a\n", "expected a mapping"),
        ("small: [a:1\n", "cannot read YAML"),
    ],
)
def test_a_bad_workers_file_changes_nothing(
    clock: FakeClock, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "workers.yaml"
    path.write_text("small: [10.0.1.1:8000]\n")
    reg = registry(clock)
    reg.reload_file(path)
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        reg.reload_file(path)
    assert addresses(reg, "small") == ["10.0.1.1:8000"]


def test_an_empty_workers_file_is_no_workers(tmp_path: Path) -> None:
    path = tmp_path / "workers.yaml"
    path.write_text("")
    assert load_workers_file(path, known=["small"]) == {}
