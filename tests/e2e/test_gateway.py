"""Issue 8 end to end: the service behind the configuration a gateway generates for an
InferencePool (Envoy AI Gateway's shape, emulated with the real Envoy 1.40: ext_proc to the
endpoint picker over TLS with an empty validation context, FULL_DUPLEX_STREAMED bodies,
trailers SEND, a 300 s message timeout, fail closed; the route's cluster ORIGINAL_DST taking
the host from x-gateway-destination-endpoint), with the official SDKs over the three APIs,
streamed and not.

Every answer is checked three ways: the endpoint the picker chose (``x-saar-endpoint``, set by
the picker), the one Envoy connected to (``x-saar-worker``, Envoy's %UPSTREAM_REMOTE_ADDRESS%)
and the simulator that answered (``x-sim-instance``) are the same worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from extproc.dev.harness import Gateway, run_gateway
from tests.e2e.agents import Agent, agents
from tests.e2e.conftest import e2e_config, violations

pytestmark = pytest.mark.e2e
SESSIONS, ROUNDS = 12, 4


@pytest.fixture
def answers(monkeypatch) -> list[dict[str, str]]:
    """Every answer's headers, as the agents' SDK clients received them."""
    seen: list[dict[str, str]] = []
    served = Agent._served

    def spy(self: Agent, headers: Any, continues: str | None) -> Any:
        seen.append(dict(headers))
        return served(self, headers, continues)

    monkeypatch.setattr(Agent, "_served", spy)
    return seen


def play(gateway: Gateway, prefix: str) -> list[Agent]:
    sessions = agents(gateway.url, SESSIONS, prefix)
    for _ in range(ROUNDS):
        for agent in sessions:
            agent.turn()
    return sessions


def assert_served_by_the_pick(gateway: Gateway, answers: list[dict[str, str]]) -> set[str]:
    for headers in answers:
        served = gateway.instance(headers["x-sim-instance"])
        assert headers["x-saar-endpoint"] == headers["x-saar-worker"] == served, headers
        assert headers["x-sim-model"] == headers["x-saar-selected-model"]
    return {h["x-saar-worker"] for h in answers}


def assert_continuity(gateway: Gateway, sessions: list[Agent]) -> int:
    assert [pair for agent in sessions for pair in agent.broken()] == []
    assert violations(gateway) == 0  # the simulators' own count of foreign ids
    continued = sum(1 for agent in sessions for turn in agent.served if turn.continues)
    assert continued >= SESSIONS
    return continued


@pytest.fixture(scope="module")
def picker_gateway(tmp_path_factory) -> Iterator[Gateway]:
    with run_gateway(e2e_config(), pools=["qwen3-8b"],
                     workdir=tmp_path_factory.mktemp("picker")) as gateway:
        yield gateway


def test_the_pickers_choice_serves_every_request_and_tool_loops_stay(picker_gateway, answers):
    sessions = play(picker_gateway, "gw")
    assert len(answers) == SESSIONS * ROUNDS
    workers = assert_served_by_the_pick(picker_gateway, answers)
    assert len(workers) == 2  # both workers of the pool were used
    assert_continuity(picker_gateway, sessions)
    # "auto" reached a picker without a model router: routed inside this pool only.
    assert {h["x-sim-model"] for h in answers} == {"qwen3-8b"}


def test_a_physical_model_streams_through_the_picker(picker_gateway):
    client = OpenAI(base_url=f"{picker_gateway.url}/v1", api_key="k", max_retries=0,
                    default_headers={"x-session-id": "physical"})
    raw = client.chat.completions.with_raw_response.create(
        model="qwen3-8b", stream=True, messages=[{"role": "user", "content": "explain it"}])
    chunks = list(raw.parse())
    assert len(chunks) > 3 and raw.headers["x-saar-endpoint"] == raw.headers["x-saar-worker"]
    other = httpx.post(f"{picker_gateway.url}/v1/chat/completions", timeout=10, json={
        "model": "qwen3-32b", "messages": [{"role": "user", "content": "hi"}]})
    assert other.status_code == 404  # another pool's model: refused, never rewritten


@pytest.mark.parametrize("fail_open", [False, True])
def test_a_picker_that_is_down_gives_the_pools_failure_mode(tmp_path, fail_open):
    """FailClose: Envoy answers 500. FailOpen: Envoy goes on without a pick, and the
    ORIGINAL_DST cluster, given no x-gateway-destination-endpoint, has no host: 503 "no
    healthy upstream" (or 500, when the full-duplex body was already handed to the stream that
    failed). Either way, fail open never reaches a worker in this shape."""
    with run_gateway(e2e_config(), pools=["qwen3-8b"], fail_open=fail_open,
                     workdir=tmp_path) as gateway:
        body = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}]}
        up = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=10)
        assert up.status_code == 200
        gateway.pickers["qwen3-8b"].service.stop()
        statuses = []
        for _ in range(6):
            down = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=10)
            assert "x-sim-instance" not in down.headers
            statuses.append(down.status_code)
            if down.status_code == 503:
                assert down.text.strip() == "no healthy upstream"
        assert set(statuses) <= ({500, 503} if fail_open else {500}), statuses


def test_the_model_router_picks_the_pool_and_the_pools_picker_the_worker(tmp_path, answers):
    with run_gateway(e2e_config(), router=True, workdir=tmp_path) as gateway:
        sessions = play(gateway, "both")
        light = OpenAI(base_url=f"{gateway.url}/v1", api_key="k", max_retries=0,
                       default_headers={"x-session-id": "light"})
        raw = light.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "summarise the changelog"}])
        answers.append(dict(raw.headers))
        assert_served_by_the_pick(gateway, answers)
        assert_continuity(gateway, sessions)
        # The router chose the pool by its header: both pools served, each by its own picker.
        assert {h["x-sim-model"] for h in answers} == {"qwen3-8b", "qwen3-32b"}
        for model, picker in gateway.pickers.items():
            text = httpx.get(f"{picker.http}/metrics").text
            picks = [line for line in text.splitlines()
                     if line.startswith("saar_worker_picks_total{")]
            assert picks and all(f'model="{model}"' in line for line in picks)
        assert gateway.router is not None
        router = httpx.get(f"{gateway.router.http}/metrics").text
        assert "saar_worker_picks_total{" not in router  # the router never picks workers
