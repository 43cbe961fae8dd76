"""``saar replay what-if`` on records the live router made in process: the same config changes
nothing, and each knob changes what it should (locks, prices, missing decisions)."""

from __future__ import annotations

from dataclasses import replace

import orjson

from extproc.assembly import assemble
from extproc.config import Config, Pricing
from extproc.core.router import LocalDriver
from extproc.dev.evaluation.policies import policy_config
from extproc.dev.whatif import table, what_if
from extproc.types import Api, ResponseSummary, Usage
from tests.conftest import FakeClock

TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {}}}]
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]}


def _body(*messages: dict) -> bytes:
    return orjson.dumps({"model": "auto", "messages": list(messages), "tools": TOOLS})


def recorded(config: Config, *, estimated: bool = False) -> list[dict]:
    """A session: a hard task calls a tool; its result comes back beside a request to explain
    (a drift the tool lock holds), then a light follow-up. ``estimated``: the answers report
    no usage (streams whose client did not ask for it), so the records hold estimates."""
    clock = FakeClock()
    parts = assemble(config, clock=clock)
    driver = LocalDriver(parts.router)
    headers = {"x-session-id": "w1", "authorization": "Bearer k"}
    ask = {"role": "user", "content": "Refactor the parser, then run the tests."}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "12 passed"}
    explain = {"role": "user", "content": "Also explain the failing case."}
    usage = None if estimated else Usage(prompt_tokens=900, completion_tokens=40,
                                         cached_tokens=0)
    steps = [
        (_body(ask), ResponseSummary(status=200, tool_call_ids=["call_1"],
                                     tool_names=["run_tests"], usage=usage)),
        (_body(ask, CALL, result, explain), ResponseSummary(status=200, usage=usage)),
        (_body(ask, CALL, result, explain, {"role": "assistant", "content": "done"},
               {"role": "user", "content": "Summarise the change for the changelog."}),
         ResponseSummary(status=200, usage=usage)),
    ]
    for raw, answer in steps:
        answer.output_chars, answer.finish_reason = 160, "stop"
        routed = driver.route(Api.CHAT, headers, raw)
        clock.advance(1.5)
        driver.respond(routed, answer)
        clock.advance(3.0)
    return parts.replay.for_session("w1")


def test_the_same_config_decides_every_turn_the_same(config):
    records = recorded(config)
    assert [r["action"] for r in records] == ["new", "locked_keep", "switch"]
    total = what_if(records, config)["total"]
    assert total["changed_turns"] == 0
    assert total["recorded"] == total["what_if"]


def test_without_the_tool_lock_the_drift_takes_the_tool_results_away(config):
    records = recorded(config)
    summary = what_if(records, policy_config(config, "no_tool_lock"))
    before, after = summary["total"]["recorded"], summary["total"]["what_if"]
    assert (before["unsafe"], after["unsafe"]) == (0, 1)
    assert (before["locked"], after["locked"]) == (1, 0)
    assert summary["total"]["changed_turns"] == 1
    assert "0 → 1" in table(summary)


def test_prices_change_the_cost_and_missing_decisions_are_named(config):
    records = recorded(config)
    dear = {name: replace(model, pricing=Pricing(prompt=30.0, cached_input=3.0, completion=90.0))
            for name, model in config.models.items()}
    costly = what_if(records, replace(config, models=dear))["total"]
    cheap = what_if(records, config)["total"]
    # Both sides are priced by the config tried: the recording's decisions at its prices.
    assert costly["recorded"]["cost_usd"] == costly["what_if"]["cost_usd"]
    assert costly["what_if"]["cost_usd"] > 9 * cheap["what_if"]["cost_usd"]
    kept = tuple(d for d in config.routing.decisions if d.name != "light_tasks")
    fewer = replace(config, routing=replace(config.routing, decisions=kept))
    summary = what_if(records, fewer)
    assert summary["missing_decisions"] == ["light_tasks"]
    assert summary["total"]["what_if"]["switches"] == 0, "no drift without the light decision"


def test_estimated_usage_is_replayed_as_the_live_memory_kept_it(config):
    """An estimate (its cache unknown) was never the engine's report: the live memory kept no
    usage of it, and neither does the replay."""
    records = recorded(config, estimated=True)
    assert {r["outcome"]["usage"]["source"] for r in records} == {"estimated"}
    assert {r["outcome"]["usage"]["completion_tokens"] for r in records} == {40}
    total = what_if(records, config)["total"]
    assert total["changed_turns"] == 0
    assert total["recorded"] == total["what_if"]
