"""A replay record told in a few lines (``saar replay show``): what the request was, which
decision matched and why, the lock or reset that held, the price that decided, the worker and
why, and what came back. The record itself (``--json``) stays the reference; this reads it."""

from __future__ import annotations

from typing import Any

from .replay import Record

REASONS = {
    "tool_loop_lock": "the request carries tool results: the model (and worker) that issued "
                      "the calls must answer them",
    "provider_state_lock": "the request carries provider state (a response id, reasoning "
                           "items) only its issuer can read",
    "new_session": "a new session takes the matched decision's best base model",
    "no_session": "no session id: the best base model, nothing remembered",
    "idle_reset": "the session was quiet past the idle timeout: decided afresh",
    "drift_reset": "this turn's content matched another decision (a new task): decided afresh",
    "switch_priced": "another model beat the current one by more than the switch margin, its "
                     "switch cost included",
    "stay_priced": "no other model beat the current one by the switch margin, its switch cost "
                   "included",
    "min_turns": "another model priced better, but the session is too young to switch",
    "context_window": "the context outgrew the current model's window",
    "failover": "the current model is unavailable (health)",
    "physical_model": "the client named a physical model: routed to it directly",
}


def explain(record: Record) -> str:
    """The record in short lines, each led by what it is about."""
    lines = [_head(record)]
    base = record.get("base")
    if base:
        held = record.get("decision")
        matched = _matched(base)
        if held and held != base.get("decision"):
            matched += f"; the session's decision {held} held"
        lines.append(_row("matched", matched))
    lines.append(_row("decided", _decided(record)))
    if record.get("lock"):
        lines.append(_row("lock", _lock(record)))
    if record.get("reset"):
        lines.append(_row("reset", _reset(record)))
    priced = _priced(record)
    if priced:
        lines.append(_row("price", priced))
    lines.append(_row("worker", _worker(record)))
    if record.get("holds"):
        lines.append(_row("held", ", ".join(f"{h['kind']} {h['ms']} ms"
                                            for h in record["holds"])))
    lines.append(_row("outcome", _outcome(record.get("outcome") or {})))
    return "\n".join(lines)


def _row(label: str, text: str) -> str:
    return f"  {label:<8} {text}"


def _head(record: Record) -> str:
    session = record.get("session") or {}
    request = record.get("request") or {}
    memory = record.get("memory") or {}
    who = f"session {session.get('id')}" if session.get("id") else "no session"
    if session.get("tenant"):
        who += f" (tenant {session['tenant']})"
    if memory:
        who += f", turn {memory.get('turns', 0) + 1}"
    parts = [f"{request.get('api', '?')} for {request.get('model', '?')!r}",
             f"{request.get('messages', 0)} messages",
             f"~{request.get('context_tokens', 0):,} tokens"]
    results = request.get("tool_results")
    if results:
        parts.append(f"{results} tool result{'s' if results != 1 else ''}")
    if request.get("stream"):
        parts.append("streamed")
    return f"{record.get('replay_id', '?')}: {who}; {', '.join(parts)}"


def _matched(base: dict[str, Any]) -> str:
    how = ("on its content (a task of its own)" if base.get("topical")
           else "on the request's shape") if base.get("matched") else (
        "by nothing: the session's decision or the fallback")
    scores = sorted((base.get("scores") or {}).items(), key=lambda kv: -kv[1])
    ranked = ", ".join(f"{m} {s:.3f}" for m, s in scores)
    return (f"decision {base.get('decision')} {how}; difficulty {base.get('difficulty')}; "
            f"base scores {ranked or 'none'}")


def _decided(record: Record) -> str:
    action = record.get("action", "?")
    model = record.get("model", "?")
    previous = record.get("previous_model")
    moved = f"{previous} -> {model}" if previous and previous != model else model
    reason = record.get("reason", "?")
    because = REASONS.get(reason, reason)
    return f"{action} {moved} ({reason}: {because}); confidence {record.get('confidence')}"


def _lock(record: Record) -> str:
    worker = (record.get("worker") or {}).get("pinned")
    pinned = f", pinned to worker {worker}" if worker else ""
    return f"{record['lock']} lock on {record.get('model')}{pinned}: no price was weighed"


def _reset(record: Record) -> str:
    memory = record.get("memory") or {}
    if record["reset"] == "idle":
        return f"idle for {memory.get('idle_s')} s since the previous turn"
    return (f"the session was on decision {memory.get('decision')}; this turn matched "
            f"{(record.get('base') or {}).get('decision')}")


