"""The large-body budgets (issue 9, item 6): bytes per second per tenant and for the process,
slots, in order, bounded, and forgotten once idle."""

from __future__ import annotations

import asyncio

from extproc.adapter.gate import QUEUE_FACTOR, LargeBodies, ParseThread
from tests.conftest import FakeClock


async def test_slots_are_per_tenant_and_handed_on_in_order():
    bodies = LargeBodies(100, per_tenant=2, wait_seconds=5)
    assert not bodies.large(99) and bodies.large(100)
    assert bodies.enter("a", 100).now and bodies.enter("a", 100).now
    assert bodies.enter("b", 100).now
    queued = bodies.enter("a", 100)
    assert not queued.now and not queued.refused  # wait
    order: list[int] = []

    async def waiter(n: int) -> None:
        assert await bodies.wait("a")
        order.append(n)

    tasks = [asyncio.ensure_future(waiter(n)) for n in range(3)]
    await asyncio.sleep(0.01)
    assert not bodies.enter("a", 100).now  # still a line: newcomers queue behind it
    for _ in range(3):
        bodies.leave("a")
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    for _ in range(2):
        bodies.leave("a")
    bodies.leave("b")
    assert len(bodies) == 0


async def test_a_wait_times_out_and_the_line_is_bounded():
    bodies = LargeBodies(1, per_tenant=1, wait_seconds=0.05)
    assert bodies.enter("a", 1).now
    assert await bodies.wait("a") is False
    assert len(bodies) == 1  # the holder only
    waits = [asyncio.ensure_future(bodies.wait("a")) for _ in range(QUEUE_FACTOR)]
    await asyncio.sleep(0)
    assert bodies.enter("a", 1).refused  # the line is full: 429 at once
    assert await asyncio.gather(*waits) == [False] * QUEUE_FACTOR
    bodies.leave("a")
    assert len(bodies) == 0


async def test_a_cancelled_waiter_leaves_the_line():
    bodies = LargeBodies(1, per_tenant=1, wait_seconds=5)
    assert bodies.enter("a", 1).now
    waiting = asyncio.ensure_future(bodies.wait("a"))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    bodies.leave("a")  # no one to hand it to
    assert len(bodies) == 0


def test_no_waiting_when_told_not_to():
    bodies = LargeBodies(1, per_tenant=1, wait_seconds=0)
    assert bodies.enter("a", 1).now
    assert bodies.enter("a", 1).refused


def test_bytes_per_second_with_a_burst_of_one_second():
    """16 MiB/s and 8 MiB bodies: three at once from idle (the burst), then two a second;
    a body that would wait longer than the wait is refused with the wait as Retry-After."""
    clock = FakeClock()
    mib = 1 << 20
    bodies = LargeBodies(mib, per_tenant=100, wait_seconds=2, bytes_per_second=16 * mib,
                         clock=clock)
    assert [bodies.enter("a", 8 * mib).now for _ in range(3)] == [True, True, True]
    later = bodies.enter("a", 8 * mib)
    assert not later.now and later.delay == 0.5
    assert bodies.enter("a", 8 * mib).delay == 1.0
    assert bodies.enter("a", 40 * mib).delay == 1.5  # within the wait: in line
    refused = bodies.enter("a", 8 * mib)
    assert refused.refused and refused.retry_after == 4  # 4 s of debt beyond the burst
    assert bodies.enter("b", 8 * mib).now  # another tenant's budget is its own
    clock.advance(60)
    for _ in range(3):
        bodies.leave("a")
    bodies.leave("b")
    assert len(bodies) == 0  # idle and repaid: forgotten


def test_many_credentials_share_the_process_budget():
    """16 MiB/s per tenant, 32 MiB/s in all, 8 MiB bodies from eight credentials at once: the
    process budget admits five (a second's worth and the burst), then one every quarter second
    whoever sends it; each tenant's own budget is untouched by the others'."""
    clock = FakeClock()
    mib = 1 << 20
    bodies = LargeBodies(mib, per_tenant=100, wait_seconds=2, bytes_per_second=16 * mib,
                         total_bytes_per_second=32 * mib, clock=clock)
    first = [bodies.enter(f"t{n}", 8 * mib) for n in range(8)]
    assert [a.now for a in first] == [True] * 5 + [False] * 3
    assert [a.delay for a in first[5:]] == [0.25, 0.5, 0.75]
    assert bodies.enter("t9", 8 * mib).delay == 1.0
    clock.advance(60)  # repaid
    assert bodies.enter("t0", 8 * mib).now


async def test_a_waiter_for_budget_sleeps_then_takes_a_slot():
    bodies = LargeBodies(1, per_tenant=1, wait_seconds=1, bytes_per_second=100)
    assert bodies.enter("a", 150).now  # 1.5 s of budget: the next waits 0.5 s
    bodies.leave("a")
    admission = bodies.enter("a", 10)
    assert not admission.now and 0.4 < admission.delay <= 0.5
    assert await bodies.wait("a", 0.01) is True


async def test_the_parse_thread_runs_calls_off_the_loop():
    import threading

    parser = ParseThread()
    try:
        name = await parser.run(lambda: threading.current_thread().name)
    finally:
        parser.close()
    assert name.startswith("saar-parse")
