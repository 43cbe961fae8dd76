"""``rewrite_model`` changes the top-level model and not one other byte; ``peek_model`` reads it
as ``orjson.loads`` would. Table tests for the shapes that matter, then a fuzz against the
reference: bodies built as text, so the expected bytes are known exactly."""

from __future__ import annotations

from random import Random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.apis import peek_model, rewrite_model
from extproc.apis.rewrite import MAX_MODEL_KEYS
from extproc.errors import MalformedRequest, MissingModel
from tests.apis.bodies import nested
from tests.apis.generate import JsonText, join

CASES = {
    "plain": (b'{"model":"auto","messages":[]}', b'{"model":"X","messages":[]}'),
    "whitespace": (b'{ "model" :\n\t"auto" ,"n":1}', b'{ "model" :\n\t"X" ,"n":1}'),
    "escapes in the value": (b'{"model":"a\\"b\\\\","n":1}', b'{"model":"X","n":1}'),
    "an escaped key": (b'{"mod\\u0065l":"auto"}', b'{"mod\\u0065l":"X"}'),
    "a key spelled in escapes only": (b'{"\\u006D\\u006f\\u0064\\u0065\\u006C":"a"}',
                                      b'{"\\u006D\\u006f\\u0064\\u0065\\u006C":"X"}'),
    "nested model keys stay": (
        b'{"metadata":{"model":"keep"},"model":"auto","tools":[{"model":"keep"}]}',
        b'{"metadata":{"model":"keep"},"model":"X","tools":[{"model":"keep"}]}'),
    "model inside strings stays": (
        b'{"say \\"model":"v","m":["\\"model\\": 1","model"],"model":"auto"}',
        b'{"say \\"model":"v","m":["\\"model\\": 1","model"],"model":"X"}'),
    "duplicate keys all change": (b'{"model":"a","x":1,"model":"b"}',
                                  b'{"model":"X","x":1,"model":"X"}'),
    "a duplicate of an odd type": (b'{"model":{"model":[1,"]"]},"model":null,"model":"b"}',
                                   b'{"model":"X","model":"X","model":"X"}'),
    "big integers and key order stay": (
        b'{"z":123456789012345678901234567890,"model":"a","a":1.0e2}',
        b'{"z":123456789012345678901234567890,"model":"X","a":1.0e2}'),
    "backslashes before a quote": (b'{"p":"\\\\","model":"a","q":"\\\\\\""}',
                                   b'{"p":"\\\\","model":"X","q":"\\\\\\""}'),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewrite_model_splices_only_the_model(case: str):
    raw, expected = CASES[case]
    assert rewrite_model(raw, "X") == expected
    assert orjson.loads(expected) == {**orjson.loads(raw), "model": "X"}


def test_rewrite_model_finds_the_model_on_either_side_of_a_large_history():
    history = b'"messages":[' + b",".join([b'{"role":"user","content":"model \\"model\\""}'] * 5000)
    for raw in (b'{"model":"a",' + history + b'],"tools":[{"model":"k"}]}',
                b'{"tools":[{"model":"k"}],' + history + b'],"model":"a"}',
                b'{"x":{"model":"k"},' + history + b'],"model":"a",' + history + b']}'):
        assert orjson.loads(rewrite_model(raw, "X")) == {**orjson.loads(raw), "model": "X"}
        assert peek_model(raw) == "a"


def test_rewrite_model_writes_the_new_name_as_json():
    assert rewrite_model(b'{"model":"a"}', 'q"\\é') == b'{"model":"q\\"\\\\\xc3\xa9"}'


def test_a_body_without_a_top_level_model_cannot_be_rewritten():
    with pytest.raises(MissingModel):
        rewrite_model(b'{"metadata":{"model":"nested"}}', "X")


@pytest.mark.parametrize(("raw", "expected"), [
    (b'{"model":"a","model":"b"}', "b"),  # the last wins, as in orjson.loads
    (b'{"x":{"model":"nested"}}', None),
    (b'{"model":7}', None),
    (b'{"model":""}', None),
    (b'[{"model":"a"}]', None),
    (b'{"model":"a", oops', "a"),  # not JSON: the parse will say so
    (b'{"model":"unterminated', None),
    (b'{"model":', None),
    (b"", None),
])
def test_peek_model(raw: bytes, expected: str | None):
    assert peek_model(raw) == expected


@pytest.mark.parametrize("spelling", [b'"model"', b'"mod\\u0065l"'])
def test_a_body_with_too_many_model_keys_is_refused(spelling: bytes):
    """Each "model" key costs the scan microseconds: 700,000 of them in 8 MiB would cost
    seconds, so past ``MAX_MODEL_KEYS`` the body is malformed (no client sends so many)."""
    def body(keys: int) -> bytes:
        return b'{"model":"a","x":[' + b",".join([b"{%s:1}" % spelling] * (keys - 1)) + b"]}"

    assert peek_model(body(MAX_MODEL_KEYS)) == "a"
    assert orjson.loads(rewrite_model(body(MAX_MODEL_KEYS), "X"))["model"] == "X"
    with pytest.raises(MalformedRequest, match="model"):
        rewrite_model(body(MAX_MODEL_KEYS + 1), "X")
    assert peek_model(body(MAX_MODEL_KEYS + 1)) is None


def test_deep_nesting_before_and_after_the_model():
    raw = b'{"a":%s,"model":"m","b":%s}' % (nested(1000), nested(1000))
    assert rewrite_model(raw, "X") == raw.replace(b'"model":"m"', b'"model":"X"')
    assert peek_model(raw) == "m"


# -- the fuzz -------------------------------------------------------------------------------


def _object(members: list[tuple[bytes, bytes]], r: Random, model: bytes | None = None) -> bytes:
    """The object of ``members`` (same whitespace for the same ``r`` state); with ``model``,
    each top-level "model" value replaced by it: the reference answer."""
    if model is not None:
        members = [(k, model if orjson.loads(k) == "model" else v) for k, v in members]
    return join(members, r)


@settings(max_examples=3000, deadline=None, database=None)
@given(st.randoms(use_true_random=True))
def test_fuzz_rewrite_model_changes_only_the_model(r: Random):
    members = JsonText(r).members()
    state = r.getstate()
    raw = _object(members, r)
    r.setstate(state)
    expected = _object(members, r, b'"X"')
    doc = orjson.loads(raw)
    if "model" not in doc:
        with pytest.raises(MissingModel):
            rewrite_model(raw, "X")
        assert peek_model(raw) is None
        return
    out = rewrite_model(raw, "X")
    assert out == expected
    assert orjson.loads(out) == {**doc, "model": "X"}
    model = doc["model"]
    assert peek_model(raw) == (model if isinstance(model, str) and model else None)


@settings(max_examples=2000, deadline=None, database=None)
@given(st.randoms(use_true_random=True))
def test_fuzz_the_fast_path_finds_the_model_orjson_reads(r: Random):
    """The router's search from the end (``thorough=False``) finds the last top-level key: the
    value ``orjson.loads`` reads, so a splice there is what the upstream's parser reads."""
    from extproc.apis import model_spans

    members = JsonText(r).members()
    members.insert(r.randrange(len(members) + 1), (b'"model"', b'"auto"'))
    raw = join(members, r)
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    fast = model_spans(raw, thorough=False)
    assert fast, raw
    start, end = fast[-1]
    if b"\\u006" in raw:  # an escaped spelling may follow: the router checks and asks again
        return
    assert orjson.loads(raw[start:end]) == parsed["model"]
    assert orjson.loads(rewrite_model(raw, "routed", fast)) == {**parsed, "model": "routed"}
