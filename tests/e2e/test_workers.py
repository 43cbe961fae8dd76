"""Issue 4 end to end: KV-aware worker picking and session-aware admission through real Envoy,
with two simulated workers per model."""

from __future__ import annotations

import random
import time

import httpx
import openai
import pytest
from openai import OpenAI

from extproc.dev.harness import Stack, run_stack
from tests.e2e.conftest import e2e_config, get_json, replay_outcome

pytestmark = pytest.mark.e2e
VOCABULARY = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda",
              "sigma", "omega"]
SESSIONS, TURNS = 5, 4
"""An odd number of interleaved sessions: round robin cannot keep one on a worker by accident."""


def context(seed: int, words: int = 1500) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(VOCABULARY) for _ in range(words))


def hit_rate(stack: Stack, model: str) -> float:
    hits = queries = 0.0
    for url in stack.sims[model]:
        for line in httpx.get(f"{url}/metrics").text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits / queries


def agent_run(stack: Stack) -> list[dict[str, str]]:
    """Interleaved agent sessions, each resending its own long, growing context."""
    clients = [
        OpenAI(base_url=f"{stack.url}/v1", api_key="k", max_retries=0,
               default_headers={"x-session-id": f"kv-{i}"})
        for i in range(SESSIONS)
    ]
    histories = [[{"role": "system", "content": context(i)}] for i in range(SESSIONS)]
    seen = []
    for turn in range(TURNS):
        for client, history in zip(clients, histories, strict=True):
            history.append({"role": "user", "content": f"step {turn}: continue"})
            raw = client.chat.completions.with_raw_response.create(
                model="qwen3-8b", messages=history)
            history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
            seen.append(dict(raw.headers))
    return seen


def scheduling_config(**scheduling) -> dict:
    config = e2e_config()
    config["scheduling"] = {"scrape_interval_seconds": 0.05, **scheduling}
    return config


def test_kv_aware_picking_beats_round_robin_and_serves_the_pick(tmp_path):
    with run_stack(scheduling_config(enabled=False), workers_per_model=2,
                   workdir=tmp_path / "rr") as stack:
        agent_run(stack)
        round_robin = hit_rate(stack, "qwen3-8b")
    with run_stack(scheduling_config(), workers_per_model=2, workdir=tmp_path / "kv") as stack:
        seen = agent_run(stack)
        kv_aware = hit_rate(stack, "qwen3-8b")
        for headers in seen:
            record = replay_outcome(stack, headers["x-replay-id"])
            # The worker the processor picked is the one Envoy sent the request to.
            assert record["worker"]["picked"] == headers["x-saar-worker"]
            assert record["outcome"]["served_worker"] == headers["x-saar-worker"]
            assert headers["x-sim-instance"].startswith("qwen3-8b-")
        picks = {h["x-saar-worker"] for h in seen}
        assert len(picks) == 2  # sessions are spread over both workers, not piled on one
    assert kv_aware > round_robin + 0.2, (kv_aware, round_robin)
    assert kv_aware > 0.7


def admission_stack(tmp_path, on_paused: str):
    admission = {"enabled": True, "tick_seconds": 0.1, "forced_resume_seconds": 1.0,
                 "on_paused": on_paused, "hold_timeout_seconds": 5}
    return run_stack(scheduling_config(admission=admission), workers_per_model=2,
                     sim_args=["--num-gpu-blocks", "64"], workdir=tmp_path / on_paused)


def oversized_turn(client: OpenAI) -> str:
    """One turn far over the worker's KV; its replay id."""
    answer = client.chat.completions.with_raw_response.create(
        model="qwen3-8b", messages=[{"role": "user", "content": context(99, words=2500)}])
    return answer.headers["x-replay-id"]


def test_paused_session_is_rejected_with_retry_after(tmp_path):
    with admission_stack(tmp_path, "reject") as stack:
        client = OpenAI(base_url=f"{stack.url}/v1", api_key="k", max_retries=0,
                        default_headers={"x-session-id": "big"})
        oversized_turn(client)  # its context is far over the worker's KV: paused when acting
        deadline = time.monotonic() + 5
        while "saar_admission_paused_sessions 1.0" not in httpx.get(
                f"{stack.processor_http}/metrics").text:
            assert time.monotonic() < deadline, "admission never paused the session"
            time.sleep(0.05)
        with pytest.raises(openai.RateLimitError) as info:
            oversized_turn(client)
        assert info.value.response.headers["retry-after"]
        assert info.value.body["code"] == "session_paused"


def test_paused_session_is_held_until_resumed(tmp_path):
    with admission_stack(tmp_path, "hold") as stack:
        client = OpenAI(base_url=f"{stack.url}/v1", api_key="k", max_retries=0,
                        default_headers={"x-session-id": "big"})
        oversized_turn(client)
        deadline = time.monotonic() + 5
        while "saar_admission_paused_sessions 1.0" not in httpx.get(
                f"{stack.processor_http}/metrics").text:
            assert time.monotonic() < deadline, "admission never paused the session"
            time.sleep(0.05)
        started = time.monotonic()
        # held at the processor, then served: no error reaches the agent
        replay_id = oversized_turn(client)
        waited = time.monotonic() - started
        assert waited > 0.3
        metrics = httpx.get(f"{stack.processor_http}/metrics").text
        assert 'saar_holds_total{kind="paused",outcome="ready"} 1.0' in metrics
        record = get_json(f"{stack.processor_http}/v1/replay/{replay_id}")
        [hold] = record["holds"]
        assert hold["kind"] == "paused" and 300 < hold["ms"] < waited * 1000
        timings = record["timings_us"]  # the wait is the hold's, not the router's loading
        assert timings["held"] / 1000 == pytest.approx(hold["ms"], abs=0.2)
        assert timings["load"] < 50_000
        assert get_json(f"{stack.processor_http}/healthz")["status"] == "ok"


def test_precise_prefix_index_follows_the_servers_kv_events(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([" ".join(VOCABULARY) + " step continue system user"],
                                  trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    with run_stack(scheduling_config(), workers_per_model=2, kv_events_tokenizer=path,
                   workdir=tmp_path / "precise") as stack:
        seen = agent_run(stack)
        matched = []
        for headers in seen[SESSIONS:]:  # every session's later turns
            worker = replay_outcome(stack, headers["x-replay-id"])["worker"]
            matched.append(worker["matched_blocks"][worker["picked"]])
        # Blocks the servers reported storing (KV events), not blocks the router sent there.
        assert min(matched) > 50
        assert hit_rate(stack, "qwen3-8b") > 0.7
