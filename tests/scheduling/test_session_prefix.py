"""The session-prefix index fed event sequences: placements, KV events, admission's states."""

from __future__ import annotations

from extproc.scheduling.kv_events import CPU, DEVICE
from extproc.scheduling.session_prefix import SessionPrefixIndex

SYSTEM = [1, 2, 3]
"""A system prompt every session starts with (chained hashes: equal blocks, equal prefix)."""


def context(owner: int, blocks: int, base: list[int] = SYSTEM) -> list[int]:
    return [*base, *(owner * 1000 + i for i in range(blocks))]


def test_sessions_share_the_system_prompt_and_own_their_tails() -> None:
    index = SessionPrefixIndex()
    a, b = context(1, 4), context(2, 2)
    index.placed("a", a, "w1")
    assert index.shared("a") == 0 and list(index.unique("a")) == a, "alone: all its own"
    index.placed("b", b, "w2")
    assert (index.shared("a"), index.shared("b")) == (3, 3)
    assert list(index.unique("b")) == b[3:]
    assert index.where(1) == {"w1": DEVICE, "w2": DEVICE}
    index.placed("a", [*a, 1004, 1005], "w1")  # the next turn extends the branch
    assert index.blocks == 9 + 5 and list(index.unique("a")) == [*a[3:], 1004, 1005]


def test_a_sub_agent_branches_off_its_parent_and_its_release_keeps_the_parent_s_blocks() -> None:
    index = SessionPrefixIndex()
    parent = context(1, 5)
    index.placed("p", parent, "w1")
    child = [*parent, 2000, 2001]
    index.placed("p/sub0", child, "w1", parent="p")
    assert index.lineage("p/sub0") == ["p"] and index.lineage("p") == []
    assert index.shared("p/sub0") == len(parent)
    assert list(index.unique("p/sub0")) == [2000, 2001]
    index.paused("p")
    assert index.sessions("paused") == ["p"] and index.shared("p/sub0") == len(parent)
    index.finished("p/sub0")
    assert index.state("p/sub0") == "finished" and index.where(2000) == {}
    assert index.where(parent[-1]) == {"w1": DEVICE}, "the parent still holds its context"
    index.resumed("p")
    assert index.sessions("live") == ["p"] and index.shared("p") == 0


def test_kv_events_say_where_blocks_really_are() -> None:
    index = SessionPrefixIndex()
    a = context(1, 2)
    index.placed("a", a, "w1")
    index.located("w1", CPU, a[3:], stored=True)
    assert index.where(a[3]) == {"w1": DEVICE}, "still on the device until it is removed"
    index.located("w1", DEVICE, a[3:], stored=False)
    index.located("w1", CPU, a[3:], stored=True)
    assert index.where(a[3]) == {"w1": CPU}
    index.located("w1", CPU, a[3:], stored=False)
    index.located("w9", DEVICE, [424242], stored=True)  # no session has it: not kept
    assert index.where(a[3]) == {} and index.where(424242) == {}


def test_bounded_by_blocks_and_by_the_session_table() -> None:
    index = SessionPrefixIndex(max_sessions=3, max_blocks=12)
    for n in range(3):
        index.placed(f"s{n}", context(n + 1, 2), "w1")  # branches of five blocks
    assert (index.state("s0"), index.blocks) == ("finished", 10), "the least recent closed"
    index.placed("s3", context(9, 2), "w1")
    assert index.state("s0") is None, "the table's bound: the least recently active left"
    assert (index.state("s1"), index.blocks) == ("finished", 10)
    assert index.sessions() == ["s1", "s2", "s3"]
