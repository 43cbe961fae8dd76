"""Bounds on what one tenant's large bodies cost everyone else.

A large body (``limits.large_body_bytes``, told by content-length before Envoy sends it, else
as it arrives) needs two things of its tenant's budget before it is read and routed:

* **bytes**: each tenant may have ``limits.large_body_bytes_per_second`` of large bodies
  admitted per second, with a burst of one second's worth (a cell-rate limit: one number per
  tenant, the time its budget is free again). A single large body always fits an idle budget;
  four clients looping 8 MiB bodies under one credential get two through per second at the
  default 16 MiB/s, however fast they send;
* **a slot**: at most ``limits.large_bodies_per_tenant`` are read and routed at a time;
* **the process's bytes**: all tenants together may have
  ``limits.large_body_bytes_per_second_total`` admitted per second (the same cell-rate limit,
  one number for the process), so many credentials cannot add up to more parsing than the event
  loop can spare;
* **its share of them**: that total is shared by the tenants that sent any request in the last
  ``ACTIVE_SECONDS`` (by their flow-control weight), and a tenant's large bodies are charged to
  its share — a tenant of small requests keeps the processor time its share stands for, however
  many credentials loop large bodies beside it; a tenant alone may use the whole total.

A body that has to wait waits in its tenant's line, in order, at most
``limits.large_body_wait_seconds`` (the exchange holds it: Envoy is told to wait longer); one
that would wait longer, or finds ``QUEUE_FACTOR`` waiters per slot already, gets 429
``tenant_busy`` with ``Retry-After`` at once — at the request headers when content-length tells
the size, so Envoy never sends the body.

Pure and synchronous: a waiter is a ticket. ``enter`` says go, wait (from when) or refuse;
``take`` is the waiter's try once woken; ``leave`` frees a slot and names the ticket to wake.
The service's waker turns tickets into wake-ups, so nothing here polls or sleeps.
"""

from __future__ import annotations

import collections
import itertools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

QUEUE_FACTOR = 4
"""Waiters kept per slot; later ones are answered 429 at once."""
ACTIVE_SECONDS = 2.0
"""A tenant that sent a request this recently has a share of the process's large-body budget."""


@dataclass(slots=True)
class _Tenant:
    busy: int = 0
    free_at: float = 0.0
    """When the tenant's byte budget is whole again (the cell-rate limit's one number)."""
    line: collections.OrderedDict[str, float] = field(default_factory=collections.OrderedDict)
    """Tickets waiting, first in line first, each with when its bytes are admitted."""


@dataclass(frozen=True, slots=True)
class Admission:
    """``enter``'s answer: go ``now``; or wait in line as ``ticket`` (``due``: seconds until its
    bytes are admitted); or ``refused`` (``retry_after`` seconds)."""

    now: bool
    ticket: str | None = None
    due: float = 0.0
    refused: bool = False
    retry_after: int = 1


