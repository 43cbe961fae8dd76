from __future__ import annotations

import orjson

from extproc.apis import parse_request
from extproc.dev.sim.prefix_cache import tokenize
from extproc.dev.sim.prompt import generate_words, render_entries, render_prompt
from extproc.types import Api


def summarize(api: Api, body: dict) -> object:
    return parse_request(api, orjson.dumps(body), max_body_bytes=1 << 20)


def test_rendering_keeps_what_a_template_keeps() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    verbatim = {"role": "assistant", "content": None, "tool_calls": [call]}
    # The same message rebuilt from an SDK object carries extra null fields.
    rebuilt = {**verbatim, "refusal": None, "annotations": None, "audio": None}
    assert render_entries(Api.CHAT, [verbatim]) == render_entries(Api.CHAT, [rebuilt])
    assert "call ls {}" in render_entries(Api.CHAT, [verbatim])


def test_prompt_of_the_next_turn_extends_the_previous_prompt() -> None:
    first = {"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}
    second = {**first, "messages": [*first["messages"], reply, {"role": "user", "content": "go"}]}
    before = render_prompt(summarize(Api.MESSAGES, first))
    after = render_prompt(summarize(Api.MESSAGES, second))
    assert after.startswith(before + render_entries(Api.MESSAGES, [reply]))
    assert before.startswith("<|system|>\nbe brief\n")


def test_responses_string_input_renders_as_a_user_message() -> None:
    as_string = render_prompt(summarize(Api.RESPONSES, {"model": "m", "input": "hi"}))
    as_items = render_prompt(
        summarize(Api.RESPONSES, {"model": "m", "input": [{"role": "user", "content": "hi"}]})
    )
    assert as_string == as_items == "<|user|>\nhi\n"


def test_generated_words_are_deterministic_single_tokens() -> None:
    words = generate_words("seed", 20)
    assert words == generate_words("seed", 20)
    assert words != generate_words("other seed", 20)
    assert len(tokenize("".join(words))) == 20
