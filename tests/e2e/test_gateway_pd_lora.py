"""Issue 17 end to end, in the gateway's InferencePool shape (real Envoy, the picker over TLS,
ORIGINAL_DST on x-gateway-destination-endpoint): a disaggregated pool (two decode workers and a
prefill worker, the decode simulators playing llm-d's routing sidecar) and a fleet of LoRA
adapters on one base model's workers.

What the picker chose is read from its own headers (``x-saar-endpoint``: the decode worker,
``x-saar-prefill-endpoint``: the prefill worker) and from its replay record; what really happened
from the simulators' own headers (``x-sim-instance``: who answered, ``x-sim-prefilled-by``: who
prefilled for it) and counters (continuity violations, prefill-only calls).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from extproc.dev.harness import Gateway, run_gateway
from tests.e2e.agents import HARD, Agent, agents
from tests.e2e.conftest import ADMIN_TOKEN, e2e_config, get_json, violations

pytestmark = pytest.mark.e2e
SESSIONS, ROUNDS = 9, 4
POOL = "qwen3-8b"
ADAPTERS = ("qwen3-8b-lora-a", "qwen3-8b-lora-b")
TASK = HARD + " Repository context: " + " ".join(f"module{i}.py defines class C{i}"
                                                  for i in range(120))
"""A first turn long enough to be worth a remote prefill (hundreds of uncached tokens)."""


@pytest.fixture
def answers(monkeypatch) -> list[dict[str, str]]:
    seen: list[dict[str, str]] = []
    served = Agent._served

    def spy(self: Agent, headers: Any, continues: str | None) -> Any:
        seen.append(dict(headers) | {"continues": continues or ""})
        return served(self, headers, continues)

    monkeypatch.setattr(Agent, "_served", spy)
    return seen


@pytest.fixture(scope="module")
def pd_gateway(tmp_path_factory) -> Iterator[Gateway]:
    config = e2e_config()
    config["scheduling"] = {"disaggregation": {"threshold_tokens": 400}}
    # a first turn (and a new ask that resends the task) leaves ~1000 tokens uncached on its
    # decode worker, a tool result ~150
    with run_gateway(config, pools=[POOL], roles=("decode", "decode", "prefill"),
                     workdir=tmp_path_factory.mktemp("pd")) as gateway:
        yield gateway


def test_decode_and_prefill_workers_chosen_by_the_picker_serve_and_tool_loops_stay(
        pd_gateway, answers):
    sessions = agents(pd_gateway.url, SESSIONS, "pd")
    for agent in sessions:  # each its own task: no prefix cached anywhere yet
        agent.task = f"Session {agent.session}. {TASK}"
    for _ in range(ROUNDS):
        for agent in sessions:
            agent.turn()
    prefill_worker = pd_gateway.instance(f"{POOL}-2")
    opening = {agent.served[0].replay_id for agent in sessions}
    first = [h for h in answers if h["x-replay-id"] in opening]
    continuing = [h for h in answers if h["x-replay-id"] not in opening]  # a warm context
    assert len(first) == SESSIONS and len(continuing) == SESSIONS * (ROUNDS - 1)
    assert sum(bool(h["continues"]) for h in continuing) >= SESSIONS  # tool results among them
    for headers in answers:
        decode = pd_gateway.instance(headers["x-sim-instance"])
        assert headers["x-saar-endpoint"] == headers["x-saar-worker"] == decode, headers
        assert decode != prefill_worker and headers["x-sim-role"] == "decode"
        picked = headers.get("x-saar-prefill-endpoint")
        by = headers.get("x-sim-prefilled-by")
        assert (picked is None) == (by is None), headers
        if by is not None:
            assert pd_gateway.instance(by) == picked == prefill_worker
    assert all("x-saar-prefill-endpoint" in h for h in first)  # long first prefills: split
    split_continuing = sum("x-saar-prefill-endpoint" in h for h in continuing)
    tool_loop = [h for h in continuing if h["continues"]]
    split_tool_loop = sum("x-saar-prefill-endpoint" in h for h in tool_loop)
    assert split_tool_loop <= 0.05 * len(tool_loop)  # a tool result on a warm context: local
    assert [pair for agent in sessions for pair in agent.broken()] == []
    assert violations(pd_gateway) == 0
    record = get_json(f"{pd_gateway.pickers[POOL].http}/v1/replay/{first[0]['x-replay-id']}")
    assert record["pd"]["split"] is True and record["pd"]["reason"] == "cold"
    assert record["pd"]["prefill"] == prefill_worker
    assert record["pd"]["decode"] == first[0]["x-saar-endpoint"]
    prefill_state = get_json(f"http://{prefill_worker}/admin/state")
    assert prefill_state["requests"] == len(first) + split_continuing  # only the sidecars' calls
    assert prefill_state["violations"] == {k: 0 for k in prefill_state["violations"]}


def test_the_web_view_shows_the_split_and_both_picks(pd_gateway, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.e2e.test_observe import ARTEFACTS, _chromium

    agent = agents(pd_gateway.url, 1, "pdview")[0]
    agent.task = f"Session view. {TASK}"
    first = agent.turn()
    driver = _chromium(tmp_path / "chromium-profile")
    wait = WebDriverWait(driver, 30)
    try:
        driver.get(f"{pd_gateway.pickers[POOL].http}/ui")
        driver.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
        driver.find_element(By.ID, "sign-in").click()
        wait.until(lambda d: d.find_element(
            By.CSS_SELECTOR, "#sessions tr[data-session='pdview-0']")).click()
        wait.until(lambda d: d.find_element(
            By.CSS_SELECTOR, f"rect.slice[data-replay='{first.replay_id}']")).click()
        body = str(wait.until(lambda d: (
            d.find_element(By.ID, "decision-title").text.endswith(first.replay_id)
            and d.find_element(By.ID, "decision-body").text) or None))
        assert "Prefill / decode" in body and "split" in body and "cold" in body
        assert pd_gateway.instance(f"{POOL}-2") in body  # the prefill pick
        assert first.worker in body  # the decode pick
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTEFACTS / "web-view-pd.png"))
    finally:
        driver.quit()


def test_a_clients_prefiller_header_is_never_trusted(pd_gateway):
    response = httpx.post(
        f"{pd_gateway.url}/v1/chat/completions", timeout=10,
        headers={"x-session-id": "spoof", "x-prefiller-host-port": "127.0.0.1:1"},
        json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200
    assert "x-sim-prefilled-by" not in response.headers
    state = get_json(f"http://{pd_gateway.instance(response.headers['x-sim-instance'])}"
                     "/admin/state")
    assert "x-prefiller-host-port" not in state["last_request_headers"]


@pytest.fixture(scope="module")
def lora_gateway(tmp_path_factory) -> Iterator[Gateway]:
    config = e2e_config()
    for name in ADAPTERS:
        config["models"][name] = {"cluster": config["models"][POOL]["cluster"], "base": POOL}
    with run_gateway(config, pools=[POOL], workdir=tmp_path_factory.mktemp("lora")) as gateway:
        yield gateway


def test_adapters_are_served_by_the_picked_worker_and_locks_hold_per_adapter(
        lora_gateway, answers):
    models = (*ADAPTERS, POOL)
    sessions = [agent for i, agent in enumerate(agents(lora_gateway.url, SESSIONS, "lora"))
                if setattr(agent, "model", models[i % 3]) is None]
    for _ in range(ROUNDS):
        for agent in sessions:
            agent.turn()
    for headers in answers:
        served = lora_gateway.instance(headers["x-sim-instance"])
        assert headers["x-saar-endpoint"] == headers["x-saar-worker"] == served, headers
        assert headers["x-sim-model"] == POOL  # the base's workers serve its adapters
    for agent in sessions:
        assert {turn.model for turn in agent.served} == {agent.model}
    assert [pair for agent in sessions for pair in agent.broken()] == []  # (adapter, worker)
    assert violations(lora_gateway) == 0
    loaded = [get_json(f"{url}/admin/state")["adapters"] for url in lora_gateway.sims[POOL]]
    assert {a for state in loaded for a in state["loaded"]} == set(ADAPTERS)
