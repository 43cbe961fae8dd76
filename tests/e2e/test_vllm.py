"""Through the real Envoy and ``saar serve`` to two real vLLM servers (PyPI's CPU build, the tiny
offline model of ``extproc.dev.engines``): agent sessions over the three APIs with tools (vLLM's
``hermes`` parser), streamed and not; the router's view of each worker against vLLM's own
metrics; the precise index against the cached tokens vLLM reports; context windows counted in
the model's tokens; ``/v1/completions``.

vLLM is the oracle here, not the router's simulator: it keeps no continuity ledger, so each
agent checks that every tool result and ``previous_response_id`` reached the worker that issued
it (Envoy's own ``x-saar-worker``), and vLLM itself refuses a response id it never stored.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from openai import OpenAI

from extproc.dev.engines import vllm
from extproc.dev.harness import Stack, free_ports, run_stack
from extproc.scheduling.signals import parse_metrics
from tests.e2e.agents import Agent, ChatAgent, MessagesAgent, ResponsesAgent
from tests.e2e.conftest import ADMIN_TOKEN_ENV, get_json, replay_outcome

pytestmark = pytest.mark.e2e
WINDOW = 8192
TOOL = {"type": "function", "function": {
    "name": "run_tests", "description": "Run the tests",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
RESPONSES_TOOL = {"type": "function", "name": "run_tests", "description": "Run the tests",
                  "parameters": {"type": "object", "properties": {},
                                 "additionalProperties": False}}
MESSAGES_TOOL = {"name": "run_tests", "description": "Run the tests",
                 "input_schema": {"type": "object", "properties": {},
                                  "additionalProperties": False}}
SYSTEM = ("You are a careful coding agent working in a large Python repository. " * 40).strip()


def config(model_dir: str, listen: str) -> dict[str, Any]:
    return {
        "models": {"tiny": {"cluster": "tiny", "context_window": WINDOW, "quality": 0.5}},
        "routing": {"logical_models": ["auto"], "cluster_header": "x-saar-cluster",
                    "decisions": [{"name": "everything", "difficulty": 0.4,
                                   "modelRefs": [{"model": "tiny"}]}]},
        "scheduling": {"prefix": {"mode": "precise", "tokenizer": model_dir,
                                  "block_size": vllm.BLOCK_SIZE, "kv_events_listen": listen}},
        "admin": {"token_env": ADMIN_TOKEN_ENV},
    }


@pytest.fixture(scope="module")
def listen() -> str:
    """Where the router listens for the KV events of the engines that connect to it."""
    return f"tcp://127.0.0.1:{free_ports(1)[0]}"


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory,
            listen: str) -> Iterator[list[vllm.VllmServer]]:
    """The first binds its KV-event endpoint (``ipc://``: the router connects), the second
    connects to the router's (``tcp://``, as llm-d deploys vLLM)."""
    workdir = tmp_path_factory.mktemp("vllm")
    with vllm.vllm_pool(2, workdir, ports=free_ports(2), publish_to=(None, listen)) as servers:
        yield servers


@pytest.fixture(scope="module")
def stack(engines: list[vllm.VllmServer], listen: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workers = [{"address": s.address} | ({"kv_events": s.kv_events} if s.kv_events != listen
                                          else {}) for s in engines]
    with run_stack(config(str(vllm.tiny_model()), listen), engines={"tiny": workers},
                   workdir=tmp_path_factory.mktemp("stack")) as running:
        yield running


def _agents(stack: Stack) -> list[Agent]:
    agents: list[Agent] = []
    for i in range(4):
        stream = i % 2 == 1
        task = f"{SYSTEM}\nSession {i}: refactor module {i} and run its tests."
        agents.append(ChatAgent(stack.url, f"vllm-chat-{i}", stream=stream, retries=0,
                                task=task, tools=[TOOL],
                                options={"tool_choice": "required", "max_tokens": 48}))
    for i in range(2):
        agents.append(ResponsesAgent(stack.url, f"vllm-responses-{i}", stream=i == 1, retries=0,
                                     task=f"Session {i}: run the tests.", tools=[RESPONSES_TOOL],
                                     options={"tool_choice": "required",
                                              "max_output_tokens": 48}))
        agents.append(MessagesAgent(stack.url, f"vllm-messages-{i}", stream=i == 1, retries=0,
                                    task=f"Session {i}: run the tests.", tools=[MESSAGES_TOOL],
                                    options={"tool_choice": {"type": "any"}, "max_tokens": 48}))
    return agents


@pytest.fixture(scope="module")
def sessions(stack: Stack) -> list[Agent]:
    """Every agent's turns, run once for the module's checks."""
    agents = _agents(stack)
    for _ in range(4):
        for agent in agents:
            _turn(agent)
    return agents


def _turn(agent: Agent, tries: int = 4) -> None:
    """One turn, played again where vLLM failed on its own answer: the random-weight model
    sometimes emits a tool call whose arguments are JSON but no object (``true``, ``"+"``;
    vLLM 0.32 on CPU does not constrain them, whatever the tool choice), and vLLM's Messages
    API then fails building its answer (a 400 naming ``AnthropicContentBlock``). Sampled
    again, the answer differs; anything else fails the test."""
    for attempt in range(tries):
        try:
            agent.turn()
            return
        except anthropic.BadRequestError as exc:
            if "AnthropicContentBlock" not in str(exc) or attempt == tries - 1:
                raise


def test_every_tool_result_and_response_id_reaches_its_issuer(sessions: list[Agent]) -> None:
    continued = [t for a in sessions for t in a.served if t.continues]
    assert len(continued) >= 12, "the model issued too few tool calls to test the locks"
    assert [pair for a in sessions for pair in a.broken()] == []
    workers = {t.worker for a in sessions for t in a.served}
    assert len(workers) == 2, f"every session went to one worker: {workers}"


def test_every_answer_has_its_usage_and_finish_reason(stack: Stack,
                                                      sessions: list[Agent]) -> None:
    turns = [t for a in sessions for t in a.served]
    missing = []
    for turn in turns:
        record = replay_outcome(stack, turn.replay_id, timeout=5,
                                until=("usage", "finish_reason"))
        outcome = record.get("outcome") or {}
        if not outcome.get("usage") or not outcome.get("finish_reason"):
            missing.append((turn.replay_id, outcome))
    assert missing == [], f"{len(missing)} of {len(turns)} answers lack usage"


def test_the_precise_index_predicts_what_vllm_finds_cached(stack: Stack,
                                                         sessions: list[Agent]) -> None:
    """On chat turns the router picked a worker for, the blocks its index matched there, in
    tokens, against the cached tokens vLLM reported: within one block, on whichever worker
    served them."""
    compared = within = 0
    hit: Counter[str] = Counter()
    for agent in sessions:
        if not isinstance(agent, ChatAgent):
            continue
        for turn in agent.served:
            record = replay_outcome(stack, turn.replay_id, timeout=5, until=("usage",))
            worker = record.get("worker") or {}
            usage = (record.get("outcome") or {}).get("usage") or {}
            if turn.worker not in worker.get("matched_blocks", {}):
                continue
            reported = usage.get("cached_tokens")
            if reported is None:
                continue
            predicted = worker["matched_blocks"][turn.worker] * vllm.BLOCK_SIZE
            compared += 1
            within += abs(predicted - reported) <= vllm.BLOCK_SIZE
            hit[turn.worker] += predicted > 0
    assert compared >= 6
    # The chat sessions share a long system prompt: the pick may rightly put them all where it
    # is cached. Both workers' event feeds are checked by the worker view's indexed blocks.
    assert sum(hit.values()) >= 1, f"predicted hits by worker: {hit}"
    assert within >= 0.95 * compared, f"{within} of {compared} within one block"


def test_the_router_sees_each_worker_as_vllm_reports_it(
        stack: Stack, engines: list[vllm.VllmServer], sessions: list[Agent]) -> None:
    view = {w["address"]: w for w in _workers(stack)}
    for server in engines:
        own = parse_metrics(server.metrics())
        seen = view[server.address]
        assert (seen["block_size"], seen["num_blocks"]) == (own.block_size, own.num_blocks)
        assert 0 < seen["indexed_blocks"] <= own.num_blocks
    # under load: the router's running count catches up with vLLM's within its scrape pace
    server = engines[0]
    client = httpx.Client(timeout=60)
    body = {"model": "tiny", "max_tokens": 4000, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "count"}]}
    with _in_flight(client, server.url, body, 3):
        deadline = time.monotonic() + 8
        matched = False
        while time.monotonic() < deadline and not matched:
            own = parse_metrics(server.metrics())
            seen = {w["address"]: w for w in _workers(stack)}[server.address]
            matched = own.running > 0 and (seen["running"], seen["waiting"]) == (
                own.running, own.waiting) and abs(seen["kv_usage"] - own.kv_usage) < 0.05
            time.sleep(0.1)
    assert matched, f"router {seen} against vLLM {own}"


