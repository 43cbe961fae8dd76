"""The hint emitter: admission's and routing's decisions in, exact hints out."""

from __future__ import annotations

from extproc.dev.clustersim.kv_hints import KvHint, KvHintEmitter
from extproc.scheduling.admission import AdmissionTick


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


def test_a_prefetched_session_is_preferred_where_its_kv_went_until_routed() -> None:
    hints = KvHintEmitter()
    hints.routed("a", "w1", matched_tokens=0, prompt_tokens=100)
    assert hints.prefetched_to("a") is None
    hints.ticked(AdmissionTick(resumed=("a",)))
    assert hints.prefetched_to("a") == "w1"
    hints.routed("a", "w1", matched_tokens=100, prompt_tokens=200)
    assert hints.prefetched_to("a") is None


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
