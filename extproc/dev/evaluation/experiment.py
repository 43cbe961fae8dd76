"""The vLLM Semantic Router's agentic-routing experiment, driven through our live router.

Their script (``bench/agentic_routing_experiment.py``, Apache-2.0, standard library only) is
loaded from the path the user gives and never copied: its ``simulate_workload`` generates the
turns (their seeds, their order), each turn goes to our ``Router`` as a real Responses request,
and its ``summarize`` judges the models we served, priced by its ``turn_cost`` and
``cached_ratio_for``. Their rows keep their single-turn baseline; only the served-model columns
are ours. The harness sends one of their sessions as an agent would:

* every turn names the session (``x-session-id``) and the tier of their demand score
  (``x-demand-tier``: the model their ``choose_base_model`` picks), and resends the conversation:
  ``PROMPT_BASE`` + ``history_tokens`` tokens, as their prompt counts;
* ``tool_loop``: the previous answer called a tool, the request carries its output;
* ``provider_state``: chained on the previous answer by ``previous_response_id``, new items only;
* ``topic_drift``: the user starts a new task ("New task: ...", a content signal);
* ``idle_expired``: the turn comes ``IDLE_GAP_SECONDS`` after the previous one, else
  ``TURN_GAP_SECONDS``.

The answer reports the usage their cost model charges: their cache estimate as cached tokens, so
the router sees the cache the judge prices. Their judge starts every session "on" their first
model (a first turn elsewhere counts as a switch); we judge ours the same way.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import xxhash
from pydantic import ValidationError

from ...config import Config, SessionAware, load_config
from ...core.router import LocalDriver
from ...types import Api, ResponseSummary, Usage
from .experiment_report import report
from .policies import build
from .runner import VirtualClock
from .workloads import filler

CONFIG_PATH = Path(__file__).with_name("experiment.yaml")
PROMPT_BASE = 800
"""Tokens their ``simulate_workload`` prices on top of a turn's ``history_tokens``."""
TURN_GAP_SECONDS = 20.0
IDLE_GAP_SECONDS = 600.0
"""Past our 300 s idle timeout, short of the session TTL."""
REQUIRED = ("MODELS", "SCENARIOS", "DEFAULT_SCENARIOS", "simulate_workload", "summarize",
            "cached_ratio_for", "turn_cost")
TIERS = ("light", "mid", "frontier")
"""``x-demand-tier`` of their models, in their ``MODELS`` order (cheapest first)."""
THEIR_POLICIES = ("acr-full", "acr-no-tool-lock")
OUR_POLICIES = ("single_turn", "saar", "no_tool_lock", "no_step_down_pricing")
NEW_TASK = "New task: take the next item of the backlog."
CARRY_ON = "Go on with the current task."
"""What the user asks after the pasted context (the router reads the end of the turn)."""
TOOL = "run_shell"
_TOOLS = orjson.dumps([{"type": "function", "name": TOOL, "description": "Run a shell command",
                        "parameters": {"type": "object", "properties": {}}}])

Row = dict[str, Any]


class ExperimentError(ValueError):
    """The run cannot be made as asked: their script is missing or no longer has what the run
    relies on, or it has no such scenario."""


