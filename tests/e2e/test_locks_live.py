"""Issue 9 item 0 live, with the official SDKs: tool results with another message beside them,
and a provider-state reference in a Chat body, stay with their issuer. Each follow-up says
"summarise", which alone would move the session to the cheap tier (the light_tasks decision):
only the lock keeps it on the model and worker that issued what it continues."""

from __future__ import annotations

import pytest
from anthropic import Anthropic
from openai import OpenAI

from tests.e2e.agents import HARD, MESSAGES_TOOL, RESPONSES_TOOL, TOOL
from tests.e2e.conftest import violations

pytestmark = pytest.mark.e2e
STRONG = "qwen3-32b"
NUDGE = "Also summarise the changelog when you are done."


def openai(stack, session: str) -> OpenAI:
    return OpenAI(base_url=f"{stack.url}/v1", api_key=f"key-{session}", max_retries=0,
                  default_headers={"x-session-id": session})


def locked(headers) -> None:
    assert headers["x-saar-selected-model"] == STRONG
    assert headers["x-saar-action"] == "locked_keep"


def test_chat_tool_results_followed_by_a_user_message_stay_locked(stack):
    before = violations(stack)
    client = openai(stack, "lock-chat")
    messages = [{"role": "user", "content": HARD}]
    first = client.chat.completions.with_raw_response.create(
        model="auto", messages=messages, tools=[TOOL])
    message = first.parse().choices[0].message
    assert first.headers["x-saar-selected-model"] == STRONG and message.tool_calls
    messages += [message.model_dump(exclude_none=True),
                 *({"role": "tool", "tool_call_id": c.id, "content": "3 passed"}
                   for c in message.tool_calls),
                 {"role": "user", "content": NUDGE}]  # a reminder beside the results
    second = client.chat.completions.with_raw_response.create(
        model="auto", messages=messages, tools=[TOOL])
    locked(second.headers)
    assert second.headers["x-saar-worker"] == first.headers["x-saar-worker"]
    assert violations(stack) == before


def test_anthropic_text_beside_tool_results_stays_locked(stack):
    before = violations(stack)
    client = Anthropic(base_url=stack.url, api_key="key-lock-msg", max_retries=0,
                       default_headers={"x-session-id": "lock-messages"})
    messages: list[dict] = [{"role": "user", "content": HARD}]
    first = client.messages.with_raw_response.create(
        model="auto", max_tokens=64, messages=messages, tools=[MESSAGES_TOOL])
    blocks = [b.model_dump(exclude_none=True) for b in first.parse().content]
    uses = [b for b in blocks if b["type"] == "tool_use"]
    assert uses and first.headers["x-saar-selected-model"] == STRONG
    messages += [{"role": "assistant", "content": blocks},
                 {"role": "user", "content": [
                     *({"type": "tool_result", "tool_use_id": b["id"], "content": "3 passed"}
                       for b in uses),
                     {"type": "text", "text": NUDGE}]}]
    second = client.messages.with_raw_response.create(
        model="auto", max_tokens=64, messages=messages, tools=[MESSAGES_TOOL])
    locked(second.headers)
    assert violations(stack) == before


def test_responses_outputs_followed_by_a_message_stay_locked(stack):
    before = violations(stack)
    client = openai(stack, "lock-responses")
    first = client.responses.with_raw_response.create(
        model="auto", input=HARD, tools=[RESPONSES_TOOL])
    response = first.parse()
    calls = [i for i in response.output if i.type == "function_call"]
    assert calls and first.headers["x-saar-selected-model"] == STRONG
    second = client.responses.with_raw_response.create(
        model="auto", previous_response_id=response.id, tools=[RESPONSES_TOOL],
        input=[*({"type": "function_call_output", "call_id": c.call_id, "output": "3 passed"}
                 for c in calls),
               {"type": "message", "role": "user", "content": NUDGE}])
    locked(second.headers)
    assert violations(stack) == before


def test_a_previous_response_id_in_a_chat_body_binds_to_its_issuer(stack):
    """Clients of other routers send provider state in a Chat body: it binds like any other."""
    client = openai(stack, "lock-chain-in-chat")
    opened = client.responses.with_raw_response.create(model="auto", input=HARD)
    assert opened.headers["x-saar-selected-model"] == STRONG
    follow = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": NUDGE}],
        extra_body={"previous_response_id": opened.parse().id})
    assert follow.headers["x-saar-selected-model"] == STRONG
    assert follow.headers["x-saar-session-phase"] == "provider_state"


def test_chat_answers_chained_by_previous_response_id_stay_with_their_issuer(stack):
    """The Semantic Router's live benchmark chains chat turns: each sends the last chat
    answer's id as ``previous_response_id`` and only its new message. The simulator accepts an
    id only from the worker that issued it, so a chained turn the router moved is refused."""
    before = violations(stack)
    client = openai(stack, "lock-chat-chain")
    opened = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": HARD}])
    assert opened.headers["x-saar-selected-model"] == STRONG
    previous = opened
    for _ in range(2):
        follow = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": NUDGE}],
            extra_body={"previous_response_id": previous.parse().id})
        locked(follow.headers)
        assert follow.headers["x-saar-session-phase"] == "provider_state"
        assert follow.headers["x-saar-worker"] == opened.headers["x-saar-worker"]
        previous = follow
    assert violations(stack) == before
