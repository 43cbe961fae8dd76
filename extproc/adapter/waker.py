"""Where held requests wait, and what wakes them: the I/O half of the exchange's holds.

A hold waits on its ``(kind, key)`` — a session admission paused, a model out, a large body's
ticket, a session whose issuer is not known yet — until someone wakes that key (admission's
tick resuming the session, the large-body gate freeing a slot, a claim applied here), its
``due`` time comes (the model's cool-down ends, the next look at the store) or its time runs
out. Every wait is a future: nothing polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ..state.records import Claim, Finish, Write


class Waker:
    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], list[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        """Keys someone waits on."""
        return len(self._waiting)

    async def wait(self, kind: str, key: str, timeout: float, due: float | None = None) -> bool:
        """Until woken or ``due`` (False), or ``timeout`` (True: late)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((kind, key), []).append(future)
        limit = timeout if due is None else min(due, timeout)
        try:
            await asyncio.wait_for(future, max(0.0, limit))
        except TimeoutError:
            return due is None or due >= timeout
        finally:
            left = self._waiting.get((kind, key))
            if left is not None and future in left:
                left.remove(future)
                if not left:
                    del self._waiting[(kind, key)]
        return False

    def wake(self, kind: str, key: str) -> None:
        for future in self._waiting.get((kind, key), ()):
            if not future.done():
                future.set_result(None)

    def applied(self, writes: Iterable[Write]) -> None:
        """Writes landed here: wake the requests settling on their sessions' issuers."""
        if not self._waiting:
            return
        for write in writes:
            if isinstance(write, Claim):
                key = write.owner.session
                for id_key in write.keys:  # a request following this id's chain
                    self.wake("settle", id_key)
            elif isinstance(write, Finish):
                key = write.turn.session_key
            else:
                continue
            if key is not None:
                self.wake("settle", key)
