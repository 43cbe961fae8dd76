"""Issue 3's live proof: agent sessions through the real Envoy keep continuity end to end."""

from __future__ import annotations

import time

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
    before = violations(stack)
    strong = stack.sims["qwen3-32b"][0]
    s = Session(stack, "fault-1")
    call = s.say(HARD)
    # The upstream fails twice: the client sees 503s, the lock is not moved elsewhere.
    post_json(f"{strong}/admin/faults", {"fail_next": 2})
    s.messages.extend({"role": "tool", "tool_call_id": c.id, "content": "ok"}
                      for c in call.tool_calls)
    failures = 0
    for _ in range(5):
        try:
            raw = s.client.chat.completions.with_raw_response.create(
                model="auto", messages=s.messages, tools=TOOLS)
            break
        except openai.InternalServerError:
            failures += 1
    assert failures == 2
    assert raw.headers["x-saar-selected-model"] == "qwen3-32b"
    assert raw.headers["x-saar-action"] == "locked_keep"
    assert violations(stack) == before


def test_locked_model_down_gets_retry_after_and_resumes(stack):
    strong = stack.sims["qwen3-32b"][0]
    s = Session(stack, "fault-2")
    call = s.say(HARD)
    s.messages.extend({"role": "tool", "tool_call_id": c.id, "content": "ok"}
                      for c in call.tool_calls)
    post_json(f"{strong}/admin/faults", {"fail_next": 3})
    statuses = []
    for _ in range(4):
        try:
            s.client.chat.completions.create(model="auto", messages=s.messages, tools=TOOLS)
        except openai.APIStatusError as exc:
            statuses.append((exc.status_code, exc.response.headers.get("retry-after")))
    # Three upstream 503s take the model out; then the router answers itself, with Retry-After.
    assert [s for s, _ in statuses[:3]] == [503, 503, 503]
    assert statuses[3][0] == 503 and statuses[3][1] is not None
    time.sleep(float(statuses[3][1]) + 0.2)
    raw = s.client.chat.completions.with_raw_response.create(
        model="auto", messages=s.messages, tools=TOOLS)
    assert raw.headers["x-saar-selected-model"] == "qwen3-32b"
