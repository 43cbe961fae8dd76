"""Flow control end to end: real Envoy, two simulated workers per model that run one request
at a time, the official SDKs. A saturated pool queues, sheds in the client's format with the
documented headers, serves an open tool loop's continuation ahead of a new session's first
turn (the first place its worker frees is its), and shows its queue in ``/metrics`` and on
the decision records."""

from __future__ import annotations

import threading
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from extproc.dev.harness import Stack, run_stack
from tests.e2e.conftest import e2e_config, replay_outcome, violations

pytestmark = pytest.mark.e2e
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]
SLOW = ["--max-num-seqs", "1", "--decode-tokens-per-s", "25", "--output-tokens", "16"]
"""One request at a time, each about 0.65 s: two of them saturate a model's two workers."""
LAG = 0.1
"""Seconds from a queued request's dispatch to its stream routing it, at most (a woken
stream runs when the event loop gets to it)."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Any:
    config = e2e_config()
    config["scheduling"] = {"scrape_interval_seconds": 0.05, "flow_control": {
        "enabled": True, "queue_depth_threshold": 1,
        "classes": {"interactive": {"priority": 2, "ttl_seconds": 30},
                    "batch": {"priority": 1, "ttl_seconds": 0.3},
                    "sheddable": {"priority": 0, "ttl_seconds": 5, "sheddable": True}}}}
    with run_stack(config, workers_per_model=2, sim_args=SLOW,
                   workdir=tmp_path_factory.mktemp("flow")) as running:
        yield running


def client(stack: Stack, session: str, **headers: str) -> OpenAI:
    return OpenAI(base_url=f"{stack.url}/v1", api_key="k", max_retries=0,
                  default_headers={"x-session-id": session, **headers})


def ask(stack: Stack, session: str, out: list[dict[str, str]] | None = None,
        **headers: str) -> dict[str, str]:
    raw = client(stack, session, **headers).chat.completions.with_raw_response.create(
        model="qwen3-8b", messages=[{"role": "user", "content": f"work on {session}"}])
    seen = dict(raw.headers)
    if out is not None:
        out.append(seen)
    return seen


def metric(stack: Stack, prefix: str) -> float:
    text = httpx.get(f"{stack.processor_http}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


class Saturated:
    """Keeps a model's two workers busy (and a queue behind them) from several threads."""

    def __init__(self, stack: Stack, n: int = 10) -> None:
        """Ten keep the queue deep: the two running finish together and free two places at
        once, which would reach a shallow queue's last request within a few hundred ms."""
        self.stack, self.n = stack, n
        self.done: list[dict[str, str]] = []
        self.threads = [threading.Thread(target=ask, args=(stack, f"busy-{i}", self.done))
                        for i in range(n)]

    def __enter__(self) -> Saturated:
        depth = 'saar_flow_queued{class="interactive",model="qwen3-8b"}'
        deadline = time.monotonic() + 5
        while metric(self.stack, depth) > 0:  # the gauge a previous test left must read 0 first
            assert time.monotonic() < deadline, "the queue never emptied"
            time.sleep(0.02)
        for thread in self.threads:
            thread.start()
        while metric(self.stack, depth) < 1:
            assert time.monotonic() < deadline, "the pool never queued"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        for thread in self.threads:
            thread.join(timeout=30)


def brief(record: dict[str, Any]) -> tuple[Any, ...]:
    """What a failed ordering assertion shows of a decision record."""
    return (record["replay_id"], record.get("session"), record["worker"]["picked"],
            round(record["time"], 3), [(h["kind"], h["ms"]) for h in record["holds"] or ()])


def test_a_saturated_pool_queues_and_every_queued_request_is_served(stack):
    before = metric(stack, 'saar_flow_wait_seconds_count{class="interactive"')
    with Saturated(stack) as busy:
        pass
    assert len(busy.done) == busy.n  # every one answered 200 (the SDK raises otherwise)
    queued = [h for h in busy.done
              if any(x["kind"] == "queue" for x in replay_outcome(
                  stack, h["x-replay-id"]).get("holds") or [])]
    assert queued, "no request waited in the queue"
    assert metric(stack, 'saar_flow_wait_seconds_count{class="interactive"') - before >= len(
        queued)
    assert violations(stack) == 0


