"""Generated bodies and answers through everything in ``extproc.apis``: nothing raises but a
``RoutingError`` with a client status (400, 413), every summary holds only well-typed values,
and ``rewrite_model`` changes the model and nothing else. 10,500 examples in all (with the
fuzz in test_rewrite), in a few seconds: see ``tests.apis.generate`` for how."""

from __future__ import annotations

from random import Random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.apis import (
    ResponseObserver,
    parse_request,
    peek_model,
    prompt_blocks,
    render_prompt,
    rewrite_model,
)
from extproc.apis.common import LATEST_TEXT_CAP, canonical_json
from extproc.errors import RoutingError
from extproc.types import Api, RequestSummary, ResponseSummary
from tests.apis.bodies import nested
from tests.apis.generate import JsonText, Shapes, join

APIS = list(Api)
seeds = st.randoms(use_true_random=True)


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None)


def _through_everything(api: Api, raw: bytes) -> None:
    try:
        summary = parse_request(api, raw, max_body_bytes=1 << 20)
    except RoutingError as exc:
        assert exc.status in (400, 413)
        return
    _well_typed(summary)
    prompt_blocks(summary.model, render_prompt(summary), 16)
    out = rewrite_model(raw, "routed")
    assert orjson.loads(out) == {**summary.body, "model": "routed"}
    assert peek_model(raw) == summary.model


def _well_typed(s: RequestSummary) -> None:
    for ids in (s.tool_call_ids, s.tool_result_ids, s.provider_state, s.tools_offered):
        assert all(isinstance(i, str) for i in ids)
        hash(ids)
    assert all(s.tool_result_ids) and all(s.tool_call_ids)
    assert s.tool_results >= len(s.tool_result_ids)
    for value in (s.previous_response_id, s.session_hint, s.conversation):
        assert value is None or (isinstance(value, str) and value)
    assert (s.session_hint is None) is (s.session_hint_source is None)
    assert isinstance(s.latest_text, str) and len(s.latest_text) <= LATEST_TEXT_CAP
    assert isinstance(s.stream, bool)


@fuzz(4000)
@given(seeds)
def test_api_shaped_bodies_with_odd_types_parse_or_are_rejected(r: Random):
    api = r.choice(APIS)
    raw = orjson.dumps(Shapes(r).request(APIS.index(api)))
    text = JsonText(r)
    if r.random() < 0.3:  # more top-level members as text: duplicates, deep, huge, escaped
        extra = b"".join(text.member(1) + b"," for _ in range(r.randrange(1, 3)))
        raw = b"{" + extra + raw[1:]
    _through_everything(api, raw)


@fuzz(2000)
@given(seeds)
def test_any_json_object_parses_or_is_rejected(r: Random):
    members = JsonText(r).members()
    if r.random() < 0.5:
        members.insert(r.randrange(len(members) + 1), (b'"model"', b'"auto"'))
    raw = join(members, r)
    _through_everything(r.choice(APIS), raw)


@fuzz(1000)
@given(seeds)
def test_answers_of_any_shape_never_raise(r: Random):
    api = r.choice(APIS)
    shapes = Shapes(r)
    streaming = r.random() < 0.6
    if streaming:
        data = b"".join(b"data: " + orjson.dumps(shapes.answer(APIS.index(api))) + b"\n\n"
                        for _ in range(r.randrange(1, 5)))
        data += r.choice((b"data: [DONE]\n\n", b"", b"data: {\n", b"data: " + nested(900)))
    else:
        data = orjson.dumps(shapes.answer(APIS.index(api)))
    observer = ResponseObserver(api, streaming=streaming)
    size = r.randrange(1, 64)
    for i in range(0, len(data), size):
        observer.feed(data[i : i + size])
    observer.feed(b"", end=True)
    assert observer.done
    _answer_well_typed(observer.summary)


def _answer_well_typed(s: ResponseSummary) -> None:
    for ids in (s.tool_call_ids, s.tool_names, s.provider_state):
        assert all(isinstance(i, str) and i for i in ids)
    for value in (s.model, s.response_id, s.finish_reason):
        assert value is None or (isinstance(value, str) and value)
    if s.usage is not None:
        counts = (s.usage.prompt_tokens, s.usage.completion_tokens, s.usage.cached_tokens)
        assert all(type(c) is int and c >= 0 for c in counts)


@fuzz(500)
@given(seeds)
def test_canonical_json_is_orjsons_where_orjson_can_and_total_where_it_cannot(r: Random):
    raw = b"[" + JsonText(r).value() + b"]"  # not a bare string: that is text to keep as it is
    value = orjson.loads(raw)
    try:
        expected = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError:  # deeper than orjson writes
        assert orjson.loads(canonical_json(value)) == value
    else:
        assert canonical_json(value) == expected
        assert canonical_json(raw.decode()) == expected


@pytest.mark.parametrize("api", APIS)
def test_a_fixed_seed_replays_the_same_body(api: Api):
    """The property tests rest on this: a reported seed rebuilds the failing example."""
    bodies = {orjson.dumps(Shapes(Random(7)).request(APIS.index(api))) for _ in range(3)}
    assert len(bodies) == 1