class LargeBodies:
    """Per-tenant byte budgets and slots for large bodies. A tenant's entry lives while it has
    a body in flight or waiting, or budget spent in the last second: the table is bounded by
    the traffic of the last second."""

    def __init__(self, threshold: int, per_tenant: int, wait_seconds: float,
                 bytes_per_second: float = math.inf, total_bytes_per_second: float = math.inf,
                 *, clock: Callable[[], float] = time.monotonic,
                 weights: Mapping[str, float] | None = None) -> None:
        """``weights``: tenant → share weight (default 1), flow control's."""
        self.threshold = threshold
        self.per_tenant = per_tenant
        self.wait_seconds = wait_seconds
        self.rate = bytes_per_second
        self.total_rate = total_bytes_per_second
        self._weights = dict(weights or {})
        self._free_at = 0.0
        """When the process's byte budget is whole again."""
        self._active: collections.OrderedDict[str, float] = collections.OrderedDict()
        """Tenant → when it last sent a request, the least recent first."""
        self._active_weight = 0.0
        """The sum of the active tenants' weights."""
        self._clock = clock
        self._tenants: collections.OrderedDict[str, _Tenant] = collections.OrderedDict()
        self._tickets = (f"lb-{n}" for n in itertools.count())

    def large(self, size: int) -> bool:
        return size >= self.threshold

    def seen(self, tenant: str) -> None:
        """``tenant`` sent a request (of any size): it has a share of the process's budget
        for the next ``ACTIVE_SECONDS``."""
        now = self._clock()
        if tenant not in self._active:
            self._active_weight += self._weights.get(tenant, 1.0)
        self._active[tenant] = now
        self._active.move_to_end(tenant)
        self._expire(now)

    def share(self, tenant: str) -> float:
        """The bytes per second of large bodies ``tenant`` may have now: its own budget, and
        its weight's part of the process's among the active tenants (itself counted)."""
        self._expire(self._clock())
        weight = self._weights.get(tenant, 1.0)
        active = self._active_weight + (0.0 if tenant in self._active else weight)
        return min(self.rate, self.total_rate * weight / active)

    def _expire(self, now: float) -> None:
        while self._active:
            tenant, last = next(iter(self._active.items()))
            if last > now - ACTIVE_SECONDS:
                return
            del self._active[tenant]
            self._active_weight -= self._weights.get(tenant, 1.0)
        self._active_weight = 0.0  # none left: no rounding carried over

    def __len__(self) -> int:
        """Tenants with a large body in flight or waiting, or budget spent lately."""
        self._sweep()
        return len(self._tenants)

    def enter(self, tenant: str, size: int) -> Admission:
        """Charge ``size`` bytes to the tenant's budget and take a slot: now, after a wait in
        line, or not at all."""
        self._sweep()
        now = self._clock()
        entry = self._tenants.setdefault(tenant, _Tenant())
        self._tenants.move_to_end(tenant)
        burst = 1.0  # one second's worth
        delay = max(0.0, entry.free_at - burst - now, self._free_at - burst - now)
        if delay == 0 and entry.busy < self.per_tenant and not entry.line:
            self._charge(tenant, entry, now, size)
            entry.busy += 1
            return Admission(True)
        if (delay > self.wait_seconds or self.wait_seconds <= 0
                or len(entry.line) >= QUEUE_FACTOR * self.per_tenant):
            self._prune(tenant, entry)
            return Admission(False, refused=True, retry_after=max(1, math.ceil(delay)))
        self._charge(tenant, entry, now, size)  # the budget is spent now: later bodies queue behind
        ticket = next(self._tickets)
        entry.line[ticket] = now + delay
        return Admission(False, ticket, delay)

    def take(self, tenant: str, ticket: str) -> bool:
        """The waiter ``ticket`` tries for its slot: True (it is in) when it heads the line,
        its bytes are admitted and a slot is free."""
        entry = self._tenants.get(tenant)
        if entry is None or not entry.line:
            return False
        head, due = next(iter(entry.line.items()))
        if head != ticket or due > self._clock() or entry.busy >= self.per_tenant:
            return False
        del entry.line[ticket]
        entry.busy += 1
        return True

    def leave(self, tenant: str) -> str | None:
        """Give the slot back; the ticket that heads the line now (to wake), if any."""
        entry = self._tenants.get(tenant)
        if entry is None:
            return None
        entry.busy = max(0, entry.busy - 1)
        head = next(iter(entry.line), None)
        self._prune(tenant, entry)
        return head

    def cancel(self, tenant: str, ticket: str) -> str | None:
        """The waiter gave up (its wait ran out, or the client left): out of the line; the
        ticket heading the line now, when a slot is free for it (to wake)."""
        entry = self._tenants.get(tenant)
        if entry is None or entry.line.pop(ticket, None) is None:
            return None
        head = next(iter(entry.line), None)
        self._prune(tenant, entry)
        return head if entry.busy < self.per_tenant else None

    def _charge(self, tenant: str, entry: _Tenant, now: float, size: int) -> None:
        entry.free_at = max(entry.free_at, now) + size / self.share(tenant)
        self._free_at = max(self._free_at, now) + size / self.total_rate

    def _idle(self, entry: _Tenant) -> bool:
        return entry.busy == 0 and not entry.line and entry.free_at <= self._clock()

    def _prune(self, tenant: str, entry: _Tenant) -> None:
        if self._idle(entry):
            self._tenants.pop(tenant, None)

    def _sweep(self) -> None:
        """Drop idle tenants from the least recently used end (amortised O(1))."""
        while self._tenants:
            entry = next(iter(self._tenants.values()))
            if not self._idle(entry):
                return
            self._tenants.popitem(last=False)
