"""The large-body budgets (issue 9, item 6): bytes per second per tenant and for the process,
slots, a line of tickets in order, bounded, and forgotten once idle. Pure: tickets, no waits."""

from __future__ import annotations

from extproc.core.bodies import ACTIVE_SECONDS, QUEUE_FACTOR, LargeBodies
from tests.conftest import FakeClock


def test_slots_are_per_tenant_and_handed_on_in_order():
    bodies = LargeBodies(100, per_tenant=2, wait_seconds=5)
    assert not bodies.large(99) and bodies.large(100)
    assert bodies.enter("a", 100).now and bodies.enter("a", 100).now
    assert bodies.enter("b", 100).now
    tickets = [bodies.enter("a", 100) for _ in range(3)]
    assert all(not t.now and not t.refused and t.ticket for t in tickets)
    assert not bodies.take("a", tickets[1].ticket)  # not first in line
    assert not bodies.take("a", tickets[0].ticket)  # first, but no slot free
    late = bodies.enter("a", 100)
    assert not late.now  # a line: newcomers queue behind it
    order = []
    for _ in range(3):
        head = bodies.leave("a")  # a slot frees: the gate names who is next
        assert head is not None and bodies.take("a", head)
        order.append(head)
    assert order == [t.ticket for t in tickets]
    assert bodies.cancel("a", late.ticket or "") is None  # gave up; no slot free to hand on
    for _ in range(2):
        bodies.leave("a")
    bodies.leave("a")
    bodies.leave("b")
    assert len(bodies) == 0


def test_the_line_is_bounded_and_a_waiter_that_gives_up_leaves_it():
    bodies = LargeBodies(1, per_tenant=1, wait_seconds=5)
    assert bodies.enter("a", 1).now
    line = [bodies.enter("a", 1) for _ in range(QUEUE_FACTOR)]
    assert all(t.ticket for t in line)
    assert bodies.enter("a", 1).refused  # the line is full: 429 at once
    # The head gives up while the slot is taken: nobody to wake yet.
    assert bodies.cancel("a", line[0].ticket or "") is None
    head = bodies.leave("a")
    assert head == line[1].ticket
    for ticket in line[1:]:
        bodies.cancel("a", ticket.ticket or "")
    assert len(bodies) == 0


def test_a_cancel_with_a_free_slot_names_the_next_waiter():
    clock = FakeClock()
    bodies = LargeBodies(1, per_tenant=1, wait_seconds=5, bytes_per_second=1, clock=clock)
    assert bodies.enter("a", 3).now  # 3 s of budget, a burst of one
    bodies.leave("a")
    clock.advance(0.5)  # the budget still owes: later bodies wait for it, not for a slot
    first, second = bodies.enter("a", 3), bodies.enter("a", 1)
    assert first.due > 0 and not bodies.take("a", first.ticket or "")  # not due yet
    assert bodies.cancel("a", first.ticket or "") == second.ticket
    clock.advance(10)
    assert bodies.take("a", second.ticket or "")
    bodies.leave("a")
    clock.advance(60)
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
    assert not later.now and later.due == 0.5
    assert bodies.enter("a", 8 * mib).due == 1.0
    assert bodies.enter("a", 40 * mib).due == 1.5  # within the wait: in line
    refused = bodies.enter("a", 8 * mib)
    assert refused.refused and refused.retry_after == 4  # 4 s of debt beyond the burst
    assert bodies.enter("b", 8 * mib).now  # another tenant's budget is its own
    clock.advance(0.5)
    assert bodies.take("a", later.ticket or "")  # its bytes are admitted now: in
    clock.advance(60)
    for _ in range(4):
        head = bodies.leave("a")
        if head is not None:
            assert bodies.take("a", head)
    bodies.leave("a")
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
    assert [a.due for a in first[5:]] == [0.25, 0.5, 0.75]
    assert bodies.enter("t9", 8 * mib).due == 1.0
    clock.advance(60)  # repaid
    assert bodies.enter("t0", 8 * mib).now


def test_the_process_budget_is_shared_by_the_tenants_at_work():
    """32 MiB/s for the process, 16 per tenant: alone a tenant may have its 16; with seven
    others sending anything (small requests too) it has an eighth of the 32, by weight; the
    others' share returns once they have been quiet ``ACTIVE_SECONDS``."""
    clock = FakeClock()
    mib = 1 << 20
    bodies = LargeBodies(mib, per_tenant=100, wait_seconds=10, bytes_per_second=16 * mib,
                         total_bytes_per_second=32 * mib, clock=clock, weights={"heavy": 3})
    assert bodies.share("a") == 16 * mib
    for tenant in "abcdefgh":
        bodies.seen(tenant)
    assert bodies.share("a") == 4 * mib
    assert bodies.share("heavy") == 32 * mib * 3 / 11  # not yet seen: counted with its weight
    bodies.seen("heavy")
    assert bodies.share("heavy") == 32 * mib * 3 / 11
    assert bodies.share("b") == 32 * mib / 11
    # Charged at its share: after the burst, a's 8 MiB bodies come every two seconds.
    assert [bodies.enter("a", 8 * mib).now for _ in range(2)] == [True, False]
    clock.advance(ACTIVE_SECONDS + 0.1)
    assert bodies.share("a") == 16 * mib
