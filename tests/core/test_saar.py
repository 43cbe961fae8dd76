"""The SAAR engine through the sans-IO router: requests in, decisions and memory out."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from extproc.assembly import assemble
from extproc.config import Config
from extproc.core.router import LocalDriver
from extproc.core.saar import remaining_turns
from extproc.errors import ModelUnavailable, UnknownModel
from extproc.state.records import Forget
from extproc.types import Api, ResponseSummary, Usage

CHEAP, STRONG = "qwen3-8b", "qwen3-32b"
HARD = "Please refactor the storage layer"


def chat(text: str | None = None, results: tuple[str, ...] = (), context_chars: int = 0,
         tool_output: str = "ok") -> bytes:
    messages = [{"role": "system", "content": "x" * context_chars}] if context_chars else []
    if text is not None:
        messages.append({"role": "user", "content": text})
    if results:
        messages.append({"role": "assistant", "tool_calls": [{"id": r} for r in results]})
        messages += [{"role": "tool", "tool_call_id": r, "content": tool_output}
                     for r in results]
    return orjson.dumps({"model": "auto", "messages": messages})


class Driver:
    """Plays the upstream: every routed request is answered like the gRPC adapter reports it."""

    def __init__(self, config: Config, clock) -> None:
        self.parts = assemble(config, clock=clock)
        self.router = self.parts.router
        self.local = LocalDriver(self.router)
        self.clock = clock

    def send(self, body: bytes, session: str | None = "s1", status: int = 200,
             api: Api = Api.CHAT, parent: str | None = None, **response):
        headers = {"authorization": "Bearer k"}
        if session:
            headers["x-session-id"] = session
        if parent:
            headers["x-parent-session-id"] = parent
        routed = self.local.route(api, headers, body)
        self.local.respond(routed, ResponseSummary(status=status, model=routed.model, **response))
        self.clock.advance(5)
        return routed

    def record(self, routed):
        return self.parts.replay.get(routed.replay_id)


def session_key(driver: Driver, routed) -> str:
    session = driver.record(routed)["session"]
    return f"{session['tenant']}/{session['id']}"


@pytest.fixture
def driver(session_config, clock) -> Driver:
    return Driver(session_config, clock)


def test_new_session_follows_base_choice(driver):
    routed = driver.send(chat(HARD))
    assert routed.model == STRONG
    assert routed.diagnostics.action == "new"
    assert routed.diagnostics.decision == "hard_engineering"
    assert orjson.loads(routed.body)["model"] == STRONG
    assert routed.cluster == STRONG


def test_tool_loop_lock_beats_a_cheaper_base_choice(driver):
    driver.send(chat(HARD), tool_call_ids=["call_1"])
    # The tool output reads as a new, cheap task; its result still belongs to STRONG.
    routed = driver.send(chat(results=("call_1",), tool_output="summarise: 3 files changed"))
    rec = driver.record(routed)
    assert routed.model == STRONG
    assert (rec["action"], rec["lock"], rec["phase"]) == ("locked_keep", "tool_loop", "tool_loop")
    assert rec["base"]["model"] == CHEAP


def test_tool_loop_lock_holds_without_a_session_id(driver):
    driver.send(chat(HARD), session=None, tool_call_ids=["call_x"])
    routed = driver.send(chat("ok", results=("call_x",)), session=None)
    assert routed.model == STRONG
    assert driver.record(routed)["reason"] == "tool_loop_lock"


def test_tool_loop_lock_holds_after_memory_loss(driver):
    first = driver.send(chat(HARD), tool_call_ids=["call_y"])
    driver.local.store.apply_now([Forget(session_key(driver, first))], driver.clock())
    assert len(driver.local.store) == 0
    routed = driver.send(chat("ok", results=("call_y",)))
    assert routed.model == STRONG


def test_provider_state_lock_on_previous_response_id(driver):
    body = orjson.dumps({"model": "auto", "input": HARD})
    driver.send(body, api=Api.RESPONSES, response_id="resp_1")
    follow = orjson.dumps({"model": "auto", "input": "go on", "previous_response_id": "resp_1"})
    routed = driver.send(follow, api=Api.RESPONSES, session="another-session")
    assert routed.model == STRONG
    assert driver.record(routed)["lock"] == "provider_state"


def test_failed_upstream_is_not_committed(driver):
    driver.send(chat(HARD))
    driver.clock.advance(400)  # idle: the next turn may reselect
    failed = driver.send(chat("summarise the day"), status=503)
    assert failed.model == CHEAP
    state = driver.local.session(session_key(driver, failed))
    assert state.model == STRONG
    assert state.switches == 0


def test_locked_model_down_answers_503_then_resumes(driver, clock):
    driver.send(chat(HARD), tool_call_ids=["call_z"])
    for _ in range(3):  # three 5xx take the model out for the cooldown
        driver.parts.health.record(STRONG, 503)
    with pytest.raises(ModelUnavailable) as info:
        driver.local.route(Api.CHAT, {"x-session-id": "s1", "authorization": "Bearer k"},
                           chat("ok", results=("call_z",)))
    assert info.value.status == 503 and info.value.retry_after >= 1
    assert "locked to qwen3-32b" in info.value.message
    clock.advance(10)
    assert driver.send(chat("ok", results=("call_z",))).model == STRONG


def test_unlocked_session_fails_over(driver):
    driver.send(chat(HARD))
    for _ in range(3):
        driver.parts.health.record(STRONG, 503)
    routed = driver.send(chat("and now?"))
    assert routed.model == CHEAP
    assert driver.record(routed)["reason"] == "failover"


def test_idle_reset_reopens_selection(driver):
    driver.send(chat(HARD, context_chars=400_000))
    driver.clock.advance(301)
    # Warm and long, yet after the idle boundary the base choice is taken without pricing.
    routed = driver.send(chat("continue", context_chars=400_000))
    rec = driver.record(routed)
    assert (rec["reset"], rec["phase"], routed.model) == ("idle", "idle_reset", CHEAP)
    assert rec["base"]["decision"] == "long_context"


def test_unsignalled_follow_up_is_not_drift(driver):
    driver.send(chat(HARD))
    routed = driver.send(chat("continue"))
    rec = driver.record(routed)
    assert rec["reset"] is None
    assert rec["decision"] == rec["base"]["decision"] == "hard_engineering"
    assert rec["base"]["matched"] is False


def test_drift_reset_on_a_new_matched_decision(driver):
    driver.send(chat(HARD))
    routed = driver.send(chat("summarise what we did"))
    rec = driver.record(routed)
    assert (rec["reset"], rec["action"], routed.model) == ("drift", "switch", CHEAP)


@pytest.mark.parametrize(
    ("warm_chars", "turns", "expected"),
    [
        (4_000, 1, CHEAP),     # young session with little cached: the switch is cheap, taken
        (400_000, 6, STRONG),  # long warm session on the strong model: too dear to leave
    ],
)
def test_switch_pricing_is_asymmetric(driver, warm_chars, turns, expected):
    for _ in range(turns):
        driver.send(chat(HARD, context_chars=warm_chars))
    # Past 24k tokens the request matches long_context (cheap tier): a shape change, no drift.
    routed = driver.send(chat("continue", context_chars=400_000))
    rec = driver.record(routed)
    assert (rec["reset"], rec["base"]["decision"]) == (None, "long_context")
    assert routed.model == expected, rec["candidates"]
    cheap = next(c for c in rec["candidates"] if c["model"] == CHEAP)
    assert cheap["transition_usd"] > 0


def tuned(config: Config, **knobs) -> Config:
    """``config`` with ``knobs`` set in every decision's SAAR block."""
    decisions = tuple(
        replace(d, algorithm=replace(d.algorithm, session_aware=replace(
            d.algorithm.session_aware, **knobs)))
        for d in config.routing.decisions
    )
    return replace(config, routing=replace(config.routing, decisions=decisions))


