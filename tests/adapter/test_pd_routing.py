"""A disaggregated pool through the adapter: the prefill pick travels in
``x-prefiller-host-port`` beside the decode pick, is recorded with the decision, and a client's
own copy of that header never reaches the workers."""

from __future__ import annotations

from dataclasses import replace

import orjson

from extproc.assembly import assemble
from extproc.config import Config, Disaggregation, WorkerSpec

from .support import CHAT, Replica, response_headers, set_headers
from .test_duplex import routed

DECODE = ("10.0.0.1:80", "10.0.0.2:80")
PREFILL = "10.0.1.1:80"
LONG = orjson.dumps({"model": "qwen3-32b", "messages": [
    {"role": "user", "content": "refactor " + "the storage layer " * 600}]})
SHORT = orjson.dumps({"model": "qwen3-32b", "messages": [{"role": "user", "content": "hi"}]})


def pd_pool(config: Config, threshold: int = 1000) -> Config:
    models = dict(config.models)
    workers = (*(WorkerSpec(address=a, role="decode") for a in DECODE),
               WorkerSpec(address=PREFILL, role="prefill"))
    models["qwen3-32b"] = replace(models["qwen3-32b"], endpoints=(), workers=workers)
    scheduling = replace(config.scheduling,
                         disaggregation=Disaggregation(threshold_tokens=threshold))
    return replace(config, models=models, scheduling=scheduling)


async def test_a_long_uncached_prompt_is_split_and_recorded(config, clock):
    replica = Replica(assemble(pd_pool(config), clock=clock))
    records: list[dict] = []

    class Listener:
        def recorded(self, record: dict) -> None:
            records.append(record)

        def completed(self, *args: object) -> None:
            pass

    replica.replay.subscribe(Listener())  # type: ignore[arg-type]
    spoofed = {**CHAT, "x-prefiller-host-port": "6.6.6.6:1"}
    replies = await routed(replica.stream(), LONG, spoofed)
    headers = set_headers(replies[0].request_headers.response)
    decode = headers["x-gateway-destination-endpoint"]
    assert decode in DECODE  # never the prefill worker
    assert headers["x-prefiller-host-port"] == PREFILL  # ours, over the client's
    pd = records[-1]["pd"]
    assert (pd["split"], pd["reason"], pd["decode"], pd["prefill"]) == (
        True, "cold", decode, PREFILL)
    assert pd["uncached_tokens"] >= 1000


async def test_a_short_prompt_stays_local_and_the_clients_header_is_removed(config, clock):
    replica = Replica(assemble(pd_pool(config), clock=clock))
    spoofed = {**CHAT, "x-prefiller-host-port": "6.6.6.6:1"}
    replies = await routed(replica.stream(), SHORT, spoofed)
    common = replies[0].request_headers.response
    assert "x-prefiller-host-port" not in set_headers(common)
    assert "x-prefiller-host-port" in common.header_mutation.remove_headers
    assert set_headers(common)["x-gateway-destination-endpoint"] in DECODE


def prefill_requests(replica: Replica) -> int:
    return next(w.in_flight for w in replica.parts.pools.all_workers() if w.address == PREFILL)


async def test_the_prefill_worker_counts_a_split_until_its_answer_begins(config, clock):
    """The prefill worker has the request from the pick until the decode worker answers (its
    sidecar is then past the prefill call), or until the stream closes unanswered: between
    two scrapes, the next split sees it free."""
    replica = Replica(assemble(pd_pool(config), clock=clock))
    for session, answer in (("s1", True), ("s2", False)):
        stream = replica.stream()
        body = LONG.replace(b"refactor", session.encode())  # nothing of it cached anywhere
        replies = await routed(stream, body, {**CHAT, "x-session-id": session})
        assert set_headers(replies[0].request_headers.response)["x-prefiller-host-port"] == (
            PREFILL)  # the prefill worker is free again: split
        assert prefill_requests(replica) == 1
        if answer:
            await stream.handle(response_headers("200", "text/event-stream"))
            assert prefill_requests(replica) == 0  # the decode worker answers: prefill done
        stream.close()  # answered, or the client hung up first
        assert prefill_requests(replica) == 0  # counted once either way
