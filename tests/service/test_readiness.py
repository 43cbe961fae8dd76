"""Readiness, said alike on gRPC health and ``/readyz``: starting, ready, draining."""

from __future__ import annotations

from grpc_health.v1 import health

from extproc.service.readiness import (
    HEALTH_SERVICES,
    NOT_SERVING,
    READY_SERVICES,
    SERVING,
    Readiness,
)


async def statuses(servicer: health.aio.HealthServicer) -> dict[str, int]:
    return {name: servicer._server_status[name] for name in HEALTH_SERVICES}


async def test_starting_then_ready_then_draining() -> None:
    servicer = health.aio.HealthServicer()
    readiness = Readiness(servicer)
    await readiness.start()
    assert (readiness.state, readiness.serving) == ("starting", False)
    assert await statuses(servicer) == {
        n: NOT_SERVING if n in READY_SERVICES else SERVING for n in HEALTH_SERVICES}
    await readiness.set_ready()
    assert readiness.serving and readiness.ready.is_set()
    assert set((await statuses(servicer)).values()) == {SERVING}
    await readiness.drain()
    assert (readiness.state, readiness.serving) == ("draining", False)
    assert {n: s for n, s in (await statuses(servicer)).items() if s == NOT_SERVING} == {
        n: NOT_SERVING for n in READY_SERVICES}


async def test_a_replica_that_drains_before_it_was_ready_never_becomes_ready() -> None:
    """The readiness gate (workers listed, store answered) may finish after a SIGTERM."""
    servicer = health.aio.HealthServicer()
    readiness = Readiness(servicer)
    await readiness.start()
    await readiness.drain()
    await readiness.set_ready()
    assert readiness.state == "draining" and not readiness.ready.is_set()
    assert all(servicer._server_status[n] == NOT_SERVING for n in READY_SERVICES)