def test_switch_pricing_off_switches_the_warm_session(session_config, clock):
    driver = Driver(tuned(session_config, switch_pricing=False), clock)
    for _ in range(6):
        driver.send(chat(HARD, context_chars=400_000))
    assert driver.send(chat("continue", context_chars=400_000)).model == CHEAP


# A session warm on the strong model for one turn (about 1k tokens), then a 100k-token turn
# whose base choice is the cheap model (long_context: a shape change, no drift). Moving down
# saves ~2.78 price units a token per remaining turn; it risks, with the chance that a remaining
# turn needs the strong model, 0.6 of fit (2 × its 0.3 quality gap) at 3.00 / 0.35 a token.
@pytest.mark.parametrize(
    ("knobs", "expected", "reason"),
    [
        ({}, CHEAP, "switch_priced"),                         # 1 turn to save on, risk 0.3
        ({"return_rate": 1.0}, STRONG, "step_down_held"),      # that turn surely needs it
        ({"remaining_turn_prior": 1.0}, STRONG, "step_down_held"),  # no turns remain
        ({"remaining_turn_prior": 10.0, "return_rate": 1.0}, CHEAP, "switch_priced"),  # 9 remain
        ({"return_rate": 1.0, "step_down_pricing": False}, CHEAP, "switch_priced"),
        ({"return_rate": 1.0, "switch_pricing": False}, CHEAP, "switch_priced"),
    ],
)
def test_a_step_down_must_pay_for_itself(session_config, clock, knobs, expected, reason):
    driver = Driver(tuned(session_config, **knobs), clock)
    driver.send(chat(HARD, context_chars=4_000))
    routed = driver.send(chat("continue", context_chars=400_000))
    rec = driver.record(routed)
    assert (rec["base"]["model"], rec["reset"]) == (CHEAP, None)
    assert (routed.model, rec["reason"]) == (expected, reason), rec["candidates"]
    strong = next(c for c in rec["candidates"] if c["model"] == STRONG)
    assert (strong["held"], strong["saving_usd"], strong["risk_usd"]) == (False, 0.0, 0.0)


