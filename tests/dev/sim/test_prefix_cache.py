from __future__ import annotations

import pytest

from extproc.dev.sim.prefix_cache import PrefixCache, block_hashes, tokenize


def words(n: int, tag: str = "w") -> list[str]:
    """``n`` distinct tokens."""
    return [f"{tag}{i:03d}" for i in range(n)]


def test_tokenize_splits_whitespace_then_four_character_pieces() -> None:
    assert tokenize("hi  there\nabcdefghij") == ["hi", "ther", "e", "abcd", "efgh", "ij"]
    assert tokenize("") == []


def test_only_full_blocks_are_hashed_and_hashes_chain() -> None:
    tokens = words(40)
    hashes = block_hashes(tokens, 16)
    assert len(hashes) == 2
    # The same block contents after a different prefix hash differently.
    moved = block_hashes(["x"] * 16 + tokens[16:32], 16)
    assert moved[1] != hashes[1]


def test_lookup_reports_longest_cached_prefix_in_full_blocks() -> None:
    cache = PrefixCache(block_size=4, num_gpu_blocks=100)
    prompt = words(10)
    assert cache.lookup_and_insert(prompt) == 0
    # 10 tokens: the last token is always computed, so 9 lookable -> 2 full blocks.
    assert cache.lookup_and_insert(prompt) == 8
    longer = [*prompt, *words(6, "z")]
    assert cache.lookup_and_insert(longer) == 8
    assert cache.lookup_and_insert(longer) == 12  # 15 lookable tokens -> 3 full blocks


def test_divergence_stops_the_hit_at_the_first_differing_block() -> None:
    cache = PrefixCache(block_size=4, num_gpu_blocks=100)
    prompt = words(17)
    cache.lookup_and_insert(prompt)
    changed = list(prompt)
    changed[9] = "ZZZ"  # inside block 2
    assert cache.lookup_and_insert(changed) == 8


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    cache = PrefixCache(block_size=4, num_gpu_blocks=100)
    prompt = words(8)
    cache.lookup_and_insert(prompt)
    assert cache.lookup_and_insert(prompt) == 4


def test_lru_evicts_least_recently_used_blocks_and_tails_first() -> None:
    cache = PrefixCache(block_size=2, num_gpu_blocks=4)
    first, second = words(5, "a"), words(5, "b")
    cache.lookup_and_insert(first)  # 2 blocks
    cache.lookup_and_insert(second)  # 2 blocks: full
    assert cache.usage_fraction == 1.0
    cache.lookup_and_insert(first)  # touch first: second becomes the LRU
    third = words(3, "c")  # 1 block evicts second's *tail* block
    cache.lookup_and_insert(third)
    assert len(cache) == 4
    assert cache.lookup_and_insert(first) == 4
    assert cache.lookup_and_insert(second) == 2  # head survived, tail was evicted


def test_clear_and_validation() -> None:
    cache = PrefixCache(block_size=4, num_gpu_blocks=8)
    cache.lookup_and_insert(words(20))
    assert cache.usage_fraction == pytest.approx(5 / 8)
    cache.clear()
    assert cache.usage_fraction == 0.0
    with pytest.raises(ValueError):
        PrefixCache(block_size=0)
