"""What ``parse_request`` does for every API: limits, shape errors, the shared fields."""

from __future__ import annotations

import orjson
import pytest

from extproc.apis import parse_request, prompt_blocks, render_prompt, rewrite_model
from extproc.errors import BodyTooLarge, MalformedRequest, MissingModel
from extproc.types import Api
from tests.apis.bodies import nested, parse

MINIMAL = {
    Api.CHAT: b'"messages":[{"role":"user","content":"hi"}]',
    Api.RESPONSES: b'"input":"hi"',
    Api.MESSAGES: b'"messages":[{"role":"user","content":"hi"}]',
    Api.COMPLETIONS: b'"prompt":"hi"',
}


def test_context_estimate_grows_with_text():
    small = parse(Api.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]})
    big = parse(Api.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 4000}]})
    # The raw body at 4 characters per token, JSON punctuation included.
    assert small.context_tokens == (400 + 53) // 4
    assert big.context_tokens == (4000 + 53) // 4


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"{not json", MalformedRequest),
        (b"[1, 2]", MalformedRequest),
        (b'{"messages": []}', MissingModel),
        (b'{"model": "auto", "messages": "hi"}', MalformedRequest),
        (b'{"model": "auto", "messages": [1]}', MalformedRequest),
    ],
)
def test_bad_bodies(raw: bytes, error: type[Exception]):
    with pytest.raises(error):
        parse_request(Api.CHAT, raw, max_body_bytes=1 << 20)


@pytest.mark.parametrize("model", [b"null", b'""', b"7", b'["auto"]', b'{"name": "auto"}'])
def test_a_model_that_is_not_a_non_empty_string_is_missing(model: bytes):
    with pytest.raises(MissingModel):
        raw = b'{"model": %s, %s}' % (model, MINIMAL[Api.CHAT])
        parse_request(Api.CHAT, raw, max_body_bytes=999)


@pytest.mark.parametrize("api", list(Api))
@pytest.mark.parametrize("entries", [b'"input": 5', b'"input": {"role": "user"}', b'"input": [[]]'])
def test_responses_input_must_be_a_string_or_items(api: Api, entries: bytes):
    if api is not Api.RESPONSES:
        entries = entries.replace(b'"input"', b'"messages"')
    with pytest.raises(MalformedRequest):
        parse_request(api, b'{"model": "m", %s}' % entries, max_body_bytes=999)


def test_oversized_body_is_413():
    with pytest.raises(BodyTooLarge) as info:
        parse_request(Api.CHAT, b"x" * 101, max_body_bytes=100)
    assert info.value.status == 413


@pytest.mark.parametrize("api", list(Api))
@pytest.mark.parametrize(("stream", "expected"), [(b"true", True), (b"false", False),
                                                  (b"null", False), (None, False)])
def test_stream_is_a_json_boolean(api: Api, stream: bytes | None, expected: bool):
    field = b"" if stream is None else b', "stream": ' + stream
    raw = b'{"model": "m", %s%s}' % (MINIMAL[api], field)
    assert parse_request(api, raw, max_body_bytes=999).stream is expected


@pytest.mark.parametrize("api", list(Api))
@pytest.mark.parametrize("stream", [b'"false"', b'"true"', b"1", b"0", b"[]", b"{}"])
def test_a_stream_that_is_not_a_boolean_is_malformed(api: Api, stream: bytes):
    """OpenAI answers 400 to ``"stream": "false"``; vLLM would stream for ``"true"``. Guessing
    either way would let the router and the upstream disagree on the answer's framing."""
    raw = b'{"model": "m", %s, "stream": %s}' % (MINIMAL[api], stream)
    with pytest.raises(MalformedRequest, match="stream"):
        parse_request(api, raw, max_body_bytes=999)


@pytest.mark.parametrize("api", list(Api))
def test_the_summary_keeps_the_raw_body(api: Api):
    raw = b'{ "model" : "m", %s, "n": 123456789012345678901234567890 }' % MINIMAL[api]
    assert parse_request(api, raw, max_body_bytes=999).raw is raw


# -- deep nesting: orjson reads 1,024 levels but writes only 254 ---------------------------


DEEP_BODIES = {
    "content": (Api.CHAT, b'{"model":"m","messages":[{"role":"user","content":%s}]}'),
    "tools": (Api.CHAT, b'{"model":"m","tools":[%s],"messages":[{"role":"user","content":"x"}]}'),
    "ignored_field": (Api.CHAT, b'{"model":"m","extra":%s,"messages":[{"role":"user"}]}'),
    "tool_call_arguments": (Api.CHAT, b'{"model":"m","messages":[{"role":"assistant",'
                            b'"tool_calls":[{"id":"c","function":{"name":"f","arguments":%s}}]}]}'),
    "tool_use_input": (Api.MESSAGES, b'{"model":"m","messages":[{"role":"assistant","content":'
                       b'[{"type":"tool_use","id":"t","name":"f","input":%s}]}]}'),
    "tool_result_content": (Api.MESSAGES, b'{"model":"m","messages":[{"role":"user","content":'
                            b'[{"type":"tool_result","tool_use_id":"t","content":[%s]}]}]}'),
    "metadata": (Api.MESSAGES, b'{"model":"m","metadata":%s,"messages":[{"role":"user"}]}'),
    "function_call": (Api.RESPONSES, b'{"model":"m","input":[{"type":"function_call",'
                      b'"call_id":"c","name":"f","arguments":%s}]}'),
    "instructions": (Api.RESPONSES, b'{"model":"m","instructions":[%s],"input":"x"}'),
}


def _deepest(template: bytes) -> int:
    """The nesting ``template`` leaves for its value within orjson's 1,024 levels."""
    head = template.split(b"%s")[0]
    return 1024 - (head.count(b"{") + head.count(b"[") - head.count(b"}") - head.count(b"]"))


@pytest.mark.parametrize("depth", [255, 256, 600, None])  # None: the deepest orjson reads
@pytest.mark.parametrize("where", sorted(DEEP_BODIES))
def test_deep_nesting_parses_renders_and_rewrites(where: str, depth: int | None):
    api, template = DEEP_BODIES[where]
    deep = nested(depth or _deepest(template))
    for value in (deep, orjson.dumps(deep.decode())):  # as JSON, and as a JSON string of it
        raw = template % value
        summary = parse_request(api, raw, max_body_bytes=1 << 20)
        prompt_blocks("m", render_prompt(summary))
        assert orjson.loads(rewrite_model(raw, "other"))["model"] == "other"


def test_deep_nesting_beyond_what_orjson_reads_is_malformed():
    with pytest.raises(MalformedRequest):
        parse_request(Api.CHAT, DEEP_BODIES["content"][1] % nested(1030), max_body_bytes=1 << 20)