def test_step_down_terms_in_the_record(session_config, clock):
    driver = Driver(tuned(session_config, return_rate=0.5, remaining_turn_prior=4.0), clock)
    driver.send(chat(HARD, context_chars=4_000))
    rec = driver.record(driver.send(chat("continue", context_chars=400_000)))
    cheap = next(c for c in rec["candidates"] if c["model"] == CHEAP)
    ctx, warm = rec["request"]["context_tokens"], rec["memory"]["context_tokens"]
    cached = warm / ctx
    per_token = (1 - cached) * (3.00 - 0.20) + cached * (0.30 - 0.02)
    assert cheap["remaining_turns"] == 3.0  # a prior of 4 turns after the first, 1 run
    assert cheap["saving_usd"] == pytest.approx(3 * ctx * per_token / 1e6, rel=1e-4)
    assert cheap["risk_usd"] == pytest.approx((1 - 0.5**3) * 0.6 * ctx * 3.00 / 0.35 / 1e6,
                                              rel=1e-4)
    assert cheap["held"] is (cheap["saving_usd"] <= cheap["transition_usd"] + cheap["risk_usd"])


# An idle boundary on the strong model, then a 100k-token turn whose base choice is the cheap
# one: nothing is cached any more, so the step-down pays only its risk.
@pytest.mark.parametrize(
    ("knobs", "expected", "reason", "action"),
    [
        ({}, CHEAP, "idle_reset", "switch"),
        ({"return_rate": 1.0}, STRONG, "idle_reset_held", "keep"),
        ({"remaining_turn_prior": 1.0}, STRONG, "idle_reset_held", "keep"),
        ({"return_rate": 1.0, "step_down_pricing": False}, CHEAP, "idle_reset", "switch"),
    ],
)
def test_an_idle_step_down_pays_its_quality_risk(session_config, clock, knobs, expected, reason,
                                                 action):
    driver = Driver(tuned(session_config, **knobs), clock)
    driver.send(chat(HARD, context_chars=400_000))
    clock.advance(301)
    routed = driver.send(chat("continue", context_chars=400_000))
    rec = driver.record(routed)
    assert (rec["reset"], rec["phase"]) == ("idle", "idle_reset")
    assert (routed.model, rec["reason"], rec["action"]) == (expected, reason, action)


