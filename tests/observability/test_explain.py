"""`saar replay show` tells a record in a few lines: what matched, the lock or reset, the price
that decided, the worker and why, the outcome."""

from __future__ import annotations

from typing import Any

import pytest

from extproc.observability.explain import explain


def _record(**fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "replay_id": "rp-1", "session": {"id": "s1", "tenant": "t1"},
        "memory": {"turns": 3, "idle_s": 12.0, "decision": "light_tasks"},
        "request": {"api": "openai_chat", "model": "auto", "messages": 7,
                    "context_tokens": 12000, "tool_results": 0, "stream": False},
        "base": {"decision": "hard_engineering", "model": "qwen3-32b", "difficulty": 0.85,
                 "matched": True, "topical": True, "confidence": 0.7,
                 "scores": {"qwen3-8b": 0.51, "qwen3-32b": 0.78}},
        "lock": None, "reset": None, "candidates": [], "previous_model": "qwen3-8b",
        "decision": "hard_engineering", "model": "qwen3-8b", "action": "keep",
        "phase": "normal", "reason": "stay_priced", "confidence": 0.6,
        "worker": None, "outcome": {},
    }
    record.update(fields)
    return record


PRICED = [
    {"model": "qwen3-8b", "base": 0.51, "stay_bias": 0.1, "handoff": 0.0, "history": 0.0,
     "cache_penalty": 0.0, "transition_usd": 0.0, "adjusted": 0.61, "available": True},
    {"model": "qwen3-32b", "base": 0.78, "stay_bias": 0.0, "handoff": 0.05, "history": 0.0,
     "cache_penalty": 0.2, "transition_usd": 0.0355, "adjusted": 0.53, "available": True},
]
WORKER = {"picked": "10.0.0.5:8000", "pinned": None, "fallbacks": ["10.0.0.6:8000"],
          "matched_blocks": {"10.0.0.5:8000": 312}, "scores": {"10.0.0.5:8000": 0.91,
                                                              "10.0.0.6:8000": 0.4},
          "by_scorer": {"prefix": {"10.0.0.5:8000": 0.8, "10.0.0.6:8000": 0.0}}}


@pytest.mark.parametrize(("fields", "expected", "absent"), [
    ({}, ["rp-1: session s1 (tenant t1), turn 4; openai_chat for 'auto', 7 messages, "
          "~12,000 tokens",
          "matched  decision hard_engineering on its content (a task of its own)",
          "qwen3-32b 0.780, qwen3-8b 0.510",
          "decided  keep qwen3-8b (stay_priced: no other model beat the current one",
          "outcome  no answer recorded yet"], ["lock ", "reset ", "price "]),
    ({"candidates": PRICED},
     ["price    qwen3-8b 0.610 [base 0.510, +stay 0.10] > qwen3-32b 0.530 [base 0.780, "
      "-handoff 0.050, -cache 0.200, switch $0.03550]"], []),
    ({"lock": "tool_loop", "reason": "tool_loop_lock", "action": "locked_keep",
      "worker": {**WORKER, "pinned": "10.0.0.5:8000"},
      "request": {"api": "openai_chat", "model": "auto", "messages": 9,
                  "context_tokens": 14000, "tool_results": 2}},
     ["2 tool results", "lock     tool_loop lock on qwen3-8b, pinned to worker 10.0.0.5:8000",
      "the model (and worker) that issued the calls must answer them",
      "worker   10.0.0.5:8000: pinned by the lock"], ["price "]),
    ({"reset": "idle", "reason": "idle_reset", "action": "switch", "model": "qwen3-32b",
      "memory": {"turns": 5, "idle_s": 412.0, "decision": "light_tasks"}},
     ["decided  switch qwen3-8b -> qwen3-32b (idle_reset", "reset    idle for 412.0 s"], []),
    ({"reset": "drift", "reason": "drift_reset"},
     ["reset    the session was on decision light_tasks; this turn matched hard_engineering"],
     []),
    ({"worker": WORKER},
     ["worker   10.0.0.5:8000: score 0.910 (prefix 0.80), 312 prefix blocks cached there; "
      "next 10.0.0.6:8000 0.400; fallbacks 10.0.0.6:8000"], []),
    ({"outcome": {"status": 200, "served_worker": "10.0.0.5:8000", "latency_ms": 812.5,
                  "usage": {"prompt_tokens": 12000, "cached_tokens": 11000,
                            "completion_tokens": 40}, "finish_reason": "tool_calls",
                  "tool_names": ["bash"]}},
     ["outcome  HTTP 200, served by 10.0.0.5:8000, 812.5 ms, 12000 tokens in (11000 cached), "
      "40 out, finish tool_calls, called bash"], []),
    ({"outcome": {"status": 200, "usage": {"prompt_tokens": 300, "cached_tokens": None,
                                           "completion_tokens": 20, "source": "estimated"},
                  "finish_reason": "stop"}},
     ["outcome  HTTP 200, ~300 tokens in, ~20 out (estimated: the engine reported none), "
      "finish stop"], []),
    ({"worker": {**WORKER, "predicted": {
        "10.0.0.5:8000": {"ttft_s": 0.0125, "wait_s": 0.002, "prefill_s": 0.0035,
                          "steps_s": 0.002, "overhead_s": 0.005, "interference_s": 0.007,
                          "adapter_s": 0.0,
                          "evicts_s": 0.0, "cost_s": 0.0195, "uncached_tokens": 70,
                          "ahead_tokens": 40, "decoding": 2},
        "10.0.0.6:8000": {"ttft_s": 0.355, "wait_s": 0.0, "prefill_s": 0.35, "steps_s": 0.0,
                          "overhead_s": 0.005, "interference_s": 0.0, "evicts_s": 0.0,
                          "cost_s": 0.355, "uncached_tokens": 7000, "ahead_tokens": 0,
                          "decoding": 0}}}},
     ["worker   10.0.0.5:8000: predicted TTFT 12.5 ms (wait 2.0 for 40 tokens ahead + "
      "prefill 3.5 of 70 uncached + 2.0 of decode steps + 5.0), +7.0 ms its prefill costs "
      "the 2 decoding there; next 10.0.0.6:8000 355.0 ms; fallbacks 10.0.0.6:8000"], []),
    ({"outcome": {"status": 200, "latency_ms": 900.0, "first_chunk_ms": 120.5}},
     ["outcome  HTTP 200, 900.0 ms, first token at 120.5 ms"], []),
    ({"base": None, "reason": "physical_model", "decision": "direct", "previous_model": None,
      "session": {}, "memory": None},
     ["rp-1: no session;", "routed to it directly",
      "worker   no pick here"], ["matched "]),
    ({"reason": "some_new_reason"}, ["(some_new_reason: some_new_reason)"], []),
    ({"decision": "light_tasks", "lock": "tool_loop", "reason": "tool_loop_lock",
      "request": {"api": "openai_chat", "model": "auto", "messages": 3, "context_tokens": 10,
                  "tool_results": 1}},
     ["~10 tokens, 1 tool result\n", "; the session's decision light_tasks held"], []),
])
def test_explain(fields, expected, absent):
    told = explain(_record(**fields))
    for text in expected:
        assert text in told, (text, told)
    for text in absent:
        assert f"\n  {text}" not in told, (text, told)
    assert len(told.splitlines()) <= 9
