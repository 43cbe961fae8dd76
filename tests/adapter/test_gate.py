"""The per-tenant large-body slots (issue 9, item 6): in order, bounded, and forgotten."""

from __future__ import annotations

import asyncio

from extproc.adapter.gate import QUEUE_FACTOR, LargeBodies, ParseThread


async def test_slots_are_per_tenant_and_handed_on_in_order():
    bodies = LargeBodies(100, per_tenant=2, wait_seconds=5)
    assert not bodies.large(99) and bodies.large(100)
    assert bodies.enter("a") is True and bodies.enter("a") is True
    assert bodies.enter("b") is True
    assert bodies.enter("a") is None  # wait
    order: list[int] = []

    async def waiter(n: int) -> None:
        assert await bodies.wait("a")
        order.append(n)

    tasks = [asyncio.ensure_future(waiter(n)) for n in range(3)]
    await asyncio.sleep(0.01)
    assert bodies.enter("a") is None  # still a line: newcomers queue behind it
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
    assert bodies.enter("a")
    assert await bodies.wait("a") is False
    assert len(bodies) == 1  # the holder only
    waits = [asyncio.ensure_future(bodies.wait("a")) for _ in range(QUEUE_FACTOR)]
    await asyncio.sleep(0)
    assert bodies.enter("a") is False  # the line is full: 429 at once
    assert await asyncio.gather(*waits) == [False] * QUEUE_FACTOR
    bodies.leave("a")
    assert len(bodies) == 0


async def test_a_cancelled_waiter_leaves_the_line():
    bodies = LargeBodies(1, per_tenant=1, wait_seconds=5)
    assert bodies.enter("a")
    waiting = asyncio.ensure_future(bodies.wait("a"))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    bodies.leave("a")  # no one to hand it to
    assert len(bodies) == 0


def test_no_waiting_when_told_not_to():
    bodies = LargeBodies(1, per_tenant=1, wait_seconds=0)
    assert bodies.enter("a") is True
    assert bodies.enter("a") is False


async def test_the_parse_thread_runs_calls_off_the_loop():
    import threading

    parser = ParseThread()
    try:
        name = await parser.run(lambda: threading.current_thread().name)
    finally:
        parser.close()
    assert name.startswith("saar-parse")
