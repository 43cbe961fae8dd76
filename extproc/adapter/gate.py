"""The parse thread: large bodies are parsed off the event loop.

Bodies of at least ``limits.parse_thread_bytes`` are parsed on one worker thread: the event
loop serves other streams while the parse runs its Python steps, and large parses run one at a
time, whoever sends them (the large-body budgets of ``core.bodies`` bound how many there are).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class ParseThread:
    """One worker thread for the large parses (``Router.read`` is pure: it touches only its
    arguments, the immutable config and identity reader, and the thread-safe metrics)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="saar-parse")

    async def run(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