def test_a_prompt_over_the_window_is_refused_before_vllm(
        stack: Stack, engines: list[vllm.VllmServer]) -> None:
    """Digits are a token each (Qwen2's pre-tokenizer): ~11k of the model's tokens in 12k
    bytes, where four bytes a token would guess 3k."""
    tokenizer_dir = vllm.tiny_model()
    from extproc.scheduling.tokenizer import Tokenizer

    text = " ".join(str(10**6 + i) for i in range(1500))
    counted = len(Tokenizer(tokenizer_dir).encode(text))
    assert counted > WINDOW > len(text) // 4
    before = [_requests_seen(s) for s in engines]
    client = OpenAI(base_url=f"{stack.url}/v1", api_key="k", max_retries=0)
    with pytest.raises(Exception) as refused:
        client.chat.completions.create(model="auto", max_tokens=4,
                                       messages=[{"role": "user", "content": text}])
    assert getattr(refused.value, "status_code", None) == 400
    assert "window" in str(refused.value)
    assert [_requests_seen(s) for s in engines] == before


def test_legacy_completions_are_served(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.url}/v1", api_key="k", max_retries=0,
                    default_headers={"x-session-id": "vllm-completions"})
    raw = client.completions.with_raw_response.create(model="auto", prompt="def main():",
                                                      max_tokens=8)
    answer = raw.parse()
    assert answer.object == "text_completion" and answer.choices[0].finish_reason == "length"
    record = replay_outcome(stack, raw.headers["x-replay-id"], timeout=5, until=("usage",))
    assert record["outcome"]["usage"]["completion_tokens"] == 8