def test_physical_model_passes_through(driver):
    body = orjson.dumps({"model": CHEAP, "messages": [{"role": "user", "content": HARD}]})
    routed = driver.send(body)
    assert (routed.model, routed.body) == (CHEAP, None)
    assert driver.record(routed)["reason"] == "physical_model"


def test_unknown_model_is_404(driver):
    body = orjson.dumps({"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(UnknownModel) as info:
        driver.send(body)
    assert info.value.status == 404


def test_replay_record_has_outcome_and_cache_evidence(driver):
    routed = driver.send(chat(HARD), usage=Usage(100, 10, 60), finish_reason="stop")
    rec = driver.record(routed)
    assert rec["outcome"]["usage"] == {"prompt_tokens": 100, "completion_tokens": 10,
                                       "cached_tokens": 60, "source": "engine"}
    assert rec["outcome"]["finish_reason"] == "stop"
    assert "storage" not in orjson.dumps(rec).decode()  # content-free
    assert driver.parts.replay.for_session("s1")[0]["replay_id"] == routed.replay_id


def test_session_final_releases_memory(driver):
    headers = {"x-session-id": "fin", "x-dynamo-session-final": "true"}
    router, store = driver.router, driver.local.store
    routed = driver.local.route(Api.CHAT, headers, chat(HARD))
    store.apply_now(router.answered(routed, 200), driver.clock())
    assert len(store) == 1
    store.apply_now(router.ended(routed, None), driver.clock())
    assert len(store) == 0


def test_processor_writes_its_traffic_as_a_mooncake_trace(session_config, clock, tmp_path):
    from extproc.dev.clustersim.trace import read_trace

    path = tmp_path / "trace.jsonl"
    config = replace(session_config,
                     replay=replace(session_config.replay, mooncake_trace_path=str(path)))
    driver = Driver(config, clock)
    driver.send(chat(HARD, context_chars=8_000), usage=Usage(2_000, 40, 0))
    driver.send(chat(HARD, context_chars=8_000, results=("c",)), usage=Usage(2_050, 10, 1_990))
    driver.parts.close()
    first, second = read_trace(path)
    assert first.session_id == second.session_id and "s1" not in first.session_id
    assert (first.input_length, first.output_length) == (2_000, 40)
    # The second turn resends the first one's prompt: its leading block ids are the same.
    assert second.hash_ids[: len(first.hash_ids) - 1] == first.hash_ids[:-1]
    assert second.delay_ms == pytest.approx(5_000)
    assert "storage" not in path.read_text()


def test_an_answer_that_never_comes_is_not_committed(driver):
    """The client hung up before the upstream answered: the stream closes, nothing commits,
    and the replay record says so."""
    headers = {"x-session-id": "lost", "authorization": "Bearer k"}
    lost = driver.local.route(Api.CHAT, headers, chat(HARD))
    writes = driver.router.ended(lost, None, aborted=True)
    driver.local.store.apply_now(writes, driver.clock())
    assert driver.local.session(session_key(driver, lost)) is None
    assert driver.record(lost)["outcome"]["aborted"] is True


def test_replay_records_chain_and_show_the_memory_they_saw(driver):
    first = driver.send(chat(HARD), usage=Usage(1000, 10, 0))
    second = driver.send(chat("continue"), usage=Usage(1020, 10, 1000))
    memory = driver.record(second)["memory"]
    assert driver.record(first)["memory"] is None
    assert memory["previous_replay_id"] == first.replay_id
    assert (memory["turns"], memory["model"], memory["idle_s"]) == (1, STRONG, 5.0)
    assert memory["reported_prompt_tokens"] == 1000


def test_switch_pricing_uses_the_measured_prefix_on_the_candidates_workers(session_config, clock):
    def priced(config) -> dict:
        driver = Driver(config, clock)
        on_cheap = orjson.loads(chat(HARD, context_chars=400_000))
        on_cheap["model"] = CHEAP
        driver.send(orjson.dumps(on_cheap), session="other")  # a cheap worker now holds it
        driver.send(chat(HARD, context_chars=400_000))
        rec = driver.record(driver.send(chat("continue", context_chars=400_000)))
        cheap = next(c for c in rec["candidates"] if c["model"] == CHEAP)
        return {"transition": cheap["transition_usd"], "ctx": rec["request"]["context_tokens"]}

    pools = {name: replace(model, endpoints=(f"10.0.{i}.1:80", f"10.0.{i}.2:80"))
             for i, (name, model) in enumerate(session_config.models.items())}
    measured = priced(replace(session_config, models=pools))
    estimated = priced(replace(session_config, scheduling=replace(
        session_config.scheduling, enabled=False)))
    # The cheap model's worker already holds the prompt: its re-prefill term is gone.
    reprefill = estimated["ctx"] * (0.20 - 0.02) / 1e6
    assert estimated["transition"] - measured["transition"] == pytest.approx(reprefill, rel=0.05)


def test_a_session_that_outgrows_its_models_window_moves(session_config, clock):
    small = replace(session_config.models[CHEAP], context_window=8_000)
    driver = Driver(replace(session_config, models={**session_config.models, CHEAP: small}),
                    clock)
    assert driver.send(chat("summarise the day")).model == CHEAP
    # 12k tokens of context: the cheap model's 8k window no longer fits, whatever the price.
    routed = driver.send(chat("summarise it again", context_chars=48_000))
    rec = driver.record(routed)
    assert (routed.model, rec["reason"]) == (STRONG, "context_window")
    assert rec["base"]["scores"].keys() == {STRONG}


@pytest.mark.parametrize(("status", "down"), [(500, False), (400, False), (503, True),
                                              (502, True), (504, True), (529, True)])
def test_only_unavailability_takes_a_model_out(driver, status, down):
    """Issue 9 item 5: three 500s a caller provoked with bad requests take nothing down."""
    for _ in range(3):
        driver.parts.health.record(STRONG, status)
    assert driver.parts.health.available(STRONG) is not down


def test_a_context_no_model_fits_is_a_400_not_a_retryable_503(session_config, clock):
    """Issue 9 item 16: 503 + Retry-After makes SDKs retry forever; the context never fits."""
    from extproc.errors import ContextTooLong

    small = {n: replace(m, context_window=8_000) for n, m in session_config.models.items()}
    driver = Driver(replace(session_config, models=small), clock)
    driver.send(chat("summarise the day"))
    with pytest.raises(ContextTooLong) as info:
        driver.send(chat("summarise it again", context_chars=48_000))
    assert (info.value.status, info.value.code) == (400, "context_length_exceeded")
    assert info.value.retry_after is None


def test_facts_loaded_from_the_headers_cover_a_turn_continuing_the_last_answer(driver):
    """The prefetch (a load started at the request headers) serves the body only when every
    id the body carries was issued by the session's last answer: no owner lookup is missing."""

    headers = {"authorization": "Bearer k", "x-session-id": "s1"}
    driver.send(chat(HARD), tool_call_ids=["call_p"])
    query = driver.router.prefetch(headers)
    assert query is not None and query.session.endswith("/s1") and not query.ids
    facts = driver.local.store.load_now(query)
    router = driver.router
    answering = router.read(Api.CHAT, headers, chat("ok", results=("call_p",)))
    assert router.covers(answering, facts)
    foreign = router.read(Api.CHAT, headers, chat("ok", results=("call_elsewhere",)))
    assert not router.covers(foreign, facts)
    other_session = router.read(Api.CHAT, {**headers, "x-session-id": "s2"}, chat(HARD))
    assert not router.covers(other_session, facts)
    assert router.prefetch({"authorization": "Bearer k"}) is None  # only the body can tell


def test_holds_are_recorded_and_not_counted_as_loading(driver):
    import time as wall

    from extproc.core.journal import Held

    router, local = driver.router, driver.local
    request = router.read(Api.CHAT, {"x-session-id": "h"}, chat(HARD))
    facts = local.store.load_now(request.query)
    before = Held("large_body", request.started - 5.0, request.started)  # before the read
    wall.sleep(0.1)  # admission paused the session between the read and the route
    after = Held("paused", request.identified, wall.perf_counter())
    routed = router.route(request, facts, holds=[before, after])
    record = driver.record(routed)
    assert [h["kind"] for h in record["holds"]] == ["large_body", "paused"]
    timings = record["timings_us"]
    assert timings["held"] == pytest.approx(1e6 * (after.until - after.since + before.until
                                                    - before.since), rel=1e-3)
    assert 0 <= timings["load"] < 50_000, "the pause is the hold's time, not the load's"
    plain = router.route(router.read(Api.CHAT, {"x-session-id": "p"}, chat(HARD)), facts)
    assert driver.record(plain)["holds"] is None


# Claude Code's `--continue` (issue 16): a debugging run on the strong model (a tool loop, its
# ~13k-token system prompt and tools resent every turn, the backend reporting 12.7k of it
# cached), then the resumed run's first request. It carries no thinking blocks, so no provider
# state locks it, and its text matches the light decision: a drift reset. The reset lifts the
# stickiness, not the price of the warm prefix it would throw away.
CLAUDE_WARM = 12_700
CLAUDE_PROMPT = "You are Claude Code. " + "p" * 52_000  # about 13k tokens with the history


def claude(turns: list[dict], prompt: str = CLAUDE_PROMPT) -> bytes:
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.a1f; "
               "cc_entrypoint=sdk-cli;"}, {"type": "text", "text": prompt}]
    return orjson.dumps({"model": "auto", "max_tokens": 32_000, "system": system,
                         "messages": turns, "stream": True})


