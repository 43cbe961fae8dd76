"""``saar replay what-if``: what another config would have done to recorded traffic.

The recorded sessions' session-control decisions (locks, resets, switch pricing, model prices
and context windows) are decided again, turn by turn in recorded time, by the live
``SaarEngine`` under the new config — the same policy objects the server runs, over the same
router memory (a ``MemoryStore`` the engine's facts are loaded from and its writes applied to).
Only what the record cannot replay is replaced:

* the matched decision: rules read the prompt, which no record holds, so ``RecordedSelector``
  (the live ``HybridSelector``) is told which decision matched and scores its candidates under
  the new config's models and prices; a turn that matched nothing inherits, as live;
* the answers: every turn is served (its recorded usage, the cache estimated the way
  ``saar eval matrix`` costs every policy: a session's prefix is warm on the model that served
  its previous turn), and the issuer of a tool call or response is whichever model the replay
  routed the turn that issued it to;
* the workers' measured prefix overlap, which the engine then estimates from router memory.

Both sides are costed by that one cache model and judged by one oracle: a turn carrying tool
results, provider state or a ``previous_response_id`` that is routed away from the model that
issued them is an unsafe switch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, Decision
from ..core.health import ModelHealth
from ..core.saar import SaarEngine
from ..core.selection import HybridSelector
from ..errors import RoutingError
from ..observability.journal import id_ref
from ..observability.replay import Record, SessionKey, session_key
from ..observability.sessions import turn_cost
from ..state.memory import MemoryStore
from ..state.records import Claim, Commit, Finish, Owner, Turn, owner_key
from ..state.store import Query
from ..types import Action, Api, RequestSummary, SessionIdentity, Usage
from .evaluation.backend import CACHE_TTL_SECONDS


class RecordedSelector(HybridSelector):
    """The live selector, with the rule match taken from the record being replayed."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self._decided: Mapping[str, Decision] = {d.name: d for d in config.routing.decisions}
        self.record: Record = {}
        self.missing: set[str] = set()
        """Decisions the recording matched that the new config does not have."""

    def match(self, request: RequestSummary, headers: Mapping[str, str]) -> Decision | None:
        base = self.record.get("base") or {}
        if not base.get("matched"):
            return None
        found = self._decided.get(base.get("decision", ""))
        if found is None:
            self.missing.add(str(base.get("decision")))
        return found


@dataclass(slots=True)
class Tally:
    turns: int = 0
    switches: int = 0
    locked: int = 0
    unsafe: int = 0
    refused: int = 0
    """Turns the policy answered with an error (a locked model down, no window fits)."""
    cost_usd: float = 0.0

    def add(self, other: Tally) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["cost_usd"] = round(self.cost_usd, 6)
        return out


@dataclass(slots=True)
class SessionDiff:
    session: str
    recorded: Tally = field(default_factory=Tally)
    what_if: Tally = field(default_factory=Tally)
    changed: int = 0
    """Turns the new config routed to another model than the recording."""


