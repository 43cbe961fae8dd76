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
from extproc.service.app import start
from extproc.state.cluster import connect
from extproc.types import Api, ResponseSummary
from tests.state.conftest import oracle

TOKEN = "shared-replay-admin-token-0123"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
ALICE = {"authorization": "Bearer sk-alice"}
BODY = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor"}]})
KEPT = 4


@pytest.fixture(scope="module", params=["valkey", "valkey-cluster"])
def valkey(request, tmp_path_factory):
    with store_server(request.param, tmp_path_factory.mktemp(request.param)) as (_, url):
        yield url


async def _replica(config, url: str, token_file: str, prefix: str = "replay-test"):
    shared = SharedReplay(session_records=KEPT, flush_seconds=0.01)
    return await start(replace(
        config, state=State(store="redis", redis_url=url, key_prefix=prefix),
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
        redis = oracle(valkey)
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


class Counted:
    """The store's client, counting the round trips made through it."""

    def __init__(self, server) -> None:
        self.server, self.trips = server, 0

    async def execute(self, commands):
        self.trips += 1
        return await self.server.execute(commands)

    async def close(self) -> None:
        await self.server.close()


async def test_under_steady_load_the_writer_makes_one_round_trip_a_period(valkey):
    """Records marked while a batch is out wait for the next period: the writer never flushes
    back to back, a few records a round trip (as it did under load)."""
    server = Counted(connect(valkey))
    writer = Writer(server, Metrics(), prefix="steady", ttl_seconds=60,
                    session_records=KEPT, flush_seconds=0.05, max_pending=10_000)
    writer.start()
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(400):  # a record every millisecond or so, for about half a second
        writer.recorded({"replay_id": f"rp-{i}", "time": float(i),
                         "session": {"id": "s", "tenant": "t"}})
        await asyncio.sleep(0.001)
    trips, periods = server.trips, (loop.time() - started) / 0.05
    assert 1 <= trips <= periods + 1  # each trip comes after a whole period's sleep
    await asyncio.sleep(0.12)
    assert len(await writer.for_session("s", "t")) == KEPT  # every record went out
    assert (await writer.get("rp-0"))["time"] == 0.0
    await writer.stop()


async def test_every_replica_lists_every_replicas_sessions_each_tenant_its_own(
        config, valkey, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    a = await _replica(config, valkey, str(token), prefix="listing")
    b = await _replica(config, valkey, str(token), prefix="listing")
    bob = {"authorization": "Bearer sk-bob"}
    try:
        _route(a, ALICE, "alice-on-a")
        _route(b, ALICE, "alice-on-b")
        _route(a, bob, "bob-on-a")
        _route(b, ALICE, "alice-on-a")          # a session whose turns two replicas routed
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}") as http:
            listed = await _eventually(
                lambda: http.get("/v1/sessions", headers=ADMIN),
                lambda r: len(r.json()["sessions"]) == 3)
            sessions = {s["session_id"]: s for s in listed.json()["sessions"]}
            assert set(sessions) == {"alice-on-a", "alice-on-b", "bob-on-a"}
            assert sessions["alice-on-a"]["turns"] == 2, "both replicas' turns, merged"
            assert listed.json()["sessions"][0]["session_id"] == "alice-on-a"   # newest first
            own = await http.get("/v1/sessions", headers=ALICE)
            assert {s["session_id"] for s in own.json()["sessions"]} == {"alice-on-a",
                                                                          "alice-on-b"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.http_port}") as http:
            again = await http.get("/v1/sessions", headers=ADMIN)
            assert [s["session_id"] for s in again.json()["sessions"]] == \
                [s["session_id"] for s in listed.json()["sessions"]], "the same on A"
    finally:
        await a.stop()
        await b.stop()


async def test_the_recent_sessions_index_keeps_the_newest_and_lines_not_records(
        valkey, monkeypatch):
    from extproc.observability import shared_replay

    monkeypatch.setattr(shared_replay, "RECENT_SESSIONS", 3)
    writer = Writer(connect(valkey), Metrics(), prefix="recent", ttl_seconds=60,
                    session_records=KEPT, flush_seconds=1, max_pending=100)
    now = __import__("time").time()
    for i in range(5):
        writer.recorded({"replay_id": f"rp-{i}", "time": now + i, "model": "m",
                         "session": {"id": f"s{i}", "tenant": "t"}, "candidates": [1] * 50,
                         "outcome": {"status": 200, "usage": None, "served_worker": "w"}})
    assert await writer.flush()
    recent = await writer.recent_sessions(None, 10)
    assert [key for key, _ in recent] == [("t", "s4"), ("t", "s3"), ("t", "s2")]
    assert await writer.recent_sessions("t", 2) == recent[:2]
    assert await writer.recent_sessions("other", 10) == []
    lines = await writer.session_lines([("t", "s4")])
    (only,) = lines[("t", "s4")]
    assert "candidates" not in only and only["outcome"] == {"status": 200, "usage": None}
    await writer.stop()
