"""Sessions as a person reads them: a summary of each session's records (the web view's list)
and what a turn cost at the served model's prices."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config import Model
from ..core.saar import TOKENS_PER_PRICE_UNIT
from ..types import Usage
from .replay import Record


def turn_cost(model: Model, usage: Usage) -> float:
    """US dollars: uncached input at the prompt price, cached input at the cached price,
    output at the completion price."""
    price = model.pricing
    return (
        (usage.prompt_tokens - usage.cached_tokens) * price.prompt
        + usage.cached_tokens * price.cached_input
        + usage.completion_tokens * price.completion
    ) / TOKENS_PER_PRICE_UNIT


def record_cost(record: Record, models: Mapping[str, Model]) -> float | None:
    """What the backend's reported usage of this turn cost (None: no usage reported)."""
    usage = (record.get("outcome") or {}).get("usage")
    model = models.get(record.get("model", ""))
    if not usage or usage.get("source") == "estimated" or model is None:
        return None
    return turn_cost(model, Usage(usage["prompt_tokens"], usage["completion_tokens"],
                                  usage["cached_tokens"]))


def summarize(records: Sequence[Record], models: Mapping[str, Model]) -> dict[str, Any]:
    """One session's line: where it is now and what it did (records in time order)."""
    last = records[-1]
    session = last.get("session") or {}
    costs = [c for r in records if (c := record_cost(r, models)) is not None]
    outcomes = [r.get("outcome") or {} for r in records]
    return {
        "session_id": session.get("id"),
        "tenant": session.get("tenant"),
        "parent": session.get("parent"),
        "model": last.get("model"),
        "decision": last.get("decision"),
        "phase": last.get("phase"),
        "turns": len(records),
        "switches": sum(r.get("action") == "switch" for r in records),
        "locks": sum(r.get("lock") is not None for r in records),
        "resets": sum(r.get("reset") is not None for r in records),
        "errors": sum(o.get("status", 200) >= 400 or bool(o.get("aborted")) for o in outcomes),
        "cost_usd": round(sum(costs), 6) if costs else None,
        "started": records[0]["time"],
        "last": last["time"],
        "last_replay_id": last["replay_id"],
    }
