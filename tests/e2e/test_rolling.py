"""Issue 32 end to end: a rolling restart of the processor under agent load, through the real
Envoy, loses nothing.

Two processor replicas share their state in Redis; the simulated workers answer slowly (about
two seconds of decode, one request at a time each) and flow control queues what does not fit,
so at any moment agents have streamed answers, JSON answers and requests held in the
processor's queue in flight, in the middle of their tool loops. The SDKs' retries are off:
every request a replica's restart cut would reach its agent as an error. Each replica in
turn gets SIGTERM (it drains: not ready, new streams still taken for ``notice_seconds``, then
the streams in flight awaited) and is started again; the next restart waits until Envoy's
health check sends it streams again, as a Deployment's rolling update waits for readiness.

The same run with the drain of old (not ready for 1 s, then 1 s for the streams in flight)
cuts requests: ``OLD_DRAIN``.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

from extproc.dev.harness import Stack, run_stack
from tests.e2e.agents import Agent, agents
from tests.e2e.conftest import e2e_config

pytestmark = pytest.mark.e2e
SLOW = ["--max-num-seqs", "1", "--decode-tokens-per-s", "8", "--output-tokens", "16"]
"""Two seconds of decode an answer, one answer at a time per worker: queues form."""
NEW_DRAIN = {"drain": {"notice_seconds": 1.0, "timeout_seconds": 30.0}}
OLD_DRAIN = {"drain_seconds": 1.0, "drain": {"timeout_seconds": 1.0}}
"""What ``server.drain_seconds: 1`` did before the drain waited for the streams in flight:
not ready for a second, then a second's grace for them."""
SESSIONS = 6
DRAINED = re.compile(r"draining: new streams refused; waiting up to [\d.]+ s for the (\d+) "
                     r"in flight")


def rolling_stack(workdir: Any, server: dict[str, Any]) -> Any:
    config = e2e_config()
    for decision in config["routing"]["decisions"]:
        decision["algorithm"]["session_aware"]["idle_timeout_seconds"] = 300
    config["server"] = server
    config["scheduling"] = {"scrape_interval_seconds": 0.1, "flow_control": {
        "enabled": True, "queue_depth_threshold": 1,
        "classes": {"interactive": {"priority": 2, "ttl_seconds": 30}}}}
    return run_stack(config, workers_per_model=2, sim_args=SLOW, replicas=2, store="redis",
                     workdir=workdir)


class Load:
    """Each agent plays turns on a thread of its own until ``stop``; an agent whose request
    fails records the error and stops (its SDK does not retry)."""

    def __init__(self, sessions: list[Agent]) -> None:
        self.sessions = sessions
        self.errors: list[tuple[str, BaseException]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._play, args=(a,), name=a.session)
                         for a in sessions]

    def _play(self, agent: Agent) -> None:
        while not self._stop.is_set():
            try:
                agent.turn()
            except BaseException as exc:  # reported by the test
                self.errors.append((agent.session, exc))
                return

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def turns(self) -> int:
        return sum(len(agent.served) for agent in self.sessions)

    def until(self, turns: int, timeout: float = 120) -> None:
        """Until the agents have played ``turns`` turns in all (or one failed)."""
        deadline = time.monotonic() + timeout
        while self.turns() < turns and not self.errors:
            assert time.monotonic() < deadline, f"{self.turns()} turns of {turns}"
            time.sleep(0.05)


def holds(stack: Stack) -> float:
    """Requests the processors held in their queues (since each started)."""
    import urllib.request

    total = 0.0
    for processor in stack.processors:
        with urllib.request.urlopen(f"{processor.http}/metrics", timeout=5) as response:
            text = response.read().decode()
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("saar_holds_total{"))
    return total


def in_flight_at_drains(stack: Stack) -> list[int]:
    """The streams each drain found in flight when it stopped taking new ones."""
    return [int(n) for p in stack.processors
            for n in DRAINED.findall(p.service.log_path.read_text(errors="replace"))]


def roll(stack: Stack, sessions: list[Agent]) -> dict[str, Any]:
    """A rolling restart of both replicas under the agents' load: what it cost."""
    before = sum(stack.continuity()["violations"].values())
    for agent in sessions:  # one at a time: each API's first call warms its SDK client
        agent.turn()
    held = 0.0
    with Load(sessions) as load:
        load.until(3 * len(sessions))  # every session is in its tool loops
        for index in range(len(stack.processors)):
            held += holds(stack)
            stack.restart_processor(index)
            load.until(load.turns() + len(sessions))  # traffic flows through the new one
    return {"errors": load.errors, "held": held, "turns": load.turns(),
            "violations": sum(stack.continuity()["violations"].values()) - before,
            "broken": [pair for agent in sessions for pair in agent.broken()],
            "in_flight": in_flight_at_drains(stack),
            "envoy": {k: v for k, v in stack.envoy_stats("cluster.saar_extproc").items()
                      if v and any(w in k for w in ("health_check", "panic", "membership",
                                                    "connect_fail", "ejections"))}}


def test_a_rolling_restart_under_agent_load_fails_no_request(tmp_path):
    """0 failed requests and 0 lock violations, with streams in flight at every drain."""
    with rolling_stack(tmp_path, NEW_DRAIN) as stack:
        sessions = agents(stack.url, SESSIONS, "roll", retries=0)
        cost = roll(stack, sessions)
    assert [f"{s}: {e!r}" for s, e in cost["errors"]] == [], cost["envoy"]
    assert cost["violations"] == 0 and cost["broken"] == []
    assert len(cost["in_flight"]) == 2 and min(cost["in_flight"]) > 0, cost["in_flight"]
    assert cost["held"] > 0  # requests were held in the processors' queues
    assert sum(1 for a in sessions for t in a.served if t.continues) >= len(sessions)
