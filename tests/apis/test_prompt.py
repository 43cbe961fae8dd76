from __future__ import annotations

import orjson
import pytest
import xxhash

import extproc.dev.sim.prompt as sim_prompt
from extproc.apis import parse_request, prompt
from extproc.apis.prompt import chain_hashes, prompt_blocks
from extproc.dev.sim.prefix_cache import block_hashes
from extproc.types import Api

TEXT = "".join(chr(ord("a") + i % 26) for i in range(64 * 3 + 10))


def test_the_simulator_renders_with_the_core_implementation() -> None:
    assert sim_prompt.render_prompt is prompt.render_prompt
    assert sim_prompt.render_entries is prompt.render_entries


@pytest.mark.parametrize(
    ("text", "chars_per_block", "expected"),
    [
        ("", 64, 0),
        ("x" * 63, 64, 0),
        ("x" * 64, 64, 1),
        (TEXT, 64, 3),  # the 10-character tail is not a full block
        (TEXT, 16, (64 * 3 + 10) // 16),
    ],
)
def test_only_full_blocks_are_hashed(text: str, chars_per_block: int, expected: int) -> None:
    assert len(prompt_blocks("m", text, chars_per_block)) == expected


def test_blocks_chain_from_a_seed_made_of_the_model_name() -> None:
    seed = xxhash.xxh3_64_intdigest(b"m")
    first = xxhash.xxh3_64_intdigest(TEXT[:64].encode(), seed=seed)
    second = xxhash.xxh3_64_intdigest(TEXT[64:128].encode(), seed=first)
    assert prompt_blocks("m", TEXT)[:2] == (first, second)


def test_the_model_name_separates_identical_prompts() -> None:
    assert set(prompt_blocks("a", TEXT)).isdisjoint(prompt_blocks("b", TEXT))


def test_a_block_hash_names_its_whole_prefix() -> None:
    repeated = "y" * 128
    first, second = prompt_blocks("m", repeated)
    assert first != second  # equal contents, different prefixes
    changed_head = prompt_blocks("m", "z" + TEXT[1:])
    assert not set(changed_head) & set(prompt_blocks("m", TEXT))


def test_a_longer_prompt_extends_the_blocks_of_its_prefix() -> None:
    assert prompt_blocks("m", TEXT + "more" * 40)[:3] == prompt_blocks("m", TEXT)


def test_text_is_cut_in_utf8_bytes() -> None:
    assert len(prompt_blocks("m", "é" * 128)) == 4  # 256 bytes
    assert len(prompt_blocks("m", "e" * 128)) == 2


def test_chain_hashes_is_what_the_simulated_cache_uses() -> None:
    tokens = ["a", "b", "c", "d"]
    assert block_hashes(tokens, 2) == chain_hashes([b"a\x1fb", b"c\x1fd"])


def test_a_64_kib_prompt_is_1024_blocks() -> None:
    """Its speed is ``saar bench route``'s to measure, not a test's."""
    text = ("def handler(event): return event['body'] # tool output line\n" * 1200)[:65536]
    assert len(prompt_blocks("m", text)) == 1024


@pytest.mark.parametrize("limit", [1, 30, 31, 45, 200, 10_000])
def test_a_limited_rendering_begins_with_the_first_limit_characters_of_the_whole(
        limit: int) -> None:
    """Turns past ``limit`` characters are left out; every one before is there in full."""


    messages = [{"role": "system", "content": "You are a coding agent."}] + [
        {"role": "user" if i % 2 else "assistant", "content": f"turn {i} " * 3}
        for i in range(12)]
    summary = parse_request(Api.CHAT, orjson.dumps({"model": "m", "messages": messages}),
                            max_body_bytes=1 << 20)
    whole = prompt.render_prompt(summary)
    cut = prompt.render_prompt(summary, limit=limit)
    assert whole.startswith(cut) and len(cut) >= min(limit, len(whole))
    turns = whole.split("<|")[1:]
    kept = cut.split("<|")[1:]
    assert kept == turns[:len(kept)]  # whole turns only
    assert len(kept) == len(turns) or len("<|".join(["", *kept[:-1]])) < limit
