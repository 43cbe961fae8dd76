from __future__ import annotations

import random

import pytest

from extproc.config import PrefixIndexConfig
from extproc.scheduling.prefix_index import ApproximatePrefixIndex
from extproc.scheduling.types import Worker

A = (1, 2, 3, 4)
B = (1, 2, 30, 40)  # shares A's first two blocks


@pytest.mark.parametrize(
    ("routed", "query", "expected"),
    [
        ([], A, 0),
        ([A], A, 4),
        ([A], A[:2], 2),
        ([A], (*A, 5, 6), 4),
        ([A], B, 2),
        ([A], (9, 10), 0),
        ([A, B], B, 4),
        ([A], (), 0),
    ],
)
def test_matched_blocks_is_the_longest_held_prefix(
    routed: list[tuple[int, ...]], query: tuple[int, ...], expected: int
) -> None:
    index = ApproximatePrefixIndex()
    for blocks in routed:
        index.routed("w1", blocks)
    assert index.matched_blocks("w1", query) == expected
    assert index.matched_blocks("w2", query) == 0


def test_lru_evicts_tails_before_heads() -> None:
    index = ApproximatePrefixIndex(default_capacity_blocks=4)
    index.routed("w", A)
    index.routed("w", B)  # shares 1, 2 and adds 30, 40: A's own 3, 4 are the oldest
    assert index.held("w") == 4
    assert index.matched_blocks("w", A) == 2
    assert index.matched_blocks("w", B) == 4


def test_a_prompt_longer_than_the_capacity_keeps_its_head() -> None:
    index = ApproximatePrefixIndex(default_capacity_blocks=3)
    index.routed("w", (1, 2, 3, 4, 5))
    assert index.matched_blocks("w", (1, 2, 3, 4, 5)) == 3


def test_binary_search_agrees_with_a_linear_scan_under_random_traffic() -> None:
    rng = random.Random(7)
    index = ApproximatePrefixIndex(default_capacity_blocks=50)
    prompts = [tuple(rng.sample(range(10_000), 20)) for _ in range(5)]
    for _ in range(300):
        base = rng.choice(prompts)
        prompt = base[: rng.randint(1, 20)] + tuple(rng.sample(range(10_000, 20_000), 3))
        if rng.random() < 0.5:
            index.routed("w", prompt)
        linear = next((i for i, b in enumerate(prompt) if not index.holds("w", b)), len(prompt))
        assert index.matched_blocks("w", prompt) == linear


def test_a_session_growing_replaces_its_chain_with_the_new_blocks_only() -> None:
    index = ApproximatePrefixIndex(default_capacity_blocks=8)
    index.routed("w", (1, 2, 3))
    index.routed("w", (1, 2, 3, 4, 5), extends=3)  # the previous prompt plus two blocks
    assert index.held("w") == 5
    index.routed("w", (7, 8))  # another session
    index.routed("w", (1, 2, 3, 4, 5, 6, 9), extends=5)
    # 9 distinct blocks > 8: the least recent chain (7, 8) goes, the grown one stays whole.
    assert index.matched_blocks("w", (1, 2, 3, 4, 5, 6, 9)) == 7
    assert (index.matched_blocks("w", (7, 8)), index.held("w")) == (0, 7)


def test_a_wrong_hint_costs_time_not_accuracy() -> None:
    index = ApproximatePrefixIndex()
    index.routed("w", (1, 2, 3), extends=2)  # nothing was held: counted whole
    index.routed("w", (1, 2, 3, 4), extends=9)
    assert index.matched_blocks("w", (1, 2, 3, 4)) == 4
    assert index.held("w") == 4


@pytest.mark.parametrize(
    ("num_blocks", "cpu_blocks", "block_size", "host", "expected"),
    [(None, None, 16, False, 100), (2048, None, 16, False, 2048),
     (1000, None, 1, False, 62),  # tokens * 4 chars / 64 chars
     (2048, 1024, 16, False, 2048),  # the host tier counts only when asked
     (2048, 1024, 16, True, 3072), (2048, None, 16, True, 2048),
     (None, 1024, 16, True, 100)],  # no device size reported: the default
)
def test_capacity_follows_the_reported_kv_cache(
    num_blocks: int | None, cpu_blocks: int | None, block_size: int, host: bool, expected: int
) -> None:
    index = ApproximatePrefixIndex(chars_per_block=64, default_capacity_blocks=100)
    index.resize(Worker("w", "m", num_blocks=num_blocks, cpu_blocks=cpu_blocks,
                        block_size=block_size), host=host)
    assert index.capacity("w") == expected


def test_shrinking_evicts_and_forget_drops_a_worker() -> None:
    index = ApproximatePrefixIndex(default_capacity_blocks=10)
    index.routed("w", (1, 2, 3, 4, 5, 6))
    index.resize(Worker("w", "m", num_blocks=4, block_size=16))  # 4*16*4/64 = 4 blocks
    assert index.matched_blocks("w", (1, 2, 3, 4, 5, 6)) == 4
    index.forget("w")
    assert index.held("w") == 0
    assert index.capacity("w") == 10


def test_from_config() -> None:
    index = ApproximatePrefixIndex.from_config(
        PrefixIndexConfig(chars_per_block=32, default_capacity_blocks=7)
    )
    assert (index.chars_per_block, index.capacity("any")) == (32, 7)


@pytest.mark.parametrize("offset", [0, -(1 << 40), 1 << 64],
                         ids=["unsigned-64", "negative", "over-64-bits"])
def test_chains_of_any_ints_are_held_and_evicted_alike(offset: int) -> None:
    """Chains are kept packed when their hashes are unsigned 64-bit (the memo's), as they are
    otherwise: the same answers either way, through both evictions."""
    a, b = (tuple(x + offset for x in chain) for chain in (A, B))
    index = ApproximatePrefixIndex(default_capacity_blocks=4)
    index.routed("w", a)
    index.routed("w", b)
    assert (index.held("w"), index.matched_blocks("w", a), index.matched_blocks("w", b)) == (
        4, 2, 4)
    index.routed("w", tuple(x + offset for x in range(100, 106)))  # alone, longer than 4
    assert index.matched_blocks("w", tuple(x + offset for x in range(100, 106))) == 4
    assert index.matched_blocks("w", b) == 0


def test_held_chains_leave_nothing_for_the_collector_to_scan() -> None:
    """A thousand chains as the memo hands them (arrays of 64-bit hashes): a full collection
    finds no more objects than before (an array a chain would be a thousand more)."""
    import gc
    from array import array

    index = ApproximatePrefixIndex(default_capacity_blocks=1_000_000)
    index.routed("w", (1, 2))
    gc.collect()
    before = len(gc.get_objects())
    for n in range(1000):
        index.routed("w", array("Q", range(n * 10 + 3, n * 10 + 13)))
    gc.collect()
    assert len(gc.get_objects()) - before < 50
    assert index.matched_blocks("w", array("Q", range(5003, 5013))) == 10
