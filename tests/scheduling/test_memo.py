"""The incremental block hashes against the straightforward reference, on generated sessions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.apis import prompt_blocks
from extproc.scheduling.memo import MARK_EVERY, BlockMemo

pieces = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                 min_size=0, max_size=400)
# A turn appends text, or edits the history (a compaction: the prompt is rewritten from a cut).
turns = st.lists(st.tuples(pieces, st.one_of(st.none(), st.integers(0, 5000))),
                 min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(turns=turns, block=st.sampled_from([1, 7, 64]), limit=st.sampled_from([None, 1, 5, 40]))
def test_the_memo_gives_exactly_the_blocks_of_hashing_from_scratch(turns, block, limit):
    """With a ``limit``, the first ``limit`` blocks hashing from scratch gives."""
    memo = BlockMemo(block)
    text = ""
    for added, cut in turns:
        text = (text if cut is None else text[:cut] + "†") + added
        hashes, reused = memo.blocks("s", "m", text, limit)
        assert tuple(hashes) == prompt_blocks("m", text, block)[:limit]
        assert 0 <= reused <= len(hashes)


def test_a_growing_session_hashes_only_what_is_new():
    memo = BlockMemo(64)
    text = "x" * (64 * MARK_EVERY * 3 + 100)
    _, reused = memo.blocks("s", "m", text)
    assert reused == 0
    _, reused = memo.blocks("s", "m", text + "y" * 640)
    assert reused == len(text) // 64  # every block of the previous prompt
    edited = text[: 64 * MARK_EVERY + 5] + "!" + text[64 * MARK_EVERY + 6:]
    _, reused = memo.blocks("s", "m", edited)
    assert reused == MARK_EVERY  # back to the last mark before the edit


def test_sessions_and_models_do_not_share_and_the_memo_is_bounded():
    memo = BlockMemo(8, max_blocks=100)
    a, _ = memo.blocks("a", "m1", "z" * 400)
    b, reused = memo.blocks("a", "m2", "z" * 400)
    assert reused == 0 and tuple(a) != tuple(b)  # the model seeds the chain
    memo.blocks("b", "m1", "z" * 400)
    assert memo.held <= 100 and len(memo) == 1  # the least recent session went first
    _, reused = memo.blocks("b", "m1", "z" * 408)
    assert reused == 50  # the session just kept was not shed
    _, reused = memo.blocks(None, "m1", "z" * 400)
    assert reused == 0 and len(memo) == 1  # no session: nothing to remember


def test_the_memo_keeps_at_most_its_entries_however_small_they_are():
    memo = BlockMemo(8, max_entries=3)
    for session in "abcde":
        memo.blocks(session, "m", "z" * 80)
    assert len(memo) == 3 and memo.held == 30
    _, reused = memo.blocks("e", "m", "z" * 88)
    assert reused == 10  # the most recent stays
    _, reused = memo.blocks("a", "m", "z" * 88)
    assert reused == 0  # the least recent went first


def test_a_memo_s_hashes_are_bytes_the_collector_never_scans():
    """A memo a session: its hashes packed in bytes, so a full collection (which stops the
    event loop) has one object less to scan per session than with an array."""
    import gc

    from extproc.state.table import SessionTable

    table = SessionTable(clock=lambda: 0.0)
    memo = BlockMemo(8, table=table)
    hashes, _ = memo.blocks("s", "m", "z" * 400)
    (kept,) = table.get("s").memos.values()
    assert isinstance(kept.hashes, bytes) and not gc.is_tracked(kept.hashes)
    again, reused = memo.blocks("s", "m", "z" * 480)
    assert reused == 50 and tuple(again[:50]) == tuple(hashes)
