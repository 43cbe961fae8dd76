"""The worker side of the router, fed directly: what gets scraped and what gets placed."""

from __future__ import annotations

from dataclasses import replace

import orjson

from extproc.apis import parse_request
from extproc.config import Config
from extproc.scheduling.placement import Pools, Prompt
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
    assert set(Pools(two_workers(config), clock=clock).scrape_targets()) == {
        "10.0.0.1:80", "10.0.0.2:80"}
    with_admission = Pools(two_workers(config, admission=True), clock=clock).scrape_targets()
    assert set(with_admission) == {"10.0.0.1:80", "10.0.0.2:80", "127.0.0.1:8102"}
    assert with_admission["10.0.0.1:80"] == "http://10.0.0.1:80/metrics"


def test_a_session_returns_to_the_worker_holding_its_prefix(config, clock):
    pools = Pools(two_workers(config), clock=clock)
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "x " * 4000}]})
    first = pools.place(Prompt(parse_request(Api.CHAT, body, max_body_bytes=1 << 20)),
                        "qwen3-8b", "s")
    again = Prompt(parse_request(Api.CHAT, body, max_body_bytes=1 << 20))
    assert pools.cached_tokens(again, "qwen3-8b") > 1000
    assert pools.place(again, "qwen3-8b", "s").worker == first.worker
    assert pools.place(again, "qwen3-32b", "s").workers == ()  # one worker: Envoy's choice