def claude_continue(driver: Driver, warm: int, prompt: str) -> dict:
    """The debugging run (3 turns, ``warm`` tokens of each reported cached), then the resumed
    run's first request; its replay record."""
    ask = {"role": "user", "content": "Debug the failing check"}
    call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "cat c"}}]}
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "check-42"}]}
    done = {"role": "assistant", "content": [{"type": "text", "text": "Fixed: check-42."}]}
    for turns, ids in (([ask], ["toolu_01"]), ([ask, call, result], []),
                       ([ask, call, result], [])):
        body = claude(turns, prompt)
        tokens = len(body) // 4
        driver.send(body, session="claude-run", api=Api.MESSAGES, tool_call_ids=ids,
                    usage=Usage(prompt_tokens=tokens, cached_tokens=min(warm, tokens)))
    resumed = [ask, call, result, done, {"role": "user", "content": "Explain the fix."}]
    routed = driver.send(claude(resumed, prompt), session="claude-run", api=Api.MESSAGES)
    return driver.record(routed)


@pytest.mark.parametrize(
    ("knobs", "warm", "prompt", "expected", "reason"),
    [
        # The case: 12.7k warm on 32b; 3 turns to save on, against a re-prefill of 12.7k on
        # 32b if it comes back and the quality risk: held.
        ({}, CLAUDE_WARM, CLAUDE_PROMPT, STRONG, "drift_reset_held"),
        # A small warm prefix (a 1.5k-token session) is cheap to rebuild: the reset moves it.
        ({}, 1_500, "You are a small agent. " + "p" * 5_000, CHEAP, "drift_reset"),
        # The price says so: a long session expected (40 turns) that rarely needs 32b again.
        ({"remaining_turn_prior": 40.0, "return_rate": 0.05}, CLAUDE_WARM, CLAUDE_PROMPT, CHEAP,
         "drift_reset"),
        # Step-down pricing off: the reset takes the base choice, as Semantic Router does.
        ({"step_down_pricing": False}, CLAUDE_WARM, CLAUDE_PROMPT, CHEAP, "drift_reset"),
        # Priced from the first token: the small session's move does not pay for itself either.
        ({"drift_reset_warm_tokens": 0}, 1_500, "You are a small agent. " + "p" * 5_000, STRONG,
         "drift_reset_held"),
    ],
)
def test_a_reset_does_not_throw_a_large_warm_prefix_away_unless_the_price_says_so(
        session_config, clock, knobs, warm, prompt, expected, reason):
    driver = Driver(tuned(session_config, **knobs), clock)
    rec = claude_continue(driver, warm, prompt)
    assert (rec["reset"], rec["phase"], rec["lock"]) == ("drift", "drift_reset", None)
    assert (rec["memory"]["model"], rec["base"]["model"]) == (STRONG, CHEAP)
    assert (rec["model"], rec["reason"]) == (expected, reason), rec["candidates"]
    assert rec["action"] == ("keep" if expected == STRONG else "switch")
    if rec["candidates"]:
        cheap = next(c for c in rec["candidates"] if c["model"] == CHEAP)
        assert cheap["held"] is (expected == STRONG)


