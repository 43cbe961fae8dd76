"""When to read each worker's ``/metrics``: soon after it changes, rarely while it is idle.

A scrape is not free on either side. Read every 50 ms, a CPU vLLM's TTFT p50 was 56 ms where
it was 45 ms read every 0.5 s, and an idle processor spent 23.5 ms of CPU a second reading four
workers (issue 29). What changes a worker's queue is mostly the answer to a routing decision,
and the router counts its own requests in flight between scrapes (``Worker.requests``, flow
control's baselines), so the scrape follows what the router did instead of a fixed clock.

A worker is *busy*, and read at most every ``busy_seconds``, while:

- it has not been read yet, or it is down or stale (its return is noticed soon);
- the router has requests in flight on it;
- its last scrape showed requests running or waiting (load the router did not send: another
  replica's, or a client that reaches it directly);
- the router started or finished a request there since its last scrape (``Worker.routed``
  moved).

Otherwise it is *idle* and read every ``idle_seconds``: often enough that its signals never go
stale, rarely enough to cost nothing. A worker serving several pools (the same address in
two models) is read once. Pure: the clock is injected, the service does the reading.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..types import Clock
from .types import Worker


@dataclass(frozen=True, slots=True)
class Pace:
    """The least seconds between two scrapes of one worker, busy and idle."""

    busy_seconds: float
    idle_seconds: float

    @classmethod
    def of(cls, busy_seconds: float, idle_seconds: float, staleness_seconds: float) -> Pace:
        """The pace a configuration asks for: an idle worker is read at most half the
        staleness window apart (so a slow scrape does not make it stale), and never more
        often than a busy one."""
        idle = max(busy_seconds, min(idle_seconds, staleness_seconds / 2))
        return cls(busy_seconds, idle)


class ScrapePacer:
    def __init__(self, pace: Pace, *, clock: Clock) -> None:
        self.pace = pace
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}
        """address → (when it was last read, the router's ``routed`` count then)."""

    def due(self, workers: Iterable[Worker]) -> list[Worker]:
        """The workers to read now, one per address, recorded as read now (a failed read
        waits its turn like a good one); addresses no longer given are forgotten."""
        now = self._clock()
        found = _by_address(workers)
        for gone in self._last.keys() - found.keys():
            del self._last[gone]
        chosen = []
        for address, same in found.items():
            routed = sum(w.routed for w in same)
            if now >= self._next(address, same, routed):
                self._last[address] = (now, routed)
                chosen.append(same[0])
        return chosen

    def wait(self, workers: Iterable[Worker]) -> float:
        """Seconds until the next of ``workers`` is due (0: one is now; ``inf``: none given)."""
        found = _by_address(workers)
        if not found:
            return float("inf")
        soonest = min(self._next(a, same, sum(w.routed for w in same))
                      for a, same in found.items())
        return max(0.0, soonest - self._clock())

    def _next(self, address: str, same: list[Worker], routed: int) -> float:
        """When ``address`` is next due (its workers: one per pool it serves)."""
        last = self._last.get(address)
        if last is None:
            return float("-inf")
        at, routed_then = last
        busy = routed != routed_then or any(_busy(w) for w in same)
        return at + (self.pace.busy_seconds if busy else self.pace.idle_seconds)


def _busy(worker: Worker) -> bool:
    return (not worker.healthy or worker.stale or worker.in_flight > 0
            or worker.running + worker.waiting > 0)


def _by_address(workers: Iterable[Worker]) -> dict[str, list[Worker]]:
    found: dict[str, list[Worker]] = {}
    for worker in workers:
        found.setdefault(worker.address, []).append(worker)
    return found