class _World:
    """One side (the recording, or the replay): who issued what, and what the cache holds."""

    def __init__(self, config: Config) -> None:
        self._models = config.models
        self._issuer_of_response: dict[str, str] = {}
        self._last_model: dict[SessionKey | None, str] = {}
        self._tool_issuer: dict[SessionKey | None, str] = {}
        self._warm: dict[tuple[SessionKey | None, str], tuple[int, float]] = {}

    def unsafe(self, record: Record, model: str) -> bool:
        """Routed away from the model that issued what this turn carries."""
        key = session_key(record)
        request = record.get("request") or {}
        issuers = []
        if request.get("tool_results"):
            issuers.append(self._tool_issuer.get(key))
        ref = request.get("previous_response_ref")
        if ref:
            issuers.append(self._issuer_of_response.get(ref))
        if request.get("provider_state_items"):
            issuers.append(self._last_model.get(key))
        return any(issuer is not None and issuer != model for issuer in issuers)

    def served(self, record: Record, model: str, now: float) -> tuple[Usage, float]:
        """The turn answered on ``model``: its usage with the cache this side's history left,
        what that cost, and who now owns what the answer issued."""
        key = session_key(record)
        outcome = record.get("outcome") or {}
        usage = outcome.get("usage") or {}
        prompt = int(usage.get("prompt_tokens")
                     or (record.get("request") or {}).get("context_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        warm = self._warm.get((key, model))
        cached = min(warm[0], prompt) if warm and now - warm[1] <= CACHE_TTL_SECONDS else 0
        self._warm[(key, model)] = (prompt, now)
        self._last_model[key] = model
        if outcome.get("tool_calls"):
            self._tool_issuer[key] = model
        if outcome.get("response_id"):
            self._issuer_of_response[id_ref(outcome["response_id"])] = model
        answer = Usage(prompt, completion, cached)
        return answer, turn_cost(self._models[model], answer) if model in self._models else 0.0


class WhatIf:
    """Replays records under ``config``: ``run`` returns one ``SessionDiff`` per session."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._now = 0.0
        self.selector = RecordedSelector(config)
        self.engine = SaarEngine(config, ModelHealth(clock=self._clock), clock=self._clock,
                                 selector=self.selector)
        self.store = MemoryStore.from_config(config, self._clock)

    def _clock(self) -> float:
        return self._now

    def run(self, records: Iterable[Record]) -> list[SessionDiff]:
        recorded, replayed = _World(self.config), _World(self.config)
        diffs: dict[str, SessionDiff] = {}
        for record in sorted(records, key=lambda r: r["time"]):
            key = session_key(record)
            name = "(no session)" if key is None else key[1]
            diff = diffs.setdefault(f"{key}", SessionDiff(name))
            self._now = record["time"]
            end = record["time"] + _latency(record)
            _judge(diff.recorded, recorded, record, str(record.get("model", "")),
                   record.get("action"), end)
            model = self._decide(record, diff.what_if, replayed, end)
            diff.changed += model is not None and model != record.get("model")
        return list(diffs.values())

    def _decide(self, record: Record, tally: Tally, world: _World, end: float) -> str | None:
        summary, identity = _request(record), _identity(record)
        facts = self.store.load_now(Query(identity.key, _owner_keys(summary, identity)))
        owners = {k.split("/", 1)[1]: o for k, o in facts.owners.items()}
        self.selector.record = record
        try:
            measured = record.get("cached_tokens") or {}
            decision = self.engine.decide(summary, identity, {}, facts.session, owners,
                                          measured.get)
        except RoutingError:
            tally.turns += 1
            tally.refused += 1
            return None
        estimated = _judge(tally, world, record, decision.model, decision.action.value, end)
        turn = Turn(record["replay_id"], identity.key, identity.tenant, decision.model,
                    decision.decision, decision.phase, decision.action is Action.SWITCH,
                    summary.context_tokens, record["time"], None, identity.final)
        outcome = record.get("outcome") or {}
        if not 200 <= int(outcome.get("status", 200)) < 300:
            return decision.model
        self.store.apply_now([Commit(turn)], record["time"])
        self._now = end
        reported = outcome.get("usage")
        if reported and reported.get("source") == "estimated":
            reported = None  # the engine reported none: the live memory kept none either
        if reported and decision.model == record.get("model"):
            usage: Usage | None = Usage(int(reported["prompt_tokens"]),
                                        int(reported["completion_tokens"]),
                                        int(reported["cached_tokens"]))
        else:  # another model would have reported another cache: estimate it
            usage = estimated if reported else None
        writes: list[Finish | Claim] = [Finish(turn, bool(outcome.get("tool_calls")), usage)]
        if outcome.get("response_id"):
            writes.append(Claim((owner_key(identity.tenant, id_ref(outcome["response_id"])),),
                                Owner(decision.model, None, identity.key)))
        self.store.apply_now(writes, end)
        return decision.model


def _judge(tally: Tally, world: _World, record: Record, model: str, action: str | None,
           end: float) -> Usage:
    """Count the turn on ``model``; the usage that side's cache gives it."""
    tally.turns += 1
    tally.switches += action == Action.SWITCH.value
    tally.locked += action == Action.LOCKED_KEEP.value
    tally.unsafe += world.unsafe(record, model)
    usage, cost = world.served(record, model, end)
    tally.cost_usd += cost
    return usage


def _latency(record: Record) -> float:
    return float((record.get("outcome") or {}).get("latency_ms") or 0) / 1000


def _request(record: Record) -> RequestSummary:
    """The request as far as the record tells: counts stand in for what they counted."""
    request = record.get("request") or {}
    results = int(request.get("tool_results") or 0)
    return RequestSummary(
        api=Api(request.get("api", Api.CHAT.value)),
        model=str(request.get("model", "")),
        stream=bool(request.get("stream")),
        message_count=int(request.get("messages") or 0),
        context_tokens=int(request.get("context_tokens") or 0),
        tools_offered=tuple(f"tool-{i}" for i in range(int(request.get("tools_offered") or 0))),
        tool_results=results,
        previous_response_id=request.get("previous_response_ref"),
        provider_state=tuple(f"state-{i}" for i in range(
            int(request.get("provider_state_items") or 0))),
    )


def _identity(record: Record) -> SessionIdentity:
    session = record.get("session") or {}
    return SessionIdentity(str(session.get("tenant") or "anonymous"), session.get("id"),
                           session.get("source"), session.get("parent"),
                           bool(session.get("final")), bool(session.get("compaction")))


def _owner_keys(summary: RequestSummary, identity: SessionIdentity) -> tuple[str, ...]:
    ids = [summary.previous_response_id] if summary.previous_response_id else []
    return tuple(owner_key(identity.tenant, i) for i in ids)


def report(diffs: list[SessionDiff], missing: Iterable[str] = ()) -> dict[str, Any]:
    """Per session and in total, the recording beside the what-if."""
    total = SessionDiff("total")
    for diff in diffs:
        total.recorded.add(diff.recorded)
        total.what_if.add(diff.what_if)
        total.changed += diff.changed

    def line(diff: SessionDiff) -> dict[str, Any]:
        return {"session": diff.session, "recorded": diff.recorded.as_dict(),
                "what_if": diff.what_if.as_dict(), "changed_turns": diff.changed}

    return {"sessions": [line(d) for d in diffs], "total": line(total),
            "missing_decisions": sorted(missing)}


def table(summary: dict[str, Any]) -> str:
    columns = ("switches", "locked", "unsafe", "refused", "cost_usd")
    head = ["session", "turns", "changed",
            *(f"{c} (rec → what-if)" for c in columns)]
    rows = [head]
    for line in [*summary["sessions"], summary["total"]]:
        before, after = line["recorded"], line["what_if"]
        cells = [line["session"], str(before["turns"]), str(line["changed_turns"])]
        for column in columns:
            fmt = "{:.5f}" if column == "cost_usd" else "{}"
            cells.append(f"{fmt.format(before[column])} → {fmt.format(after[column])}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    if summary["missing_decisions"]:
        text += ("\ndecisions the recording matched that the new config lacks (replayed as "
                 f"unmatched): {', '.join(summary['missing_decisions'])}")
    return text


def what_if(records: list[Record], config: Config) -> dict[str, Any]:
    replay = WhatIf(config)
    return report(replay.run(records), replay.selector.missing)

