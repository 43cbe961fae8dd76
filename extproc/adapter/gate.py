"""Bounds on what one tenant's large bodies cost everyone else.

A large body (``limits.large_body_bytes``, told by content-length before Envoy sends it, else
as it arrives) holds one of its tenant's ``limits.large_bodies_per_tenant`` slots while it is
read and routed; a further one waits for a slot in order, at most
``limits.large_body_wait_seconds`` (Envoy is told to wait, as for admission's hold), and then
gets 429 ``tenant_busy`` with ``Retry-After``; so do those beyond ``QUEUE_FACTOR`` waiters per
slot, at once. Bodies of at least ``limits.parse_thread_bytes`` are parsed on one worker thread
(``ParseThread``) so the event loop keeps serving the other streams between the parse's steps,
and so large parses run one at a time, whoever sends them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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
    waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)


class LargeBodies:
    """Per-tenant slots for large bodies. Entries exist only while a tenant has a large body
    in flight or waiting, so the table is bounded by the traffic in flight."""

    def __init__(self, threshold: int, per_tenant: int, wait_seconds: float) -> None:
        self.threshold = threshold
        self.per_tenant = per_tenant
        self.wait_seconds = wait_seconds
        self._tenants: dict[str, _Tenant] = {}

    def large(self, size: int) -> bool:
        return size >= self.threshold

    def __len__(self) -> int:
        """Tenants with a large body in flight or waiting."""
        return len(self._tenants)

    def enter(self, tenant: str) -> bool | None:
        """Take a slot now (True); None: wait for one (``wait``); False: refuse at once."""
        entry = self._tenants.setdefault(tenant, _Tenant())
        if entry.busy < self.per_tenant and not entry.waiters:
            entry.busy += 1
            return True
        if self.wait_seconds <= 0 or len(entry.waiters) >= QUEUE_FACTOR * self.per_tenant:
            self._prune(tenant, entry)
            return False
        return None

    async def wait(self, tenant: str) -> bool:
        """Wait in line for a slot, at most ``wait_seconds``: True once it is ours."""
        entry = self._tenants.setdefault(tenant, _Tenant())
        if entry.busy < self.per_tenant and not entry.waiters:
            entry.busy += 1
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry.waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, self.wait_seconds)
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

    def _prune(self, tenant: str, entry: _Tenant) -> None:
        if entry.busy == 0 and not entry.waiters:
            self._tenants.pop(tenant, None)


class ParseThread:
    """One worker thread for the large parses (``Router.read`` is pure: it touches only its
    arguments, the immutable config and identity reader, and the thread-safe metrics)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="saar-parse")

    async def run(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
