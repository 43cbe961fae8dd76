"""Issue 3's live proof: agent sessions through the real Envoy keep continuity end to end."""

from __future__ import annotations

import time
import urllib.request

import openai
import pytest
from openai import OpenAI

from tests.e2e.conftest import IDLE_TIMEOUT, get_json, post_json, violations

pytestmark = pytest.mark.e2e
HARD = "Please refactor the storage layer."
TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]


class Session:
    """One agent session driven with the openai SDK; remembers every response's headers."""

    def __init__(self, stack, name: str) -> None:
        self.stack = stack
        self.client = OpenAI(base_url=f"{stack.url}/v1", api_key="key-live", max_retries=0,
                             default_headers={"x-session-id": name})
        self.messages: list[dict] = []
        self.seen: list[dict[str, str]] = []

    def say(self, text: str, tools: bool = True):
        self.messages.append({"role": "user", "content": text})
        return self._send(tools)

    def answer_tools(self, message) -> object:
        for call in message.tool_calls:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})
        return self._send(True)

    def _send(self, tools: bool):
        kwargs = {"tools": TOOLS} if tools else {}
        raw = self.client.chat.completions.with_raw_response.create(
            model="auto", messages=self.messages, **kwargs)
        self.seen.append(dict(raw.headers))
        message = raw.parse().choices[0].message
        self.messages.append(message.model_dump(exclude_none=True))
        return message

    @property
    def last(self) -> dict[str, str]:
        return self.seen[-1]


def test_tool_loop_drift_and_idle_reset(stack):
    before = violations(stack)
    s = Session(stack, "live-1")
    call = s.say(HARD)
    assert call.tool_calls and s.last["x-saar-selected-model"] == "qwen3-32b"
    s.answer_tools(call)
    assert s.last["x-saar-action"] == "locked_keep"
    assert s.last["x-saar-selected-model"] == "qwen3-32b"
    # A new task (the "summarise" rule) is drift: selection reopens and moves to the cheap tier.
    s.say("Now summarise the change for the changelog.", tools=False)
    assert s.last["x-saar-session-phase"] == "drift_reset"
    assert (s.last["x-saar-action"], s.last["x-saar-selected-model"]) == ("switch", "qwen3-8b")
    # Back to hard work after a pause longer than the idle timeout.
    time.sleep(IDLE_TIMEOUT + 0.5)
    s.say(HARD)
    assert s.last["x-saar-session-phase"] == "idle_reset"
    assert s.last["x-saar-selected-model"] == "qwen3-32b"
    assert violations(stack) == before
    for headers in s.seen:
        record = get_json(f"{stack.processor_http}/v1/replay/{headers['x-replay-id']}")
        assert record["model"] == headers["x-saar-selected-model"]
    history = get_json(f"{stack.processor_http}/v1/replay?session_id=live-1")["records"]
    assert [r["replay_id"] for r in history] == [h["x-replay-id"] for h in s.seen]


def test_previous_response_id_chain_stays_with_its_issuer(stack):
    before = violations(stack)
    client = OpenAI(base_url=f"{stack.url}/v1", api_key="key-live", max_retries=0)
    raw = client.responses.with_raw_response.create(model="auto", input=HARD)
    response = raw.parse()
    model = raw.headers["x-saar-selected-model"]
    for _ in range(3):  # short follow-ups would go to the cheap tier if not locked
        raw = client.responses.with_raw_response.create(
            model="auto", input="go on", previous_response_id=response.id)
        response = raw.parse()
        assert raw.headers["x-saar-selected-model"] == model
        assert raw.headers["x-saar-session-phase"] == "provider_state"
    assert violations(stack) == before


def test_injected_503s_are_recovered_on_the_same_model(stack):
    """Issue 9, item 15: Envoy retries the upstream's 503s before the answer starts, on the
    worker that issued the tool call: the client (no retries of its own) never sees them."""
    before = violations(stack)
    strong = stack.sims["qwen3-32b"][0]
    s = Session(stack, "fault-1")
    call = s.say(HARD)
    served = get_json(f"{strong}/admin/state")["requests"]
    post_json(f"{strong}/admin/faults", {"fail_next": 2})
    s.messages.extend({"role": "tool", "tool_call_id": c.id, "content": "ok"}
                      for c in call.tool_calls)
    raw = s.client.chat.completions.with_raw_response.create(
        model="auto", messages=s.messages, tools=TOOLS)
    assert get_json(f"{strong}/admin/state")["requests"] == served + 3  # two 503s, then 200
    assert raw.headers["x-saar-selected-model"] == "qwen3-32b"
    assert raw.headers["x-saar-action"] == "locked_keep"
    assert violations(stack) == before


def test_locked_model_down_is_held_until_it_comes_back(stack):
    """Three answers of 503 in a row (each after Envoy's own retries) take the model out; the
    next request of the locked session waits at the processor for the model's cooldown, then
    goes to it. Every 503 the client saw carries the replay id of its decision."""
    strong = stack.sims["qwen3-32b"][0]
    s = Session(stack, "fault-2")
    call = s.say(HARD)
    s.messages.extend({"role": "tool", "tool_call_id": c.id, "content": "ok"}
                      for c in call.tool_calls)
    post_json(f"{strong}/admin/faults", {"fail_next": 3 * 4})  # 3 answers of 1 + 3 retries
    failed = []
    for _ in range(3):
        with pytest.raises(openai.InternalServerError) as info:
            s.client.chat.completions.create(model="auto", messages=s.messages, tools=TOOLS)
        failed.append(info.value.response.headers.get("x-replay-id"))
    assert all(replay_id and replay_id.startswith("rp-") for replay_id in failed)
    raw = s.client.chat.completions.with_raw_response.create(
        model="auto", messages=s.messages, tools=TOOLS)
    assert raw.headers["x-saar-selected-model"] == "qwen3-32b"
    assert raw.headers["x-saar-action"] == "locked_keep"
    metrics = urllib.request.urlopen(f"{stack.processor_http}/metrics").read().decode()
    assert 'saar_holds_total{kind="locked",outcome="ready"}' in metrics
