"""The running service in process: gRPC health, the Replay service and the HTTP port."""

from __future__ import annotations

from dataclasses import replace

import grpc
import httpx
import orjson
import pytest
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc._proto import replay_pb2, replay_pb2_grpc
from extproc.core.router import LocalDriver
from extproc.service.app import start
from extproc.service.readiness import HEALTH_SERVICES, NOT_SERVING
from extproc.types import Api

ADMIN_TOKEN = "test-admin-token-0123456789"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
async def service(config, tmp_path):
    token = tmp_path / "admin-token"
    token.write_text(ADMIN_TOKEN + "\n")
    running = await start(replace(config, server=replace(config.server, grpc_port=0,
                                                         http_port=0),
                                  admin=replace(config.admin, token_file=str(token))))
    yield running
    await running.stop()


async def test_grpc_health_serves_every_service_envoy_and_kubernetes_ask(service):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in HEALTH_SERVICES:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert "envoy.service.ext_proc.v3.ExternalProcessor" in HEALTH_SERVICES


async def test_replay_over_grpc_and_http(service):
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor"}]})
    routed = LocalDriver(service.parts.router).route(Api.CHAT, {"x-session-id": "s-app"}, body)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = replay_pb2_grpc.ReplayStub(channel)
        metadata = tuple(ADMIN.items())
        record = await stub.GetRecord(replay_pb2.GetRecordRequest(replay_id=routed.replay_id),
                                      metadata=metadata)
        assert record["model"] == routed.model
        listed = await stub.ListSession(replay_pb2.ListSessionRequest(session_id="s-app"),
                                        metadata=metadata)
        assert [r["replay_id"] for r in listed.records] == [routed.replay_id]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetRecord(replay_pb2.GetRecordRequest(replay_id="nope"), metadata=metadata)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}",
                                 headers=ADMIN) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.get(f"/v1/replay/{routed.replay_id}")).json()["model"] == routed.model
        assert (await http.get("/v1/replay/nope")).status_code == 404
        assert (await http.get("/v1/replay")).status_code == 400
        assert "saar_decisions_total" in (await http.get("/metrics")).text


async def test_workers_file_is_reloaded_without_a_restart(config, tmp_path):
    import asyncio

    workers = tmp_path / "workers.yaml"
    workers.write_text("qwen3-8b: [10.0.0.7:8000]\n")
    scheduling = replace(config.scheduling, workers_file=str(workers))
    running = await start(replace(config, scheduling=scheduling, server=replace(
        config.server, grpc_port=0, http_port=0)))
    try:
        def pool() -> set[str]:
            return {w.address for w in running.parts.pools.registry.pool("qwen3-8b")}

        for _ in range(40):
            if "10.0.0.7:8000" in pool():
                break
            await asyncio.sleep(0.05)
        assert pool() == {"127.0.0.1:8101", "10.0.0.7:8000"}
        workers.write_text("qwen3-8b: [10.0.0.8:8000]\n")
        for _ in range(60):
            if "10.0.0.8:8000" in pool():
                break
            await asyncio.sleep(0.05)
        assert pool() == {"127.0.0.1:8101", "10.0.0.8:8000"}
    finally:
        await running.stop()


async def test_a_worker_whose_metrics_are_unreachable_leaves_the_pick(config):
    import asyncio

    from extproc.dev.harness import free_port

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    models = {**config.models,
              "qwen3-8b": replace(config.models["qwen3-8b"], endpoints=(dead, "127.0.0.1:8101"))}
    running = await start(replace(config, models=models, server=replace(
        config.server, grpc_port=0, http_port=0)))
    try:
        def health() -> dict[str, bool]:
            return {w.address: w.healthy for w in running.parts.pools.registry.pool("qwen3-8b")}

        for _ in range(60):
            if not health()[dead]:
                break
            await asyncio.sleep(0.05)
        assert health()[dead] is False
    finally:
        await running.stop()


def _turn(session: str) -> list[ep.ProcessingRequest]:
    """What Envoy sends the routing filter for one answered chat turn."""
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor"}]})

    def headers(pairs: dict[str, str]) -> ep.HttpHeaders:
        return ep.HttpHeaders(headers=core.HeaderMap(headers=[
            core.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]))

    return [
        ep.ProcessingRequest(request_headers=headers({
            ":method": "POST", ":path": "/v1/chat/completions", ":authority": "saar",
            "content-type": "application/json", "x-session-id": session,
            "content-length": str(len(body))})),
        ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True)),
        ep.ProcessingRequest(response_headers=headers({":status": "200",
                                                       "content-type": "application/json"})),
    ]


