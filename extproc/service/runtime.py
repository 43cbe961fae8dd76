"""Gauges of the running process, read when ``/metrics`` is scraped: what a soak watches.

* ``saar_asyncio_tasks``: tasks alive on the service's event loop (a leak grows it);
* ``saar_table_entries{table}``: the size of every bounded table the router keeps — session
  records and owners of the local store, replay records and their per-session index,
  admission programs, the prompt memos and their blocks, the session-prefix index, KV hint
  sessions, tenants with large bodies in flight (a fixed set of names: bounded series);
* ``process_resident_memory_bytes`` and the rest of Prometheus' process collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.router import Router
from ..state.layer import StateLayer

_REGISTERED: weakref.WeakKeyDictionary[CollectorRegistry, RuntimeCollector] = (
    weakref.WeakKeyDictionary())


class RuntimeCollector(Collector):
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tables: dict[str, Callable[[], Any]] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.loop is not None and not self.loop.is_closed():
            tasks = GaugeMetricFamily("saar_asyncio_tasks",
                                      "Tasks alive on the service's event loop")
            tasks.add_metric([], len(asyncio.all_tasks(self.loop)))
            yield tasks
        entries = GaugeMetricFamily("saar_table_entries",
                                    "Entries of the router's bounded tables", labels=["table"])
        for name, size in self.tables.items():
            with contextlib.suppress(Exception):  # a table this build does not have
                value = size()
                if value is not None:
                    entries.add_metric([name], float(value))
        yield entries


def register(router: Router, state: StateLayer, large_bodies: Any = None) -> RuntimeCollector:
    """Export the gauges in the router's registry (once per registry; a second service on the
    same router takes them over)."""
    registry = router.metrics.registry
    collector = _REGISTERED.get(registry)
    if collector is None:
        collector = _REGISTERED[registry] = RuntimeCollector()
        registry.register(collector)
        with contextlib.suppress(ValueError):  # already there
            ProcessCollector(registry=registry)
    collector.loop = asyncio.get_running_loop()
    pools, replay = router.pools, router.replay
    collector.tables = {
        "sessions": lambda: len(state.local),
        "owners": state.local.owners,
        "replay_records": lambda: len(replay._records),
        "replay_index": replay.index_size,
        "admission_programs": lambda: len(pools.admission._programs),
        "prompt_memos": lambda: len(pools.memo),
        "prompt_memo_blocks": lambda: pools.memo.held,
        "session_prefix_blocks": lambda: None if pools.sessions is None else pools.sessions.blocks,
        "kv_hint_sessions": lambda: None if pools.hints is None else len(pools.hints),
        "large_body_tenants": lambda: None if large_bodies is None else len(large_bodies),
    }
    return collector
