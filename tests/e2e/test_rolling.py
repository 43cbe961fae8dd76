"""Issue 32 end to end: a rolling restart under agent load, through the real Envoy, loses
nothing — of the processor (two replicas behind saar's own Envoy) and of a pool's endpoint
picker (two replicas behind a gateway's shape of Envoy).

The replicas share their state in Redis; the simulated workers answer slowly (about two seconds
of decode, one request at a time each) and flow control queues what does not fit, so at any
moment agents have streamed answers, JSON answers and requests held in a replica's queue in
flight, in the middle of their tool loops. The SDKs' retries are off: every request a
replica's restart cut would reach its agent as an error. Each replica in turn gets SIGTERM (it
drains: not ready, new streams still taken for ``notice_seconds``, then the streams in flight
awaited) and is started again; the next restart waits until Envoy's health check sends it
streams again, as a Deployment's rolling update waits for readiness.

With the drain of old (``OLD_DRAIN``: not ready for 1 s, then 1 s for the streams in flight)
the same runs failed 6 requests each (measured 2026-12-07: 503s and 500s of answers cut, and a
400 for a response id whose answer was cut); with the drain, 0, each drain waiting 2 to 5 s
for 1 to 4 streams.
"""

from __future__ import annotations

import functools
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from extproc.dev.harness import Processor, envoy_stats, run_gateway, run_stack
from tests.e2e.agents import Agent, agents
from tests.e2e.conftest import e2e_config, violations

pytestmark = pytest.mark.e2e
SLOW = ["--max-num-seqs", "1", "--decode-tokens-per-s", "8", "--output-tokens", "16"]
"""Two seconds of decode an answer, one answer at a time per worker: queues form."""
NEW_DRAIN = {"drain": {"notice_seconds": 1.0, "timeout_seconds": 30.0}}
OLD_DRAIN = {"drain_seconds": 1.0, "drain": {"timeout_seconds": 1.0}}
"""What ``server.drain_seconds: 1`` did before the drain waited for the streams in flight:
not ready for a second, then a second's grace for them."""
SESSIONS = 6
POOL = "qwen3-32b"
"""The pool the gateway test sends every request to (no model router in front)."""
DRAINED = re.compile(r"draining: new streams refused; waiting up to [\d.]+ s for the (\d+) "
                     r"in flight")


def slow_config(server: dict[str, Any]) -> dict[str, Any]:
    config = e2e_config()
    for decision in config["routing"]["decisions"]:
        decision["algorithm"]["session_aware"]["idle_timeout_seconds"] = 300
    config["server"] = server
    config["scheduling"] = {"scrape_interval_seconds": 0.1, "flow_control": {
        "enabled": True, "queue_depth_threshold": 1,
        "classes": {"interactive": {"priority": 2, "ttl_seconds": 30}}}}
    return config


def rolling_stack(workdir: Any, server: dict[str, Any]) -> Any:
    return run_stack(slow_config(server), workers_per_model=2, sim_args=SLOW, replicas=2,
                     store="redis", workdir=workdir)


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


def holds(replicas: list[Processor]) -> float:
    """Requests the replicas held in their queues (since each started)."""
    total = 0.0
    for replica in replicas:
        with urllib.request.urlopen(f"{replica.http}/metrics", timeout=5) as response:
            text = response.read().decode()
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("saar_holds_total{"))
    return total


def roll(replicas: list[Processor], restart: Callable[[int], None],
         sessions: list[Agent]) -> dict[str, Any]:
    """A rolling restart of ``replicas`` (``restart`` one, by index) under the agents' load:
    what it cost."""
    for agent in sessions:  # one at a time: each API's first call warms its SDK client
        agent.turn()
    held = 0.0
    with Load(sessions) as load:
        load.until(3 * len(sessions))  # every session is in its tool loops
        for index in range(len(replicas)):
            held += holds(replicas)
            restart(index)
            load.until(load.turns() + len(sessions))  # traffic flows through the new one
    drains = [int(n) for r in replicas
              for n in DRAINED.findall(r.service.log_path.read_text(errors="replace"))]
    return {"errors": [f"{s}: {e!r}" for s, e in load.errors], "held": held,
            "broken": [pair for agent in sessions for pair in agent.broken()],
            "in_flight": drains}


def envoys_view(stats: dict[str, int]) -> dict[str, int]:
    """What Envoy saw of the replicas' health, for a failure's message."""
    return {k: v for k, v in stats.items()
            if v and any(w in k for w in ("health_check", "panic", "membership", "ejections"))}


def assert_lost_nothing(cost: dict[str, Any], sessions: list[Agent], violations: int,
                        envoy: dict[str, int]) -> None:
    assert cost["errors"] == [], envoy
    assert violations == 0 and cost["broken"] == []
    assert len(cost["in_flight"]) == 2 and max(cost["in_flight"]) > 0, cost["in_flight"]
    assert cost["held"] > 0  # requests were held in the replicas' queues
    assert sum(1 for a in sessions for t in a.served if t.continues) >= len(sessions)


def test_a_rolling_restart_of_the_processor_fails_no_request(tmp_path):
    """0 failed requests and 0 lock violations, with streams in flight at a drain."""
    with rolling_stack(tmp_path, NEW_DRAIN) as stack:
        before = violations(stack)
        sessions = agents(stack.url, SESSIONS, "roll", retries=0)
        cost = roll(stack.processors, stack.restart_processor, sessions)
        assert_lost_nothing(cost, sessions, violations(stack) - before,
                            envoys_view(stack.envoy_stats("cluster.saar_extproc")))


def test_a_rolling_restart_of_a_pools_picker_fails_no_request(tmp_path):
    """The same through a gateway's shape: the pool's endpoint picker, two replicas sharing
    their state, restarted one after the other (Envoy health-checks them, as the picker
    Service's endpoints list only ready pods)."""
    config = slow_config(NEW_DRAIN)
    with run_gateway(config, pools=[POOL], sim_args=SLOW, picker_replicas=2, store="redis",
                     workdir=tmp_path) as gateway:
        before = violations(gateway)
        sessions = agents(gateway.url, SESSIONS, "pick", retries=0)
        cost = roll(gateway.replicas[POOL],
                    functools.partial(gateway.restart_picker, POOL), sessions)
        assert_lost_nothing(cost, sessions, violations(gateway) - before,
                            envoys_view(envoy_stats(gateway.envoy_admin, f"cluster.epp-{POOL}")))
