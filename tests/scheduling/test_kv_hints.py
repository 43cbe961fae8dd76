"""The hint emitter: admission's and routing's decisions in, exact hints out."""

from __future__ import annotations

import pytest

from extproc.scheduling.admission import AdmissionTick
from extproc.scheduling.kv_hints import KvHint, KvHintEmitter, decode_hints, encode_hints


def test_first_turn_on_a_worker_shares_what_others_put_there() -> None:
    hints = KvHintEmitter(min_share_tokens=1024)
    assert hints.routed("a", "w1", matched_tokens=6144, prompt_tokens=9000) == [
        KvHint("share", "a", "w1", 6144)]
    assert hints.routed("a", "w1", matched_tokens=9000, prompt_tokens=9500) == [], "its own"
    assert hints.routed("b", "w1", matched_tokens=512, prompt_tokens=9000) == [], "too short"
    assert hints.routed(None, "w1", matched_tokens=6144, prompt_tokens=9000) == []


def test_pauses_and_resumes_become_demotes_and_prefetches_on_the_session_worker() -> None:
    hints = KvHintEmitter()
    hints.routed("a", "w1", matched_tokens=0, prompt_tokens=100)
    hints.routed("b", "w2", matched_tokens=0, prompt_tokens=100)
    assert hints.ticked(AdmissionTick(paused=("a", "unknown"), resumed=("b", "new"))) == [
        KvHint("demote", "a", "w1"), KvHint("prefetch", "b", "w2")]
    assert hints.turn_finished("b", paused=True) == [KvHint("demote", "b", "w2")]
    assert hints.turn_finished("a", paused=False) == []


def test_one_demote_per_pause_and_a_paused_boundary_demotes_at_once() -> None:
    hints = KvHintEmitter()
    hints.routed("a", "w1", matched_tokens=0, prompt_tokens=100)
    assert hints.turn_finished("a", paused=True) == [KvHint("demote", "a", "w1")]
    assert hints.ticked(AdmissionTick(paused=("a",))) == [], "already demoted at the boundary"
    assert hints.ticked(AdmissionTick(resumed=("a",))) == [KvHint("prefetch", "a", "w1")]
    assert hints.ticked(AdmissionTick(paused=("a",))) == [KvHint("demote", "a", "w1")]


def test_hints_carry_the_wire_name_and_forgotten_sessions_are_released() -> None:
    hints = KvHintEmitter()
    hints.routed("tenant/a", "w1", matched_tokens=0, prompt_tokens=100, name="a")
    assert hints.ticked(AdmissionTick(paused=("tenant/a",), forgotten=("tenant/a",))) == [
        KvHint("demote", "a", "w1"), KvHint("release", "a", "w1")]
    assert len(hints) == 0


def test_sessions_are_bounded_and_expire() -> None:
    now = [0.0]
    hints = KvHintEmitter(max_sessions=2, ttl_seconds=10.0, clock=lambda: now[0])
    for key in ("a", "b", "c"):
        hints.routed(key, "w1", matched_tokens=0, prompt_tokens=100)
    assert len(hints) == 2 and hints.ended("a") == [], "the least recent went first"
    now[0] = 20.0
    hints.routed("d", "w1", matched_tokens=0, prompt_tokens=100)
    assert len(hints) == 1 and hints.ended("b") == []


def test_the_wire_form_round_trips_and_refuses_bad_batches() -> None:
    batch = [KvHint("share", "a", "w1", 6144), KvHint("release", "b", "w1")]
    assert decode_hints(encode_hints(batch), "w1") == batch
    assert decode_hints(b'{"hints": [{"kind": "pin", "session": "a"}]}', "w1") == []
    for bad in (b"[]", b"nope", b'{"hints": [{"kind": "share"}]}',
                b'{"hints": [{"kind": "share", "session": "a", "prefix_tokens": -1}]}'):
        with pytest.raises(ValueError):
            decode_hints(bad, "w1")


def test_release_goes_to_every_worker_used_and_a_sub_agent_keeps_its_start() -> None:
    hints = KvHintEmitter()
    hints.routed("a", "w2", matched_tokens=0, prompt_tokens=100)
    hints.routed("a", "w1", matched_tokens=0, prompt_tokens=300)
    hints.routed("a/sub0", "w1", matched_tokens=300, prompt_tokens=1300, parent="a")
    hints.routed("a/sub0", "w1", matched_tokens=1300, prompt_tokens=2000, parent="a")
    assert hints.ended("a/sub0") == [KvHint("release", "a/sub0", "w1", 1300)]
    assert hints.ended("a") == [KvHint("release", "a", "w1"), KvHint("release", "a", "w2")]
    assert hints.ended("a") == []
    assert hints.ticked(AdmissionTick(paused=("a",))) == [], "forgotten"
