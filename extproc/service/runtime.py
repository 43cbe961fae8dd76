"""Gauges of the running process, read when ``/metrics`` is scraped: what a soak watches.

* ``saar_asyncio_tasks``: tasks alive on the service's event loop (a leak grows it);
* ``saar_table_entries{table}``: the size of every bounded table the router keeps — session
  records and owners of the local store, the live sessions every component hangs its slots
  on, replay records and their per-session index,
  admission programs, the prompt memos and their blocks, the prefix index's blocks, the
  session-prefix index, KV hint sessions, tenants with large bodies in flight, the keys held
  requests wait on, the sessions whose figures are being gathered (a fixed set of names:
  bounded series);
* ``saar_gc_seconds{generation}``: the garbage collector's pauses (they stop the event loop);
* ``saar_python_heap_blocks``: memory blocks the interpreter has allocated
  (``sys.getallocatedblocks``): resident memory that grows while this stays flat is native
  (an extension's, the allocator's), not Python objects kept alive;
* ``process_resident_memory_bytes`` and the rest of Prometheus' process collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..adapter.waker import Waker
from ..assembly import Parts
from ..observability.figures import Figures
from ..state.layer import StateLayer

_REGISTERED: weakref.WeakKeyDictionary[CollectorRegistry, RuntimeCollector] = (
    weakref.WeakKeyDictionary())


class RuntimeCollector(Collector):
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tables: dict[str, Callable[[], Any]] = {}
        self.gc: GcTimer | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.loop is not None and not self.loop.is_closed():
            tasks = GaugeMetricFamily("saar_asyncio_tasks",
                                      "Tasks alive on the service's event loop")
            tasks.add_metric([], len(asyncio.all_tasks(self.loop)))
            yield tasks
        blocks = GaugeMetricFamily("saar_python_heap_blocks",
                                   "Memory blocks the interpreter has allocated")
        blocks.add_metric([], sys.getallocatedblocks())
        yield blocks
        entries = GaugeMetricFamily("saar_table_entries",
                                    "Entries of the router's bounded tables", labels=["table"])
        for name, size in self.tables.items():
            with contextlib.suppress(Exception):  # a table this build does not have
                value = size()
                if value is not None:
                    entries.add_metric([name], float(value))
        yield entries


class GcTimer:
    """Times every collection (``gc.callbacks``) into a histogram by generation."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            "saar_gc_seconds", "Garbage collector pauses, by generation", ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0), registry=registry)
        self._started = 0.0
        self.open()

    def open(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self.seconds.labels(str(info.get("generation"))).observe(
                time.perf_counter() - self._started)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self)


def register(parts: Parts, state: StateLayer, waker: Waker,
             figures: Figures) -> RuntimeCollector:
    """Export the gauges in the parts' registry (once per registry; a second service on the
    same parts takes them over)."""
    registry = parts.metrics.registry
    collector = _REGISTERED.get(registry)
    if collector is None:
        collector = _REGISTERED[registry] = RuntimeCollector()
        registry.register(collector)
        with contextlib.suppress(ValueError):  # already there
            ProcessCollector(registry=registry)
        collector.gc = GcTimer(registry)
    elif collector.gc is not None:
        collector.gc.open()
    collector.loop = asyncio.get_running_loop()
    pools, replay, large_bodies = parts.pools, parts.replay, parts.bodies
    collector.tables = {
        "sessions": lambda: len(state.local),
        "live_sessions": lambda: len(parts.table),
        "owners": state.local.owners,
        "replay_records": lambda: len(replay),
        "replay_index": replay.index_size,
        "admission_programs": lambda: len(pools.admission),
        "prompt_memos": lambda: len(pools.memo),
        "prompt_memo_blocks": lambda: pools.memo.held,
        "prefix_index_blocks": lambda: len(pools.index),
        "session_prefix_blocks": lambda: None if pools.sessions is None else pools.sessions.blocks,
        "kv_hint_sessions": lambda: None if pools.hints is None else len(pools.hints),
        "large_body_tenants": lambda: len(large_bodies),
        "held_keys": lambda: len(waker),
        "session_figures": lambda: len(figures),
    }
    return collector


def release(parts: Parts) -> None:
    """The service stopped: stop timing the collector for it."""
    collector = _REGISTERED.get(parts.metrics.registry)
    if collector is not None and collector.gc is not None:
        collector.gc.close()