# The remaining-turn estimate as a table: (prior, turns run, new task) → turns expected after
# this one. A prior is the length of a task of its decision: a drift reset (a new task) counts
# it from that turn, so a session that outlived its first task's prior is not taken for over.
# Without a prior (Lindy) the session's age is the evidence, new task or not.
@pytest.mark.parametrize(
    ("prior", "turns", "new_task", "expected"),
    [
        (7.0, 0, False, 7.0),
        (7.0, 3, False, 4.0),
        (7.0, 13, False, 0.0),   # past its prior: a step-down saves nothing
        (7.0, 13, True, 7.0),    # a new task at turn 13: the whole prior remains
        (7.0, 0, True, 7.0),
        (0.0, 0, False, 1.0),    # Lindy: at least one
        (0.0, 3, False, 3.0),
        (0.0, 3, True, 3.0),     # Lindy ignores the task: the session's age counts
        (0.0, 50, True, 8.0),    # up to the horizon
    ],
)
def test_remaining_turns(session_config, prior, turns, new_task, expected):
    knobs = replace(session_config.routing.decisions[0].algorithm.session_aware,
                    remaining_turn_prior=prior)
    assert knobs.remaining_turn_prior_horizon == 8
    assert remaining_turns(knobs, turns, new_task=new_task) == expected


