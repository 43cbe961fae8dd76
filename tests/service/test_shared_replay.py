"""Replay records shared by replicas (``state.store: redis``), against a real Valkey server and a
real Valkey Cluster: an id one replica gave resolves on another, a session's records merge
across replicas, tenants stay apart, and the store and the write queue stay bounded."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import orjson
import pytest

from extproc.config import Admin, SharedReplay, State
from extproc.core.router import LocalDriver
from extproc.dev.harness import store_server
from extproc.observability.metrics import Metrics
from extproc.observability.shared_replay import SharedReplay as Writer
from extproc.observability.shared_replay import connect
from extproc.service.app import start
from extproc.types import Api, ResponseSummary

TOKEN = "shared-replay-admin-token-0123"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
ALICE = {"authorization": "Bearer sk-alice"}
BODY = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor"}]})
KEPT = 4


@pytest.fixture(scope="module", params=["valkey", "valkey-cluster"])
def valkey(request, tmp_path_factory):
    with store_server(request.param, tmp_path_factory.mktemp(request.param)) as (_, url):
        yield url


async def _replica(config, url: str, token_file: str):
    shared = SharedReplay(session_records=KEPT, flush_seconds=0.01)
    return await start(replace(
        config, state=State(store="redis", redis_url=url, key_prefix="replay-test"),
        admin=Admin(token_file=token_file),
        observability=replace(config.observability, shared_replay=shared),
        server=replace(config.server, grpc_port=0, http_port=0)))


def _route(service, credential: dict[str, str], session: str) -> str:
    driver = LocalDriver(service.parts.router)
    routed = driver.route(Api.CHAT, {**credential, "x-session-id": session}, BODY)
    driver.respond(routed, ResponseSummary(status=200, finish_reason="stop"))
    return routed.replay_id


async def _eventually(fetch, until):
    for _ in range(200):
        value = await fetch()
        if until(value):
            return value
        await asyncio.sleep(0.02)
    raise AssertionError("never reached")


async def test_an_id_from_one_replica_resolves_on_another(config, valkey, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    a = await _replica(config, valkey, str(token))
    b = await _replica(config, valkey, str(token))
    try:
        first = _route(a, ALICE, "across")
        second = _route(b, ALICE, "across")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}") as http:
            record = await _eventually(lambda: http.get(f"/v1/replay/{first}", headers=ALICE),
                                       lambda r: r.status_code == 200)
            assert record.json()["outcome"]["status"] == 200, "written again once completed"
            assert b.parts.replay.get(first) is None, "B never routed it: the store answered"
            other = await http.get(f"/v1/replay/{first}", headers={"x-api-key": "sk-mallory"})
            assert other.status_code == 404
            listed = await _eventually(
                lambda: http.get("/v1/replay?session_id=across", headers=ADMIN),
                lambda r: len(r.json()["records"]) == 2)
            assert [r["replay_id"] for r in listed.json()["records"]] == [first, second]
        redis = connect(valkey)
        try:
            for _ in range(KEPT + 2):
                _route(a, ALICE, "long")
            tenant = a.parts.replay.get(first)["session"]["tenant"]
            key = f"replay-test:v1:rs:{tenant}/long"
            length = await _eventually(lambda: redis.llen(key), lambda n: n == KEPT)
            assert length == KEPT, "a session's list keeps its newest ids"
            assert 0 < await redis.pttl(key) <= 3600 * 1000
            assert 0 < await redis.pttl(f"replay-test:v1:r:{first}") <= 3600 * 1000
        finally:
            await redis.aclose()
    finally:
        await a.stop()
        await b.stop()


async def test_without_a_shared_store_nothing_is_shared(config):
    service = await start(replace(config, server=replace(config.server, grpc_port=0,
                                                         http_port=0)))
    try:
        assert service.telemetry is not None and service.telemetry.shared is None
    finally:
        await service.stop()


async def test_the_write_queue_is_bounded_and_drops_the_oldest(valkey):
    metrics = Metrics()
    writer = Writer(connect(valkey), metrics, prefix="bounded", ttl_seconds=60,
                    session_records=KEPT, flush_seconds=1, max_pending=3)
    records = [{"replay_id": f"rp-{i}", "time": float(i), "session": {"id": "s", "tenant": "t"}}
               for i in range(5)]
    for record in records:
        writer.recorded(record)
    writer.completed(records[-1])  # already queued: one write carries both
    assert metrics.registry.get_sample_value("saar_replay_shared_dropped_total") == 2
    assert await writer.flush()
    assert await writer.get("rp-0") is None
    assert (await writer.get("rp-4"))["time"] == 4.0
    assert [r["replay_id"] for r in await writer.for_session("s", "t")] == ["rp-2", "rp-3", "rp-4"]
    await writer.stop()
