"""Issues 29 and 31: the processor reads its workers' ``/metrics`` as the pacer says — rarely
while the pool is idle, soon after it sends a worker work, at most every busy interval while the
worker is busy — measured on a real stack with four simulated workers."""

from __future__ import annotations

import contextlib
import glob
import threading
import time

import httpx
import pytest
from openai import OpenAI

from extproc.dev.harness import Stack, run_stack
from tests.e2e.conftest import e2e_config, get_json

pytestmark = pytest.mark.e2e
WINDOW = 8.0
"""Seconds the idle processor is watched."""


def cpu_seconds(pid: int) -> float:
    """CPU time the scheduler ran the process for, all its threads, in nanoseconds
    (``/proc/PID/task/*/schedstat``): ``/proc/PID/stat``'s user and system time are sampled at
    clock ticks, a whole 10 ms tick for a process that happened to run at one, which made an
    8 s window of a 4 ms/s process read anywhere from 3 to 6.25 ms/s."""
    total = 0
    for task in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(FileNotFoundError), open(task) as stat:
            total += int(stat.read().split()[0])
    return total / 1e9


def scrapes(stack: Stack) -> dict[str, int]:
    """Worker ``host:port`` → the ``GET /metrics`` it has answered."""
    return {url.removeprefix("http://"): get_json(f"{url}/admin/state")["scrapes"]
            for urls in stack.sims.values() for url in urls}


def first_reads(stack: Stack) -> dict[str, int]:
    deadline = time.monotonic() + 10
    while not all((found := scrapes(stack)).values()):
        assert time.monotonic() < deadline, f"a worker was never read: {found}"
        time.sleep(0.1)
    return found


def test_an_idle_pool_costs_the_processor_under_5_ms_of_cpu_a_second(tmp_path):
    """Four idle workers: read every second each (the idle pace, half the staleness window),
    never stale, for at most 5 ms of the processor's CPU a second (23.5 ms at a fixed 50 ms)."""
    with run_stack(e2e_config(), workers_per_model=2, workdir=tmp_path) as stack:
        pid = stack.processors[0].service.proc.pid  # type: ignore[union-attr]
        first_reads(stack)
        time.sleep(1.0)
        before, cpu, started = scrapes(stack), cpu_seconds(pid), time.monotonic()
        time.sleep(WINDOW)
        cpu, elapsed = cpu_seconds(pid) - cpu, time.monotonic() - started
        after = scrapes(stack)
        per_second = 1000 * cpu / elapsed
        print(f"idle: {per_second:.1f} ms of CPU a second, reads {after} in {elapsed:.1f} s")
        assert per_second <= 5.0
        for worker, count in after.items():
            assert WINDOW - 2 <= count - before[worker] <= WINDOW + 2, (worker, before, after)
        ready = httpx.get(f"{stack.processor_http}/metrics").text
        for model in stack.sims:
            assert f'inference_pool_ready_pods{{name="{model}"}} 2.0' in ready


def test_a_worker_sent_work_is_read_soon_and_at_the_busy_pace(tmp_path):
    """The idle pace set far out (20 s): only what the router does makes it read a worker. A
    two-second request is read within a second of its start, at most every 0.5 s while it
    runs, the router sees it running, and its idle neighbour is not read at all."""
    config = e2e_config()
    config["scheduling"] = {"scrape_idle_interval_seconds": 20, "staleness_seconds": 60}
    with run_stack(config, workers_per_model=2, sim_args=["--decode-tokens-per-s", "8"],
                   workdir=tmp_path) as stack:
        before = first_reads(stack)
        client = OpenAI(base_url=f"{stack.url}/v1", api_key="k", max_retries=0,
                        default_headers={"x-session-id": "paced"})
        answer: dict[str, str] = {}

        def ask() -> None:
            raw = client.chat.completions.with_raw_response.create(
                model="qwen3-8b", messages=[{"role": "user", "content": "hello"}])
            answer.update(raw.headers)

        started = time.monotonic()
        request = threading.Thread(target=ask)
        request.start()
        seen_running = read_at = None
        while request.is_alive():
            now = scrapes(stack)
            if read_at is None and any(now[w] > before[w] for w in now):
                read_at = time.monotonic() - started
            pool = httpx.get(f"{stack.processor_http}/metrics").text
            if 'inference_pool_average_running_requests{name="qwen3-8b"} 0.5' in pool:
                seen_running = True
            time.sleep(0.05)
        request.join()
        elapsed = time.monotonic() - started
        time.sleep(1.0)  # the read after it finished
        after = scrapes(stack)
        served = answer["x-saar-worker"]
        reads = {w: after[w] - before[w] for w in after}
        print(f"a {elapsed:.1f} s request on {served}: first read after {read_at} s, {reads}")
        assert read_at is not None and read_at < 1.0
        assert seen_running, "the router never saw the request running"
        assert 3 <= reads[served] <= elapsed / 0.5 + 3, reads
        assert {w: n for w, n in reads.items() if w != served} == dict.fromkeys(
            (w for w in reads if w != served), 0)