def test_a_sheddable_request_is_refused_with_the_documented_error_and_headers(stack):
    with Saturated(stack):
        with pytest.raises(openai.RateLimitError) as info:
            ask(stack, "shed-me", **{"x-saar-class": "sheddable"})
        anthropic_client = anthropic.Anthropic(
            base_url=stack.url, api_key="k", max_retries=0,
            default_headers={"x-session-id": "shed-me-too", "x-saar-class": "sheddable"})
        with pytest.raises(anthropic.RateLimitError) as claude:
            anthropic_client.messages.create(model="qwen3-8b", max_tokens=16, messages=[
                {"role": "user", "content": "hello"}])
    headers = info.value.response.headers
    assert headers["x-saar-drop-reason"] == "saturated"
    assert headers["retry-after"] == "1"
    assert info.value.body["code"] == "request_shed"
    assert claude.value.response.headers["x-saar-drop-reason"] == "saturated"
    assert claude.value.body["error"]["type"] == "rate_limit_error"
    record = replay_outcome(stack, headers["x-replay-id"])
    assert record["outcome"]["refused"] == "request_shed"
    assert metric(stack, 'saar_flow_shed_total{class="sheddable",model="qwen3-8b",'
                         'reason="saturated"}') >= 1


def test_a_request_never_waits_past_its_classs_ttl(stack):
    with Saturated(stack):
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as info:
            ask(stack, "batch-job", **{"x-saar-class": "batch"})
        waited = time.monotonic() - started
    assert info.value.response.headers["x-saar-drop-reason"] == "ttl"
    assert 0.25 <= waited < 2.0  # its class's TTL is 0.3 s


def test_an_open_tool_loops_continuation_is_served_before_a_new_sessions_first_turn(stack):
    loop = client(stack, "tool-loop")
    history: list[dict[str, Any]] = [{"role": "user", "content": "read the config"}]
    first = loop.chat.completions.create(model="qwen3-8b", messages=history, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    history += [first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "debug: true"}]
    answered: dict[str, str] = {}
    """Which request got which replay id: its record says when the router dispatched it (the
    order they finish in is the workers', each with its own engine queue)."""

    def new_session() -> None:
        answered["new"] = ask(stack, "brand-new")["x-replay-id"]

    def continuation() -> None:
        raw = loop.chat.completions.with_raw_response.create(
            model="qwen3-8b", messages=history, tools=TOOLS)
        answered["continuation"] = raw.headers["x-replay-id"]

    with Saturated(stack) as busy:
        newcomer = threading.Thread(target=new_session)
        newcomer.start()
        time.sleep(0.2)  # the new session is queued first
        continuing = threading.Thread(target=continuation)
        continuing.start()
        newcomer.join(timeout=30)
        continuing.join(timeout=30)
    records = {name: replay_outcome(stack, replay_id) for name, replay_id in answered.items()}
    assert all(any(h["kind"] == "queue" for h in r["holds"] or ()) for r in records.values())
    # The continuation waits for its own worker (its hard lock's: its KV is there); the first
    # place that frees there is its, not any first turn's queued before it.
    cont = records["continuation"]
    home = cont["worker"]["picked"]
    queued_at = cont["time"] - sum(h["ms"] for h in cont["holds"] if h["kind"] == "queue") / 1e3
    others = [records["new"]] + [replay_outcome(stack, h["x-replay-id"]) for h in busy.done]
    # A record's time is when its stream routed it: a request dispatched just before the
    # continuation queued is routed a little later (its stream must be woken and run; tens
    # of ms on a busy machine), so only one routed LAG after the continuation queued passed
    # it. The places free every ~0.3 s, so one taken from the continuation is routed later.
    passed = [r["replay_id"] for r in others if r["worker"]["picked"] == home
              and any(h["kind"] == "queue" for h in r["holds"] or ())
              and queued_at + LAG < r["time"] < cont["time"]]
    assert passed == [], (round(queued_at, 3), [brief(r) for r in [cont, *others]])
    assert violations(stack) == 0
