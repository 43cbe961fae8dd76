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
  loop can spare: the budgets of tenants bound what one takes, this one what everybody takes.

A body that has to wait for any of them waits at most ``limits.large_body_wait_seconds`` (Envoy is
told to wait longer, as for admission's hold), in order; one that would wait longer, or finds
``QUEUE_FACTOR`` waiters per slot already, gets 429 ``tenant_busy`` with ``Retry-After`` at
once — at the request headers when content-length tells the size, so Envoy never sends the
body. Bodies of at least ``limits.parse_thread_bytes`` are parsed on one worker thread
(``ParseThread``): the event loop serves other streams while the parse runs its Python steps,
and large parses run one at a time, whoever sends them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")
QUEUE_FACTOR = 4
"""Waiters kept per slot; later ones are answered 429 at once."""


@dataclass
class _Tenant:
    busy: int = 0
    free_at: float = 0.0
    """When the tenant's byte budget is whole again (the cell-rate limit's one number)."""
    waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)


@dataclass(frozen=True, slots=True)
class Admission:
    """``enter``'s answer: go now, wait ``delay`` seconds then for a slot, or refuse."""

    now: bool
    delay: float = 0.0
    refused: bool = False
    retry_after: int = 1


class LargeBodies:
    """Per-tenant byte budgets and slots for large bodies. A tenant's entry lives while it has
    a body in flight or waiting, or budget spent in the last second: the table is bounded by
    the traffic of the last second."""

    def __init__(self, threshold: int, per_tenant: int, wait_seconds: float,
                 bytes_per_second: float = math.inf, total_bytes_per_second: float = math.inf,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.per_tenant = per_tenant
        self.wait_seconds = wait_seconds
        self.rate = bytes_per_second
        self.total_rate = total_bytes_per_second
        self._free_at = 0.0
        """When the process's byte budget is whole again."""
        self._clock = clock
        self._tenants: collections.OrderedDict[str, _Tenant] = collections.OrderedDict()

    def large(self, size: int) -> bool:
        return size >= self.threshold

    def __len__(self) -> int:
        """Tenants with a large body in flight or waiting, or budget spent lately."""
        self._sweep()
        return len(self._tenants)

    def enter(self, tenant: str, size: int) -> Admission:
        """Charge ``size`` bytes to the tenant's budget and take a slot: now, after a wait
        (``wait(tenant, delay)``), or not at all."""
        self._sweep()
        now = self._clock()
        entry = self._tenants.setdefault(tenant, _Tenant())
        self._tenants.move_to_end(tenant)
        burst = 1.0  # one second's worth
        delay = max(0.0, entry.free_at - burst - now, self._free_at - burst - now)
        slot = entry.busy < self.per_tenant and not entry.waiters
        if delay == 0 and slot:
            self._charge(entry, now, size)
            entry.busy += 1
            return Admission(True)
        if (delay > self.wait_seconds or self.wait_seconds <= 0
                or len(entry.waiters) >= QUEUE_FACTOR * self.per_tenant):
            self._prune(tenant, entry)
            return Admission(False, refused=True, retry_after=max(1, math.ceil(delay)))
        self._charge(entry, now, size)  # the budget is spent now: later bodies queue behind
        return Admission(False, delay)

    async def wait(self, tenant: str, delay: float = 0.0) -> bool:
        """After ``delay``, wait in line for a slot; all in at most ``wait_seconds``: True
        once the slot is ours."""
        entry = self._tenants.setdefault(tenant, _Tenant())
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if delay <= 0 and entry.busy < self.per_tenant and not entry.waiters:
            entry.busy += 1
            return True
        try:
            if delay > 0:
                await asyncio.sleep(delay)
                if entry.busy < self.per_tenant and not entry.waiters:
                    entry.busy += 1
                    return True
            entry.waiters.append(waiter)
            await asyncio.wait_for(waiter, max(0.0, self.wait_seconds - delay))
        except (TimeoutError, asyncio.CancelledError) as exc:
            # Not handed the slot (``leave`` skips a cancelled waiter): leave the line.
            with contextlib.suppress(ValueError):
                entry.waiters.remove(waiter)
            self._prune(tenant, entry)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return False
        return True

    def leave(self, tenant: str) -> None:
        """Give the slot back: to the first one waiting, else free it."""
        entry = self._tenants.get(tenant)
        if entry is None:
            return
        while entry.waiters:
            waiter = entry.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        entry.busy = max(0, entry.busy - 1)
        self._prune(tenant, entry)

    def _charge(self, entry: _Tenant, now: float, size: int) -> None:
        entry.free_at = max(entry.free_at, now) + size / self.rate
        self._free_at = max(self._free_at, now) + size / self.total_rate

    def _idle(self, entry: _Tenant) -> bool:
        return entry.busy == 0 and not entry.waiters and entry.free_at <= self._clock()

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


class ParseThread:
    """One worker thread for the large parses (``Router.read`` is pure: it touches only its
    arguments, the immutable config and identity reader, and the thread-safe metrics)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="saar-parse")

    async def run(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
