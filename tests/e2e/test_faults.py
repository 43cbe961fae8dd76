"""Issue 9's fault matrix, through the real Envoy with the official SDKs at their default retry
settings (two retries, honouring ``Retry-After``), on one stack with two workers per model and
the Redis store: upstream 503 bursts of 1–6 on a locked session's worker, an upstream killed
and restarted, the processor restarted and the store stopped and started with sessions in
flight. Every affected session recovers — every turn answered, every tool result and
``previous_response_id`` served by the model and worker that issued it — and the simulators
count no continuity violation.

A worker that dies loses what it issued (the simulators forget on restart, as a real server's
provider state would be gone): the kill is made while no session has an open tool loop or a
Responses chain on that worker, so the sessions it affects are those bound to it by affinity,
whose next turns must go on elsewhere and come back once it is up again.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from extproc.dev.harness import Service, Stack, run_stack
from tests.e2e.agents import Agent, ChatAgent, MessagesAgent, ResponsesAgent, agents
from tests.e2e.conftest import e2e_config, post_json, violations

pytestmark = pytest.mark.e2e
BURSTS = range(1, 7)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    config = e2e_config()
    for decision in config["routing"]["decisions"]:
        decision["algorithm"]["session_aware"]["idle_timeout_seconds"] = 300
    config["server"] = {"drain": {"notice_seconds": 0.2}}
    with run_stack(config, workers_per_model=2, store="redis",
                   workdir=tmp_path_factory.mktemp("faults")) as running:
        yield running


def metrics(stack: Stack) -> str:
    with urllib.request.urlopen(f"{stack.processor_http}/metrics", timeout=5) as response:
        return response.read().decode()


def failed_streams(stack: Stack) -> int:
    """Routing streams Envoy could not open or keep (the processor unreachable): each such
    request was answered 503 router_unavailable by Envoy's local reply."""
    return stack.envoy_stats("http.ingress.ext_proc.saar.streams_failed").get(
        "http.ingress.ext_proc.saar.streams_failed", 0)


def sim_service(stack: Stack, worker: str) -> Service:
    """The harness's service of the simulator at ``host:port``."""
    for model, urls in stack.sims.items():
        for index, url in enumerate(urls):
            if url.removeprefix("http://") == worker:
                return next(s for s in stack.services if s.name == f"sim-{model}-{index}")
    raise KeyError(worker)


def assert_continuity(stack: Stack, sessions: list[Agent], before: int) -> None:
    assert [pair for agent in sessions for pair in agent.broken()] == []
    assert violations(stack) == before


def locked(agent: Agent) -> str:
    """Play ``agent`` until its next turn is bound to the worker that served its last one (an
    open tool loop, or a Responses chain); that worker."""
    while True:
        agent.turn()
        if agent.pending or isinstance(agent, ResponsesAgent):
            return agent.served[-1].worker


@pytest.mark.parametrize("burst", BURSTS)
def test_a_burst_of_upstream_503s_on_a_locked_sessions_worker_is_ridden_out(stack, burst):
    """Envoy retries (on the issuer: a hard lock lists it once per attempt), the SDK retries,
    and past three failed answers the processor holds the request until the model is back."""
    before = violations(stack)
    sessions = agents(stack.url, 6, f"burst{burst}")
    for agent in sessions:
        worker = locked(agent)
        post_json(f"http://{worker}/admin/faults", {"fail_next": burst})
        turn = agent.turn()  # the SDK's defaults: raises if the session did not recover
        assert turn.worker == worker and turn.continues
        post_json(f"http://{worker}/admin/faults", {"fail_next": 0})
    assert_continuity(stack, sessions, before)


def at_rest(agent: Agent) -> None:
    """Play until the session holds nothing on its worker: its last answer was text."""
    agent.turn()
    while agent.pending:
        agent.turn()