def _workers(stack: Stack) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get_json(f"{stack.processor_http}/v1/workers")["workers"]
    return found


def _requests_seen(server: vllm.VllmServer) -> float:
    """Prompt tokens vLLM has counted: unchanged when no request reached it."""
    for line in server.metrics().splitlines():
        if line.startswith("vllm:prompt_tokens_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class _in_flight:
    """``count`` streamed requests sent straight to one server, read to their end on exit."""

    def __init__(self, client: httpx.Client, url: str, body: dict[str, Any], count: int):
        self._client, self._url, self._body, self._count = client, url, body, count
        self._streams: list[Any] = []

    def __enter__(self) -> None:
        for _ in range(self._count):
            request = self._client.build_request("POST", self._url + "/v1/chat/completions",
                                                 content=json.dumps(self._body),
                                                 headers={"content-type": "application/json"})
            answer = self._client.send(request, stream=True)
            assert answer.status_code == 200, answer.read()
            self._streams.append(answer)

    def __exit__(self, *_: object) -> None:
        for stream in self._streams:
            stream.read()
            stream.close()



def test_the_simulator_agrees_with_vllm_where_routing_reads_it(
        engines: list[vllm.VllmServer], tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same agent turns, straight to a vLLM server and to a ``saar sim-server`` given the
    model's directory and vLLM's block size: the same prompt tokens, the same cached tokens,
    and the load signals the router reads under the same names and units."""
    from extproc.dev.harness import Service, free_port, wait_http

    port = free_port()
    sim = Service("sim", [sys.executable, "-m", "extproc", "sim-server", "--host", "127.0.0.1",
                          "--port", str(port), "--model", "tiny",
                          "--tokenizer", str(vllm.tiny_model()),
                          "--block-size", str(vllm.BLOCK_SIZE)],
                  tmp_path_factory.mktemp("sim"),
                  functools.partial(wait_http, f"http://127.0.0.1:{port}/health"))
    sim.start()
    try:
        real = _turns(engines[1].url, "fidelity")
        simulated = _turns(f"http://127.0.0.1:{port}", "fidelity")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            sim_signals = parse_metrics(answer.read().decode())
    finally:
        sim.close()
    assert [t[0] for t in simulated] == [t[0] for t in real]  # prompt tokens, turn by turn
    assert [t[1] for t in simulated] == [t[1] for t in real]  # cached tokens, turn by turn
    assert any(t[1] for t in real)
    vllm_signals = parse_metrics(engines[1].metrics())
    for name in ("running", "waiting", "kv_usage", "block_size", "num_blocks"):
        assert getattr(vllm_signals, name) is not None, name
        assert getattr(sim_signals, name) is not None, name
    assert sim_signals.block_size == vllm_signals.block_size
    assert 0.0 <= sim_signals.kv_usage <= 1.0


def _turns(url: str, session: str) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each turn of one tool-using chat session."""
    client = OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{session}: refactor the parser and run the tests."}]
    out = []
    for turn in range(4):
        answer = client.chat.completions.create(model="tiny", messages=messages, tools=[TOOL],
                                                max_tokens=12, temperature=0, seed=turn)
        usage = answer.usage
        assert usage is not None
        details = usage.prompt_tokens_details
        out.append((usage.prompt_tokens, details.cached_tokens if details else 0))
        # the same next turn for both servers, whatever each answered
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call-{turn}", "type": "function",
             "function": {"name": "run_tests", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"call-{turn}", "content": f"{turn} passed"}]
    return out