def _priced(record: Record) -> str:
    candidates = record.get("candidates") or []
    if not candidates:
        return ""
    ranked = sorted(candidates, key=lambda c: -c["adjusted"])
    parts = []
    for c in ranked:
        terms = [f"base {c['base']:.3f}"]
        if c.get("stay_bias"):
            terms.append(f"+stay {c['stay_bias']:.2f}")
        for key, label in (("handoff", "handoff"), ("history", "history"),
                           ("cache_penalty", "cache")):
            if c.get(key):
                terms.append(f"-{label} {c[key]:.3f}")
        if c.get("transition_usd"):
            terms.append(f"switch ${c['transition_usd']:.5f}")
        gone = "" if c.get("available", True) else " (unavailable)"
        parts.append(f"{c['model']} {c['adjusted']:.3f}{gone} [{', '.join(terms)}]")
    return " > ".join(parts)


def _worker(record: Record) -> str:
    worker = record.get("worker")
    if not worker or not worker.get("picked"):
        return "no pick here: a pool of one (Envoy's balancer), or the pool's endpoint picker picks"
    picked = worker["picked"]
    predicted = worker.get("predicted") or {}
    if worker.get("pinned") == picked:
        why = "pinned by the lock (the worker holding the session's tool calls)"
    elif picked in predicted:
        why = _predicted(predicted[picked])
        others = sorted(((a, p) for a, p in predicted.items() if a != picked),
                        key=lambda x: x[1]["cost_s"])
        if others:
            why += "; next " + ", ".join(f"{a} {p['cost_s'] * 1e3:.1f} ms" for a, p in others[:2])
    else:
        scores = worker.get("scores") or {}
        by_scorer = worker.get("by_scorer") or {}
        mine = ", ".join(f"{name} {values[picked]:.2f}" for name, values in by_scorer.items()
                         if picked in values)
        blocks = (worker.get("matched_blocks") or {}).get(picked)
        why = f"score {scores.get(picked, 0):.3f}" + (f" ({mine})" if mine else "")
        if blocks:
            why += f", {blocks} prefix blocks cached there"
        others = sorted(((a, s) for a, s in scores.items() if a != picked), key=lambda x: -x[1])
        if others:
            why += "; next " + ", ".join(f"{a} {s:.3f}" for a, s in others[:2])
    fallbacks = worker.get("fallbacks") or []
    tail = f"; fallbacks {', '.join(fallbacks)}" if fallbacks else ""
    return f"{picked}: {why}{tail}"


def _predicted(p: dict[str, Any]) -> str:
    """One candidate's predicted time to first token, term by term, and what it costs the
    others there."""
    ms = {k: p[k] * 1e3 for k in ("ttft_s", "wait_s", "prefill_s", "steps_s", "overhead_s",
                                  "interference_s", "evicts_s")}
    text = (f"predicted TTFT {ms['ttft_s']:.1f} ms (wait {ms['wait_s']:.1f} for "
            f"{p['ahead_tokens']} tokens ahead + prefill {ms['prefill_s']:.1f} of "
            f"{p['uncached_tokens']} uncached + {ms['steps_s']:.1f} of decode steps + "
            f"{ms['overhead_s']:.1f})")
    if p.get("adapter_s"):
        text += f", its adapter loaded in {p['adapter_s'] * 1e3:.1f} ms"
    if p["interference_s"]:
        text += (f", +{ms['interference_s']:.1f} ms its prefill costs the {p['decoding']} "
                 "decoding there")
    if p["evicts_s"]:
        text += f", +{ms['evicts_s']:.1f} ms of live sessions' KV it evicts"
    return text


def _outcome(outcome: dict[str, Any]) -> str:
    if not outcome:
        return "no answer recorded yet"
    parts = [f"HTTP {outcome.get('status', '?')}"]
    if outcome.get("served_worker"):
        parts.append(f"served by {outcome['served_worker']}")
    if outcome.get("latency_ms") is not None:
        parts.append(f"{outcome['latency_ms']} ms")
    if outcome.get("first_chunk_ms") is not None:
        parts.append(f"first token at {outcome['first_chunk_ms']} ms")
    usage = outcome.get("usage")
    if usage and usage.get("source") == "estimated":
        parts.append(f"~{usage.get('prompt_tokens')} tokens in, ~"
                     f"{usage.get('completion_tokens')} out (estimated: the engine reported none)")
    elif usage:
        parts.append(f"{usage.get('prompt_tokens')} tokens in ({usage.get('cached_tokens')} "
                     f"cached), {usage.get('completion_tokens')} out")
    if outcome.get("finish_reason"):
        parts.append(f"finish {outcome['finish_reason']}")
    if outcome.get("tool_names"):
        parts.append("called " + ", ".join(outcome["tool_names"]))
    if outcome.get("aborted"):
        parts.append("aborted by the client")
    return ", ".join(parts)