def load_script(path: str | Path) -> ModuleType:
    """Their module, imported from ``path`` (it stays where the user keeps it)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location("semantic_router_experiment", path)
    if not path.is_file() or spec is None or spec.loader is None:
        raise ExperimentError(f"{path}: no such Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # their dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise ExperimentError(f"{path} lacks {', '.join(missing)}: not their experiment script")
    return module


def experiment_config(script: ModuleType, knobs: Mapping[str, Any]) -> Config:
    """Our mapping config, checked against their models, with ``knobs`` (their scenario's
    remaining-turn prior, the user's settings) in every decision's SAAR block."""
    config = load_config(CONFIG_PATH)
    for profile in script.MODELS:
        ours = config.models.get(profile.name)
        price = None if ours is None else ours.pricing
        if price is None or (price.prompt, price.cached_input, price.completion) != (
            profile.prompt_per_1m, profile.cached_per_1m, profile.completion_per_1m
        ):
            raise ExperimentError(f"their model {profile.name} is not priced as {CONFIG_PATH.name}")
    decisions = tuple(
        replace(d, algorithm=replace(d.algorithm, session_aware=replace(
            d.algorithm.session_aware, **knobs)))
        for d in config.routing.decisions
    )
    return replace(config, routing=replace(config.routing, decisions=decisions))


@dataclass(frozen=True, slots=True)
class Judge:
    """Their cost and quality model, applied to a served model (their functions, by name)."""

    script: ModuleType

    def profile(self, name: str) -> Any:
        return next(m for m in self.script.MODELS if m.name == name)

    def tokens(self, row: Row) -> tuple[int, int]:
        """The turn's prompt and completion tokens. Their rows keep only the rounded demand
        the completion is drawn from, so the completion is read back from the baseline's
        uncached price, which is exact to the token."""
        prompt = PROMPT_BASE + int(row["history_tokens"])
        price = self.profile(row["baseline_model"])
        completion = round((float(row["baseline_cost"]) * 1e6 - prompt * price.prompt_per_1m)
                           / price.completion_per_1m)
        if round(self.cost(row["baseline_model"], prompt, 0.0, completion), 8) != float(
            row["baseline_cost"]
        ):
            raise ExperimentError("their baseline cost no longer follows from their turn_cost")
        return prompt, completion

    def cached_ratio(self, model: str, row: Row, switched: bool) -> float:
        return float(self.script.cached_ratio_for(
            self.profile(model), row["phase"], int(row["history_tokens"]), switched))

    def cost(self, model: str, prompt: int, ratio: float, completion: int) -> float:
        return float(self.script.turn_cost(self.profile(model), prompt, ratio, completion))

    def usage(self, row: Row, model: str, previous: str) -> Usage:
        """What ``model`` reports serving turn ``row``: their tokens, their cache estimate."""
        prompt, completion = self.tokens(row)
        ratio = self.cached_ratio(model, row, model != previous)
        return Usage(prompt, completion, int(prompt * ratio))

    def served(self, row: Row, model: str, previous: str, reason: str) -> Row:
        """``row`` with the served-model columns theirs fill for their policy, for ``model``."""
        switched = model != previous
        prompt, completion = self.tokens(row)
        ratio = self.cached_ratio(model, row, switched)
        phase = row["phase"]
        return {
            **row,
            "remaining_turns_estimate": "",
            "continuation_mass": "",
            "prior_mass": "",
            "agentic_model": model,
            "agentic_switch": switched,
            "tool_loop_switch_violation_agentic": phase == "tool_loop" and switched,
            "context_portability_violation_agentic": phase == "provider_state" and switched,
            "agentic_drift_switch": phase == "topic_drift" and switched,
            "cached_prompt_ratio": round(ratio, 4),
            "agentic_quality": self.profile(model).quality,
            "agentic_cost": round(self.cost(model, prompt, ratio, completion), 8),
            "policy_reason": reason,
        }

    def symmetric(self, rows: Iterable[Row]) -> list[Row]:
        """``rows`` with the baseline priced by their cache estimate too (theirs prices it
        uncached, which every policy's cost reduction then inherits)."""
        out = []
        for row in rows:
            prompt, completion = self.tokens(row)
            model = row["baseline_model"]
            ratio = self.cached_ratio(model, row, bool(row["baseline_switch"]))
            out.append({**row, "baseline_cost": self.cost(model, prompt, ratio, completion)})
        return out

    def check(self, rows: Iterable[Row]) -> None:
        """Our use of their costing reproduces the cost they booked for their own policy."""
        previous = ""
        for row in rows:
            if row["turn"] == 0:
                previous = self.script.MODELS[0].name
            again = self.served(row, row["agentic_model"], previous, "")
            if again["agentic_cost"] != row["agentic_cost"]:
                raise ExperimentError(f"their cost of {row['session_id']} turn {row['turn']} "
                                  "differs from ours of the same turn")
            previous = row["agentic_model"]


class Conversation:
    """One of their sessions as a harness sends it: Responses bodies, one growing history."""

    def __init__(self, session_id: str, tenant: str, tiers: Mapping[str, str]) -> None:
        self.session_id = session_id
        self._tiers = tiers
        self._rng = random.Random(session_id)
        self._headers = {
            ":method": "POST", ":path": "/v1/responses", "content-type": "application/json",
            "authorization": f"Bearer sk-{tenant}", "x-session-id": session_id,
        }
        self._system = orjson.dumps(filler(self._rng, PROMPT_BASE - len(_TOOLS) // 4 - 16))
        self._items: list[bytes] = []
        self._tokens = 0
        self._mark = 0
        self._calls: list[str] = []
        self._response_id: str | None = None

    def request(self, row: Row) -> tuple[dict[str, str], bytes]:
        """The headers and body of turn ``row``."""
        grow = max(8, int(row["history_tokens"]) - self._tokens)
        if row["phase"] == "tool_loop" and self._calls:
            for call in self._calls:
                output = filler(self._rng, grow // len(self._calls))
                self._add({"type": "function_call_output", "call_id": call, "output": output})
        else:
            ask = NEW_TASK if row["phase"] == "topic_drift" else CARRY_ON
            text = f"{filler(self._rng, grow)}\n\n{ask}"
            content = [{"type": "input_text", "text": text}]
            self._add({"type": "message", "role": "user", "content": content})
        headers = {**self._headers, "x-demand-tier": self._tiers[row["baseline_model"]]}
        if row["phase"] == "provider_state" and self._response_id is not None:
            head = b'{"model":"auto","store":true,"previous_response_id":' + orjson.dumps(
                self._response_id)
            return headers, _body(head, self._items[self._mark:])
        head = b'{"model":"auto","store":true,"instructions":' + self._system
        return headers, _body(head, self._items)

    def answer(self, row: Row, model: str, calls: bool, usage: Usage) -> ResponseSummary:
        """``model``'s answer to turn ``row`` (a tool call when ``calls``), added to the
        history as the harness would."""
        key = f"{model}/{self.session_id}/{row['turn']}"
        self._response_id = f"resp_{xxhash.xxh3_64_hexdigest(key.encode())}"
        self._calls = [f"call_{xxhash.xxh3_64_hexdigest(key.encode(), seed=1)}"] if calls else []
        for call in self._calls:
            self._add({"type": "function_call", "call_id": call, "name": TOOL, "arguments": "{}"})
        if not calls:
            text = filler(self._rng, usage.completion_tokens)
            content = [{"type": "output_text", "text": text}]
            self._add({"type": "message", "role": "assistant", "content": content})
        self._mark = len(self._items)
        return ResponseSummary(
            status=200, model=model, response_id=self._response_id,
            tool_call_ids=list(self._calls), tool_names=[TOOL] * len(self._calls), usage=usage,
            finish_reason="tool_calls" if calls else "stop",
        )

    def _add(self, item: Mapping[str, Any]) -> None:
        raw = orjson.dumps(item)
        self._items.append(raw)
        self._tokens += len(raw) // 4


def _body(head: bytes, items: list[bytes]) -> bytes:
    return head + b',"input":[' + b",".join(items) + b'],"tools":' + _TOOLS + b"}"


def sessions(rows: Iterable[Row]) -> Iterator[list[Row]]:
    """Their rows grouped by session, in their order."""
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row["session_id"]].append(row)
    yield from grouped.values()


def play(
    script: ModuleType, policy: str, rows: list[Row], tenant: str, knobs: Mapping[str, Any]
) -> list[Row]:
    """Their turns of one scenario and seed through one fresh router running ``policy``."""
    judge = Judge(script)
    clock = VirtualClock()
    parts = build(experiment_config(script, knobs), policy, clock)
    driver = LocalDriver(parts.router)
    tiers = {m.name: tier for m, tier in zip(script.MODELS, TIERS, strict=True)}
    out = []
    for turns in sessions(rows):
        conversation = Conversation(turns[0]["session_id"], tenant, tiers)
        previous = script.MODELS[0].name
        for index, row in enumerate(turns):
            clock.advance(IDLE_GAP_SECONDS if row["idle_expired"] else TURN_GAP_SECONDS)
            headers, raw = conversation.request(row)
            routed = driver.route(Api.RESPONSES, headers, raw)
            record = parts.replay.get(routed.replay_id) or {}
            out.append(judge.served(row, routed.model, previous, record.get("reason", "")))
            calls = index + 1 < len(turns) and turns[index + 1]["phase"] == "tool_loop"
            usage = judge.usage(row, routed.model, previous)
            driver.respond(routed, conversation.answer(row, routed.model, calls, usage))
            previous = routed.model
    return out


@dataclass(frozen=True, slots=True)
class Spec:
    script: str
    seeds: tuple[int, ...] = (20260530, 20260531, 20260532, 20260533, 20260534)
    """Their ``--matrix`` defaults."""
    sessions: int = 40
    turns: int = 18
    scenarios: tuple[str, ...] | None = None
    """None: their ``DEFAULT_SCENARIOS``."""
    policies: tuple[str, ...] = OUR_POLICIES
    knobs: tuple[tuple[str, Any], ...] = ()
    """SAAR knobs set in every decision, over the scenario's ``remaining_turn_prior``."""

    def knobs_for(self, workload: Any) -> dict[str, Any]:
        return {"remaining_turn_prior": float(workload.remaining_turn_prior), **dict(self.knobs)}


def their_rows(script: ModuleType, spec: Spec, scenario: str, policy: str) -> list[Row]:
    workload = script.SCENARIOS[scenario]
    return [row for seed in spec.seeds for row in script.simulate_workload(
        spec.sessions, spec.turns, seed, workload, agentic_policy=policy)]


def run_piece(spec: Spec, scenario: str, policy: str) -> list[Row]:
    """One of our policies on one of their scenarios, every seed."""
    script = load_script(spec.script)
    workload = script.SCENARIOS[scenario]
    out = []
    for seed in spec.seeds:
        rows = script.simulate_workload(spec.sessions, spec.turns, seed, workload)
        out += play(script, policy, rows, f"{scenario}-{seed}", spec.knobs_for(workload))
    return out


def run_experiment(spec: Spec, jobs: int = 1) -> dict[str, Any]:
    """Their policies and ours on their workload, all judged by their ``summarize``."""
    script = load_script(spec.script)
    judge = Judge(script)
    scenarios = spec.scenarios or tuple(script.DEFAULT_SCENARIOS)
    unknown = [s for s in scenarios if s not in script.SCENARIOS]
    if unknown:
        raise ExperimentError(f"no scenario {', '.join(unknown)} in {spec.script}; theirs: "
                              f"{', '.join(sorted(script.SCENARIOS))}")
    try:
        replace(SessionAware(), **dict(spec.knobs))
    except (TypeError, ValidationError) as error:
        raise ExperimentError(f"knobs {dict(spec.knobs)}: {error}") from None
    theirs = {p: {s: their_rows(script, spec, s, p) for s in scenarios} for p in THEIR_POLICIES}
    for rows in theirs["acr-full"].values():
        judge.check(rows)
    pieces = [(p, s) for p in spec.policies for s in scenarios]
    args = ([spec] * len(pieces), [s for _, s in pieces], [p for p, _ in pieces])
    if jobs <= 1:
        played = list(map(run_piece, *args))
    else:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            played = list(pool.map(run_piece, *args))
    ours: dict[str, dict[str, list[Row]]] = defaultdict(dict)
    for (policy, scenario), rows in zip(pieces, played, strict=True):
        ours[policy][scenario] = rows
    return report(judge, scenarios, theirs, dict(ours))
