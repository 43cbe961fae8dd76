"""``saar bench store``: the shared store's two request-path calls, on one server and on a
three-primary cluster, each started on loopback for the run.

Per store, a call at a time (the latency a request waits for) and ``CONCURRENCY`` at a time
(what one process pushes through its pipelined connections), for: a load of a session alone
(what the headers prefetch), a load with the owners of three ids (a tool result that names
calls), a commit (a compare-and-set write of one record) and an answer's end (the record and
three claimed ids: one script on one server, up to four slots in a cluster). Each call is a
fresh session, so a cluster's calls go to every primary. Figures are microseconds of wall time
on this (shared, noisy) machine: compare the rows, not the absolute numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...state.records import Claim, Commit, Finish, Owner, Turn, owner_key
from ...state.redis import RedisStore
from ...state.store import Query
from ...types import Phase, Usage
from ..harness import store_server

CALLS = 2000
CONCURRENCY = 16
STORES = ("redis", "redis-cluster")


def _turn(n: int, session: str) -> Turn:
    return Turn(f"rp-{n}", session, "t", "m1", "d", Phase.NORMAL, False, 1000, float(n), "w1")


def _ids(n: int) -> tuple[str, ...]:
    return tuple(owner_key("t", f"call_{n}_{i}") for i in range(3))


OPS: dict[str, Callable[[RedisStore, int], Awaitable[Any]]] = {
    "load session": lambda store, n: store.load(Query(f"t/s{n}")),
    "load + 3 owners": lambda store, n: store.load(Query(f"t/s{n}", _ids(n))),
    "commit": lambda store, n: store.apply([Commit(_turn(n, f"t/c{n}"))], float(n)),
    "finish + 3 claims": lambda store, n: store.apply(
        [Finish(_turn(n, f"t/f{n}"), True, Usage(1000, 10, 900), ("call",)),
         Claim(_ids(n), Owner("m1", "w1", f"t/f{n}"))], float(n)),
}


async def _measure(store: RedisStore, op: Callable[[RedisStore, int], Awaitable[Any]],
                   base: int) -> dict[str, float]:
    for n in range(200):  # warm: connections, scripts, the slot map
        await op(store, base + n)
    samples = []
    for n in range(CALLS):
        started = time.perf_counter()
        await op(store, base + 1000 + n)
        samples.append(time.perf_counter() - started)
    samples.sort()
    queue = iter(range(base + 10_000, base + 10_000 + CALLS))

    async def worker() -> None:
        for n in queue:
            await op(store, n)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    return {"p50_us": samples[len(samples) // 2] * 1e6,
            "p99_us": samples[int(len(samples) * 0.99)] * 1e6,
            "mean_us": statistics.fmean(samples) * 1e6,
            f"ops_per_s_c{CONCURRENCY}": CALLS / elapsed}


async def _bench(url: str) -> dict[str, dict[str, float]]:
    store = RedisStore(url, prefix="bench", session_ttl=60, owner_ttl=60)
    try:
        return {name: await _measure(store, op, 100_000 * index)
                for index, (name, op) in enumerate(OPS.items())}
    finally:
        await store.close()


def run(kinds: tuple[str, ...] = STORES) -> dict[str, dict[str, dict[str, float]]]:
    results = {}
    for kind in kinds:
        with store_server(kind) as (_, url):
            gc.collect()
            with _gc_off():
                results[kind] = asyncio.run(_bench(url))
    return results


@contextlib.contextmanager
def _gc_off() -> Any:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def main(kinds: tuple[str, ...] = STORES, *, as_json: bool = False) -> int:
    results = run(kinds)
    print(f"{'store':<15} {'call':<18} {'p50 µs':>8} {'p99 µs':>8} {'mean µs':>8} "
          f"{'ops/s c=' + str(CONCURRENCY):>11}")
    for kind, rows in results.items():
        for name, row in rows.items():
            print(f"{kind:<15} {name:<18} {row['p50_us']:>8.0f} {row['p99_us']:>8.0f} "
                  f"{row['mean_us']:>8.0f} {row[f'ops_per_s_c{CONCURRENCY}']:>11.0f}")
    if as_json:
        print(json.dumps(results))
    return 0
