"""The runtime gauges a soak watches, on the running service's /metrics (issue 9's soak)."""

from __future__ import annotations

import gc
from dataclasses import replace

import httpx
import orjson

from extproc.core.router import LocalDriver
from extproc.service.app import start
from extproc.service.runtime import GcTimer
from extproc.types import Api


async def test_tasks_tables_gc_and_process_are_exported(config):
    running = await start(replace(config, server=replace(config.server, grpc_port=0,
                                                         http_port=0)))
    try:
        body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "x"}]})
        LocalDriver(running.parts.router).route(Api.CHAT, {"x-session-id": "s-runtime"}, body)
        gc.collect()
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{running.http_port}/metrics")).text
    finally:
        await running.stop()
    values = {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
              for line in text.splitlines() if line and not line.startswith("#")}
    assert values["saar_asyncio_tasks"] >= 1
    assert values['saar_table_entries{table="replay_records"}'] == 1
    assert 'saar_table_entries{table="sessions"}' in values
    assert 'saar_table_entries{table="large_body_tenants"}' in values
    assert values["process_resident_memory_bytes"] > 1e6
    assert values["saar_python_heap_blocks"] > 1e4  # the interpreter's own, at least
    assert values['saar_gc_seconds_count{generation="2"}'] >= 1
    # Stopped, the service no longer times the collector.
    assert not any(isinstance(c, GcTimer) for c in gc.callbacks)