# The `--continue` case with a remaining-turn prior: the drift reset opens a new task, so its
# step-down is priced over the prior's whole length, not over what the first task left of it
# (3 turns ran). With a prior of 16 and a 5% return rate: 16 turns save $0.0771 against the
# $0.0367 the move throws away and a risk of $0.0379, so it moves; counted from the session's
# first turn (13 left) it would save $0.0626 and be held, as it is with a prior of 12.
@pytest.mark.parametrize(
    ("prior", "expected", "reason"),
    [
        (16.0, CHEAP, "drift_reset"),
        (12.0, STRONG, "drift_reset_held"),
        (3.0, STRONG, "drift_reset_held"),  # the first task's prior, used up: still 3 ahead
    ],
)
def test_a_drift_reset_counts_its_decisions_prior_from_the_new_task(
        session_config, clock, prior, expected, reason):
    driver = Driver(tuned(session_config, remaining_turn_prior=prior, return_rate=0.05), clock)
    rec = claude_continue(driver, CLAUDE_WARM, CLAUDE_PROMPT)
    assert (rec["reset"], rec["memory"]["turns"], rec["base"]["model"]) == ("drift", 3, CHEAP)
    assert (rec["model"], rec["reason"]) == (expected, reason), rec["candidates"]
    cheap = next(c for c in rec["candidates"] if c["model"] == CHEAP)
    assert cheap["remaining_turns"] == prior
    assert cheap["held"] is (expected == STRONG)
    assert cheap["held"] is (cheap["saving_usd"] <= cheap["transition_usd"] + cheap["risk_usd"])