def test_an_upstream_killed_and_restarted(stack):
    """Sessions bound to a worker by affinity go on on its pool's other worker while it is
    down (Envoy's retry on a connect failure takes the pick's fallback; the processor learns
    where the turn went), start their tool loops there, and return to the pool as before once
    it is up again."""
    before = violations(stack)
    sessions: list[Agent] = [kind(stack.url, f"kill-{i}", stream=bool(i % 2))
                             for i, kind in enumerate((ChatAgent, MessagesAgent) * 3)]
    for agent in sessions:
        at_rest(agent)
    victim = sessions[0].served[-1].worker
    bound = [a for a in sessions if a.served[-1].worker == victim]
    assert bound  # the fault does affect sessions
    service = sim_service(stack, victim)
    service.stop(kill=True)
    try:
        for _ in range(2):
            for agent in sessions:
                at_rest(agent)
        assert all(t.worker != victim for a in bound for t in a.served[-4:])
    finally:
        service.start()
    for _ in range(2):
        for agent in sessions:
            at_rest(agent)
    assert_continuity(stack, sessions, before)


def in_flight(sessions: list[Agent], turns: int, fault: Callable[[], None],
              then: Callable[[], None] | None = None) -> None:
    """Each session plays ``turns`` turns on a thread of its own; ``fault`` runs once every
    session has played two, and the sessions wait for it to be made; ``then`` (the fault's
    end) runs while they play on. Any exception an SDK raised fails the test."""
    errors: list[BaseException] = []
    started = threading.Barrier(len(sessions) + 1)
    made = threading.Event()

    def play(agent: Agent) -> None:
        try:
            for n in range(turns):
                agent.turn()
                if n == 1:
                    started.wait(timeout=60)
                    made.wait(timeout=60)
        except BaseException as exc:  # reported below
            errors.append(exc)
            started.abort()

    threads = [threading.Thread(target=play, args=(a,)) for a in sessions]
    for thread in threads:
        thread.start()
    try:
        started.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass  # a session failed before the fault: reported below
    else:
        try:
            fault()
        finally:
            made.set()
        if then is not None:
            then()
    made.set()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert all(len(agent.served) == turns for agent in sessions)


def test_the_processor_restarted_with_sessions_in_flight(stack):
    """Envoy answers the requests that meet no processor 503 router_unavailable with
    Retry-After (its local reply, in the client's format); the SDKs retry; the restarted
    processor finds every lock in the store.

    The sessions wait while the processor stops: it drains (``server.drain``), so sessions
    playing on would be served to their last turn before it is gone, and none would meet
    its absence. The next process has imported its modules before the old one stops: the
    outage is the service's start, which the SDKs' retries outlast, not Python's imports,
    which take longer than that on a busy machine."""
    before = violations(stack)
    failed = failed_streams(stack)
    sessions = agents(stack.url, 6, "restart")
    processor = stack.processors[0].service

    def stop() -> None:
        processor.prepare()
        processor.stop()

    def start() -> None:
        # down until a request has met no processor (a restart between two turns would test
        # nothing), at most a few seconds
        deadline = time.monotonic() + 5
        while failed_streams(stack) == failed and time.monotonic() < deadline:
            time.sleep(0.02)
        processor.start()

    in_flight(sessions, 8, stop, start)
    assert failed_streams(stack) > failed  # sessions were affected
    assert_continuity(stack, sessions, before)
    assert sum(1 for a in sessions for t in a.served if t.continues) >= len(sessions)


def test_the_store_stopped_and_started_with_sessions_in_flight(stack):
    """The processor serves from its local copy while Redis is down and writes back what it
    learnt once it is up (empty: no persistence)."""
    before = violations(stack)
    assert stack.store is not None
    store = stack.store
    sessions = agents(stack.url, 6, "store")

    def back() -> None:
        time.sleep(1.0)  # the sessions play on without the store
        store.start()

    in_flight(sessions, 8, lambda: store.stop(kill=True), back)
    assert "saar_store_errors_total{" in metrics(stack)  # the outage was met
    deadline = time.monotonic() + 15
    while "saar_store_up 1.0" not in metrics(stack):
        assert time.monotonic() < deadline, "the processor never saw the store come back"
        time.sleep(0.1)
    assert_continuity(stack, sessions, before)