@pytest.mark.parametrize("reset", [False, True], ids=["waits-for-status", "resets-like-envoy"])
async def test_a_stream_half_closed_commits_its_turn_and_ends_cleanly(service, reset):
    """Envoy half-closes and resets every stream at once; a plain gRPC client half-closes and
    waits for the status. Either way the turn is committed and nothing counts as a failure."""
    import asyncio

    session = f"s-close-{reset}"
    failures = service.parts.metrics.stream_failures._value.get()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = ep_grpc.ExternalProcessorStub(channel).Process()
        for message in _turn(session):
            await call.write(message)
            assert (await call.read()).WhichOneof("response") == message.WhichOneof("request")
        await call.done_writing()
        if reset:
            call.cancel()
        else:
            assert await call.code() == grpc.StatusCode.OK
    for _ in range(100):
        records = service.parts.replay.for_session(session)
        if records and "latency_ms" in (records[0].get("outcome") or {}):
            break
        await asyncio.sleep(0.01)
    assert [(r["outcome"] or {}).get("status") for r in records] == [200]
    assert "latency_ms" in records[0]["outcome"]  # the turn ended: the stream's close ran
    assert service.parts.metrics.stream_failures._value.get() == failures


# --- readiness and the drain (issue 32) -------------------------------------------------------

async def _readiness(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="readiness"))
        return reply.status


async def _answered(channel: grpc.aio.Channel, session: str) -> list[str]:
    """One whole turn on a new stream: the kind of each reply."""
    call = ep_grpc.ExternalProcessorStub(channel).Process()
    kinds = []
    for message in _turn(session):
        await call.write(message)
        kinds.append((await call.read()).WhichOneof("response"))
    await call.done_writing()
    return kinds


async def test_readyz_says_ready_while_healthz_says_live(service):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as http:
        ready = await http.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        await service.readiness.drain()
        draining = await http.get("/readyz")
        assert (draining.status_code, draining.json()) == (503, {"status": "draining"})
        assert (await http.get("/healthz")).status_code == 200  # liveness is the process's


async def test_readyz_is_503_until_the_store_answers(config, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    unreachable = replace(config, server=replace(config.server, grpc_port=0, http_port=0),
                          state=replace(config.state, store="redis",
                                        redis_url="redis://127.0.0.1:9/0"),
                          identity=replace(config.identity, tenant_secret_file=str(secret)))
    running = await start(unreachable)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.http_port}") as http:
            starting = await http.get("/readyz")
            assert (starting.status_code, starting.json()) == (503, {"status": "starting"})
            assert (await http.get("/healthz")).status_code == 200
    finally:
        await running.stop()


async def test_the_drain_takes_new_streams_through_its_notice_then_waits_for_those_open(
        service):
    """Not ready at once; a stream opened during the notice is served; after it new streams
    are refused, and the drain ends when the last stream open (here one waiting for its
    upstream's answer, as a long prefill does) has ended, well before its timeout."""
    import asyncio

    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        waiting = ep_grpc.ExternalProcessorStub(channel).Process()
        request, body, answer = _turn("s-drain-open")
        for message in (request, body):
            await waiting.write(message)
            await waiting.read()
        drain = asyncio.create_task(service.drain(0.5, 30.0))
        await asyncio.sleep(0.1)
        assert await _readiness(service.grpc_port) == NOT_SERVING
        assert service.processor.streams == 1
        # During the notice (Envoy has not seen not-ready yet): a new stream is served.
        assert await _answered(channel, "s-drain-notice") == [
            "request_headers", "request_body", "response_headers"]
        await asyncio.sleep(0.6)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _answered(channel, "s-drain-late")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        await asyncio.sleep(0.5)
        assert not drain.done()  # the stream still open holds the drain
        await waiting.write(answer)
        assert (await waiting.read()).WhichOneof("response") == "response_headers"
        await waiting.done_writing()
        assert await waiting.code() == grpc.StatusCode.OK
        await asyncio.wait_for(drain, 5)
    assert service.processor.streams == 0


async def test_the_drain_cuts_what_is_still_open_at_its_timeout(service):
    import asyncio
    import time

    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stuck = ep_grpc.ExternalProcessorStub(channel).Process()
        request, body, _ = _turn("s-drain-stuck")
        for message in (request, body):
            await stuck.write(message)
            await stuck.read()
        began = time.monotonic()
        await asyncio.wait_for(service.drain(0.0, 0.3), 5)
        assert 0.3 <= time.monotonic() - began < 3
        assert await stuck.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_drain_lets_what_flow_control_holds_go(config, tmp_path):
    """A request queued behind a saturated pool when the drain begins is woken to go (to its
    engine's own queue): left queued, it would wait for room the other replicas fill first."""
    import asyncio

    from extproc.scheduling.flow import Arrival
    from extproc.scheduling.types import Worker

    flowing = replace(config, server=replace(config.server, grpc_port=0, http_port=0),
                      scheduling=replace(config.scheduling, flow_control=replace(
                          config.scheduling.flow_control, enabled=True)))
    running = await start(flowing)
    try:
        flow, waker = running.parts.pools.flow, running.background._waker
        saturated = [Worker("127.0.0.1:8101", "qwen3-8b", waiting=9, kv_usage=0.9,
                            scraped_at=1.0)]
        entered = flow.enter(Arrival("qwen3-8b", "t", "p", "interactive", "turn", 1000),
                             saturated)
        assert entered.ticket is not None
        held = asyncio.create_task(waker.wait("queue", entered.ticket, 10.0))
        await asyncio.sleep(0.05)
        await running.drain(0.0, 1.0)
        assert await asyncio.wait_for(held, 1) is False  # woken, not timed out
        assert flow.claim(entered.ticket, late=False) == "go"
    finally:
        await running.stop()