def _lead(scores) -> float:
    """0.5 + the margin of the best score over the next, clamped to 1 (one score: 1)."""
    ranked = sorted(scores, reverse=True)
    return min(1.0, 0.5 + (ranked[0] - ranked[1])) if len(ranked) > 1 else 1.0


def _base_lead(rec) -> float:
    return _lead(rec["base"]["scores"].values())


def _priced_lead(rec) -> float:
    return _lead(c["adjusted"] for c in rec["candidates"] if c["available"])


def _certain(rec) -> float:
    return 1.0


@pytest.mark.parametrize(("case", "then", "expected", "reason"), [
    ("new session", None, _base_lead, "new_session"),
    ("priced", chat("continue"), _priced_lead, "stay_priced"),
    ("drift reset", chat("summarise the changes"), _base_lead, "drift_reset"),
    ("tool loop lock", chat(results=("call_c",)), _certain, "tool_loop_lock"),
    ("physical model", orjson.dumps({"model": CHEAP, "messages": [
        {"role": "user", "content": "hi"}]}), _certain, "physical_model"),
])
def test_confidence_is_half_plus_the_leading_margin(driver, case, then, expected, reason):
    """``x-saar-confidence``: 0.5 + how far the best candidate leads the next (the base scores
    for a new session or a reset, the adjusted ones when priced), at most 1; 1 for a lock or a
    physical model asked for by name."""
    calls = ["call_c"] if case == "tool loop lock" else []
    routed = driver.send(chat(HARD), tool_call_ids=calls)
    if then is not None:
        routed = driver.send(then)
    rec = driver.record(routed)
    assert rec["reason"] == reason
    assert rec["confidence"] == pytest.approx(expected(rec), abs=1e-3)
    assert routed.diagnostics.confidence == f"{rec['confidence']:.3f}"
    assert 0.5 < rec["confidence"] < 1.0 or expected(rec) == 1.0


def pooled(config: Config) -> Config:
    """Two workers a model: the router measures what each model's workers hold."""
    return replace(config, models={
        name: replace(model, endpoints=(f"10.0.{i}.1:80", f"10.0.{i}.2:80"))
        for i, (name, model) in enumerate(config.models.items())})


# A parent on the strong model with a 100k-token system prompt; then a first request that
# resends it, whose own text matches the cheap model.
@pytest.mark.parametrize(
    ("knobs", "parent", "shared", "expected", "reason"),
    [
        ({"return_rate": 1.0}, "s1", True, STRONG, "sub_agent_prefix_held"),
        ({"remaining_turn_prior": 1.0}, "s1", True, STRONG, "sub_agent_prefix_held"),
        ({}, "s1", True, STRONG, "sub_agent_prefix_held"),
        ({"remaining_turn_prior": 40.0, "return_rate": 0.0}, "s1", True, CHEAP,
         "new_session"),  # its many turns save more than the cache it leaves
        ({"return_rate": 1.0, "step_down_pricing": False}, "s1", True, CHEAP, "new_session"),
        ({"return_rate": 1.0}, None, True, CHEAP, "new_session"),  # no parent: its own task
        ({"return_rate": 1.0}, "s1", False, CHEAP, "new_session"),  # nothing of it cached
    ],
)
def test_a_sub_agents_model_choice_pays_for_the_prefix_it_leaves(
        session_config, clock, knobs, parent, shared, expected, reason):
    driver = Driver(pooled(tuned(session_config, **knobs)), clock)
    driver.send(chat(HARD, context_chars=400_000))
    own = chat("continue", context_chars=400_000 if shared else 0)
    routed = driver.send(own, session="sub", parent=parent)
    rec = driver.record(routed)
    assert (rec["base"]["model"], rec["action"]) == (CHEAP, "new")
    assert (routed.model, rec["reason"]) == (expected, reason), rec["candidates"]
    if reason == "sub_agent_prefix_held":
        strong, cheap = rec["candidates"]
        assert (strong["model"], cheap["model"], cheap["held"]) == (STRONG, CHEAP, True)
        assert cheap["transition_usd"] > 0  # the strong model's cached prefix, thrown away
