"""Volatile preambles: cut from the rendering the prefix index hashes, and from the raw body
the engine gets (byte for byte the client's elsewhere); the two always agree."""

from __future__ import annotations

import json

import orjson
import pytest

from extproc.apis import DEFAULT_PREAMBLES, Preambles, render_prompt, strip_preambles
from extproc.types import Api
from tests.apis.bodies import parse
from tests.apis.test_recorded import recorded

BILLING = "x-anthropic-billing-header: cc_version=2.1.332.1c9; cc_entrypoint=sdk-cli;"
NONCE = ("x-anthropic-billing-header: cc_version=2.1.332.a3e; cc_entrypoint=sdk-cli; "
         "cch=5f2e9; cc_is_subagent=true;")
PREAMBLES = Preambles()


@pytest.mark.parametrize(("text", "expected"), [
    (BILLING, ""),
    (NONCE, ""),
    (f"{BILLING}\nYou are a Claude agent.", "You are a Claude agent."),
    ("You are a Claude agent.", "You are a Claude agent."),
    (f"Intro.\n{BILLING}", f"Intro.\n{BILLING}"),  # only at the start
    ("x-anthropic-billing-header", "x-anthropic-billing-header"),  # no colon: not the line
])
def test_the_billing_line_is_cut_at_the_start_only(text, expected):
    assert PREAMBLES.cut(text) == expected


def _raw(system, *, key="system", tail='"max_tokens":64'):
    return (b'{"model":"auto","messages":[{"role":"user","content":"hi"}],'
            + b'"' + key.encode() + b'": ' + system + b", " + tail.encode() + b"}")


BLOCK = json.dumps({"type": "text", "text": BILLING}).encode()
AGENT = b'{"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "x"}}'
REST = b'{"type":"text","text":"Be brief."}'


# the system value as sent -> as it must reach the engine (None: the body is sent unchanged)
@pytest.mark.parametrize(("system", "expected"), [
    (b"[" + BLOCK + b", " + AGENT + b",\n " + REST + b"]", b"[" + AGENT + b",\n " + REST + b"]"),
    (b"[ " + AGENT + b" , " + BLOCK + b" ]", b"[ " + AGENT + b" ]"),  # last: the comma before
    (b"[" + AGENT + b"," + BLOCK + b"," + BLOCK + b"]", b"[" + AGENT + b"]"),
    (b"[" + BLOCK + b"]", b"[]"),
    (orjson.dumps(f"{BILLING}\nBe brief."), b'"Be brief."'),
    (b"[" + AGENT + b"," + REST + b"]", None),
    (b'"Be brief."', None),
    (b"null", None),
])
def test_the_engine_body_loses_the_preamble_and_nothing_else(system, expected):
    raw = _raw(system)
    stripped = strip_preambles(Api.MESSAGES, raw, PREAMBLES)
    if expected is None:
        assert stripped is None
        return
    assert stripped == _raw(expected)


def test_a_partly_volatile_block_keeps_its_other_fields():
    block = json.dumps({"type": "text", "text": f"{BILLING}\nBe brief.", "cache_control": 1})
    stripped = strip_preambles(Api.MESSAGES, _raw(f"[{block}]".encode()), PREAMBLES)
    assert stripped is not None
    assert orjson.loads(stripped)["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": 1}]


def test_only_the_top_level_system_prompt_is_touched():
    nested = json.dumps({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": {"system": [BILLING]}}]})
    raw = (b'{"model":"auto","messages":[' + nested.encode() + b'],"system":[' + BLOCK
           + b"]}")
    assert strip_preambles(Api.MESSAGES, raw, PREAMBLES) == raw.replace(BLOCK, b"")
    quoted = json.dumps({"model": "auto", "messages": [{"role": "user", "content":
                         f'"system": "{BILLING}"'}]}).encode()
    assert strip_preambles(Api.MESSAGES, quoted, PREAMBLES) is None


def test_responses_instructions_are_cut_and_chat_is_left_alone():
    raw = orjson.dumps({"model": "auto", "instructions": f"{BILLING}\nBe brief.", "input": "hi"})
    assert orjson.loads(strip_preambles(Api.RESPONSES, raw, PREAMBLES) or b"{}")[
        "instructions"] == "Be brief."
    chat = orjson.dumps({"model": "auto", "messages": [{"role": "system", "content": BILLING}]})
    assert strip_preambles(Api.CHAT, chat, PREAMBLES) is None


def test_the_last_of_duplicate_system_keys_is_the_one_cut():
    raw = b'{"model":"auto","system":"keep","messages":[{"role":"user","content":"x"}],' \
          b'"system":[' + BLOCK + b"]}"
    assert strip_preambles(Api.MESSAGES, raw, PREAMBLES) == raw.replace(BLOCK, b"")


def test_no_patterns_no_change():
    assert strip_preambles(Api.MESSAGES, _raw(b"[" + BLOCK + b"]"), Preambles(())) is None


@pytest.mark.parametrize("name", ["claude-code-first", "claude-code-second-session-first",
                                  "claude-code-subagent-first", "claude-code-after-subagent"])
def test_the_stripped_body_renders_as_the_normalised_prompt(name):
    body = recorded(name)["body"]
    raw = orjson.dumps(body)
    stripped = strip_preambles(Api.MESSAGES, raw, PREAMBLES)
    assert stripped is not None
    after = orjson.loads(stripped)
    assert after["system"] == body["system"][1:]  # the billing block, and only it, is gone
    assert {k: v for k, v in after.items() if k != "system"} == {
        k: v for k, v in body.items() if k != "system"}
    normalised = render_prompt(parse(Api.MESSAGES, body), PREAMBLES)
    assert render_prompt(parse(Api.MESSAGES, after)) == normalised
    assert "x-anthropic-billing-header" not in normalised


def test_two_sessions_and_a_sub_agent_share_their_opening_once_normalised():
    """Claude Code's sessions in one project differ in the billing line's hash first of all;
    without it their rendered prompts share the whole system prompt."""
    def prompts(preambles):
        return [render_prompt(parse(Api.MESSAGES, recorded(n)["body"]), preambles)
                for n in ("claude-code-first", "claude-code-second-session-first")]

    def shared(a: str, b: str) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                    min(len(a), len(b)))

    raw_first, raw_second = prompts(None)
    first, second = prompts(PREAMBLES)
    assert shared(raw_first, raw_second) < 80
    system = "".join(b["text"] for b in recorded("claude-code-first")["body"]["system"][1:])
    assert shared(first, second) > len(system)


def test_the_default_covers_claude_codes_line():
    assert Preambles(DEFAULT_PREAMBLES).cut(NONCE) == ""


def test_a_null_element_of_a_system_array_is_no_preamble():
    """Found by the servicer's property test: ``null`` beside a block stays as the client sent
    it (only a text block holding nothing but a preamble is dropped)."""
    from extproc.apis import Preambles, strip_preambles
    from extproc.types import Api

    raw = b'{"model": "auto", "input": "hi", "instructions": [null, [{"type": "text"}]]}'
    assert strip_preambles(Api.RESPONSES, raw, Preambles()) is None
    billed = (b'{"model": "auto", "input": "hi", "instructions": [null, {"type": "text", '
              b'"text": "x-anthropic-billing-header: cc_version=1;\\n"}, "tail"]}')
    stripped = strip_preambles(Api.RESPONSES, billed, Preambles())
    assert stripped is not None and orjson.loads(stripped)["instructions"] == [None, "tail"]
