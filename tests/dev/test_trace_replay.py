"""The prompts ``saar replay-trace`` sends: rows that share leading hash ids share a prompt
prefix, block for block, and every prompt is as long as its row says (in simulator tokens)."""

from __future__ import annotations

from extproc.dev.sim.prefix_cache import block_hashes, tokenize
from extproc.dev.trace_replay import prompt


def test_shared_hash_ids_are_a_shared_prefix_of_whole_blocks():
    first = tokenize(prompt([7, 8, 9], 60, 16, "a"))
    second = tokenize(prompt([7, 8, 4], 70, 16, "b"))
    assert (len(first), len(second)) == (60, 70)
    assert block_hashes(first, 16)[:2] == block_hashes(second, 16)[:2]
    assert block_hashes(first, 16)[2] != block_hashes(second, 16)[2]


def test_a_row_longer_than_its_blocks_is_padded_and_a_shorter_one_cut():
    assert len(tokenize(prompt([1], 40, 16, "x"))) == 40
    assert len(tokenize(prompt([1, 2, 3], 20, 16, "x"))) == 20
