"""The worker side of the router, fed directly: what gets scraped and what gets placed."""

from __future__ import annotations

from dataclasses import replace

import orjson

from extproc.apis import parse_request, prompt_blocks
from extproc.assembly import assemble
from extproc.config import Config
from extproc.scheduling.placement import Prompt
from extproc.types import Api


def two_workers(config: Config, admission: bool = False) -> Config:
    models = {
        "qwen3-8b": replace(config.models["qwen3-8b"], endpoints=("10.0.0.1:80", "10.0.0.2:80")),
        "qwen3-32b": config.models["qwen3-32b"],
    }
    scheduling = replace(config.scheduling, admission=replace(
        config.scheduling.admission, enabled=admission))
    return replace(config, models=models, scheduling=scheduling)


def test_only_scored_pools_are_scraped_unless_admission_needs_every_capacity(config, clock):
    assert set(assemble(two_workers(config), clock=clock).pools.scrape_targets()) == {
        "10.0.0.1:80", "10.0.0.2:80"}
    admitting = assemble(two_workers(config, admission=True), clock=clock).pools
    with_admission = admitting.scrape_targets()
    assert set(with_admission) == {"10.0.0.1:80", "10.0.0.2:80", "127.0.0.1:8102"}
    assert with_admission["10.0.0.1:80"] == "http://10.0.0.1:80/metrics"


def test_a_session_returns_to_the_worker_holding_its_prefix(config, clock):
    pools = assemble(two_workers(config), clock=clock).pools
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "x " * 4000}]})
    first = pools.place(Prompt(parse_request(Api.CHAT, body, max_body_bytes=1 << 20)),
                        "qwen3-8b", "s")
    again = Prompt(parse_request(Api.CHAT, body, max_body_bytes=1 << 20))
    assert pools.cached_tokens(again, "qwen3-8b") > 1000
    assert pools.place(again, "qwen3-8b", "s").worker == first.worker
    assert pools.place(again, "qwen3-32b", "s").workers == ()  # one worker: Envoy's choice


def test_a_prompt_is_hashed_no_further_than_its_model_could_hold(config, clock):
    """Past 8 bytes per token of the model's window no worker holds a prompt: a body much
    larger than the window is hashed up to there, the same blocks a window-sized one gives."""
    small = replace(config.models["qwen3-8b"], context_window=1000,
                    endpoints=("10.0.0.1:80", "10.0.0.2:80"))
    pools = assemble(replace(config, models={**config.models, "qwen3-8b": small}),
                     clock=clock).pools
    block = config.scheduling.prefix.chars_per_block
    limit = -(-1000 * 8 // block)
    text = "".join(f"line {i} of a long upload\n" for i in range(30_000))
    huge = Prompt(parse_request(Api.CHAT, orjson.dumps(
        {"model": "auto", "messages": [{"role": "user", "content": text}]}),
        max_body_bytes=1 << 21))
    assert len(huge.text) > 10 * limit * block
    blocks = pools.blocks(huge, "qwen3-8b")
    assert tuple(blocks) == prompt_blocks("qwen3-8b", huge.text, block)[:limit]
    assert len(pools.blocks(huge, "qwen3-32b")) == len(huge.text.encode()) // block


def hinted(config: Config) -> Config:
    two = two_workers(config, admission=True)
    admission = replace(two.scheduling.admission, pause_threshold=0.5, resume_target=0.4,
                        demote_threshold=0.4, forced_resume_seconds=10.0)
    hints = replace(two.scheduling.hints, enabled=True, min_share_tokens=100)
    return replace(two, scheduling=replace(two.scheduling, admission=admission, hints=hints))


def chat(text: str) -> Prompt:
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": text}]})
    return Prompt(parse_request(Api.CHAT, body, max_body_bytes=1 << 20))


def test_placements_boundaries_ticks_and_ends_become_kv_hints(config, clock):
    from extproc.scheduling.kv_hints import KvHint
    from extproc.types import SessionIdentity

    pools = assemble(hinted(config), clock=clock).pools
    workers = pools.registry.pool("qwen3-8b")
    for worker in workers:
        worker.num_blocks, worker.block_size = 100, 16  # 1,600 tokens of KV each
    parent = SessionIdentity("t", "p")
    text = "shared context " * 400
    placed = pools.place(chat(text), "qwen3-8b", parent.key, identity=parent)
    pools.started(placed, parent.key, 1500)
    pools.finished(placed, parent.key, 1500, 20)
    tick = pools.tick(workers)
    assert tick.paused == (parent.key,)
    worker = placed.worker
    assert worker is not None
    assert list(pools.hints_out) == [KvHint("demote", "p", worker)]
    pools.hints_out.clear()
    clock.advance(11)
    assert pools.tick(workers).resumed == (parent.key,)
    assert list(pools.hints_out) == [KvHint("prefetch", "p", worker)]
    pools.hints_out.clear()
    child = SessionIdentity("t", "c", parent_session_id="p", final=True)
    sub = pools.place(chat(text + "sub task " * 20), "qwen3-8b", child.key, identity=child)
    assert sub.worker == worker, "a sub-agent's first turn goes where its parent is"
    (share,) = pools.hints_out
    assert (share.kind, share.session, share.worker) == ("share", "c", worker)
    assert share.prefix_tokens > 1000
    pools.hints_out.clear()
    pools.started(sub, child.key, 1600)
    pools.finished(sub, child.key, 1600, 20)  # x-dynamo-session-final: released
    (release,) = [h for h in pools.hints_out if h.kind == "release"]
    assert release.session == "c" and release.prefix_tokens == share.prefix_tokens, (
        "it keeps what it shares with its parent, as the session-prefix index measured")
    assert pools.sessions is not None and pools.sessions.state(child.key) == "finished"
