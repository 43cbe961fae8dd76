"""The workloads: the same seed draws the same sessions; their shapes are what they claim."""

from __future__ import annotations

import itertools
import json

import pytest

from extproc.dev.bench.peers.settings import WORKLOADS
from extproc.dev.bench.peers.workloads import (
    PARENT_HEADER,
    SESSION_HEADER,
    Shape,
    TraceShape,
    build,
    shared_prefix_trace,
)
from extproc.dev.clustersim.trace import read_trace

SMALL = Shape(sessions=6, turns=4)
TRACE = TraceShape(sessions=6, turns=3)


def make(name: str, seed: str = "s", kv_tokens: int = 20_000):
    return build(name, shape=SMALL, trace=TRACE, seed=seed, kv_tokens=kv_tokens)


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_seed_draws_the_same_workload(name):
    assert make(name) == make(name)
    assert make(name, seed="other") != make(name)


def test_workloads_differ_from_each_other_under_one_seed():
    texts = {name: make(name).sessions[0].calls[0].text for name in WORKLOADS}
    assert len(set(texts.values())) == len(WORKLOADS)


def test_agents_carry_session_headers_and_sub_agents_their_parent():
    workload = make("agents")
    assert workload.session_headers
    children = [c for s in workload.sessions for call in s.calls for c in call.children]
    assert children, "some sessions start a sub-agent"
    child = children[0]
    assert workload.headers(child) == {SESSION_HEADER: child.key, PARENT_HEADER: child.parent}
    parent = next(s for s in workload.sessions if s.key == child.parent)
    assert workload.headers(parent) == {SESSION_HEADER: parent.key}
    # one system prompt for every session, another for every sub-agent
    assert len({s.system for s in workload.sessions}) == 1
    assert child.system != parent.system
    assert workload.requests() == 6 * 4 + len(children) * SMALL.subagent_turns
    assert all(s.grows for s in workload.sessions)


def test_the_no_session_workload_has_the_shape_without_headers():
    plain, named = make("agents_no_session"), make("agents")
    assert not plain.session_headers
    assert all(plain.headers(s) == {} for s in plain.sessions)
    assert len(plain.sessions) == len(named.sessions)


def test_oversubscribed_adds_up_to_its_factor_of_the_pool():
    workload = make("oversubscribed", kv_tokens=40_000)
    words = sum(len(s.system.split()) + sum(len(c.text.split()) for c in s.calls)
                + len(s.calls) * SMALL.answer_tokens for s in workload.sessions)
    assert words >= 2.5 * 40_000
    assert workload.session_headers


def test_shared_prefix_trace_shares_systems_and_documents(tmp_path):
    rows = shared_prefix_trace(TRACE, "t")
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parsed = read_trace(path)  # the Mooncake reader takes it as it is
    assert len(parsed) == TRACE.sessions * TRACE.turns
    heads = {row.hash_ids[:TRACE.system_blocks] for row in parsed}
    assert len(heads) <= TRACE.systems
    sessions = {row.session_id for row in parsed}
    assert len(sessions) == TRACE.sessions
    # a session's turns grow: each row's blocks start with the previous row's
    by_session: dict[str | None, list] = {}
    for row in parsed:
        by_session.setdefault(row.session_id, []).append(row.hash_ids)
    for ids in by_session.values():
        assert all(later[:len(earlier)] == earlier for earlier, later in itertools.pairwise(ids))


def test_shared_prefix_sends_its_rows_as_prompts_without_headers():
    workload = make("shared_prefix")
    assert not workload.session_headers
    assert all(not s.grows and s.system is None for s in workload.sessions)
    first = workload.sessions[0].calls
    # the second turn's prompt starts with the first's blocks (16 one-token words each)
    shared = TRACE.system_blocks + TRACE.document_blocks
    assert first[1].text.split()[:shared * 16] == first[0].text.split()[:shared * 16]


def test_an_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="unknown workload"):
        make("nope")
