"""Simulators on random loopback ports, and SDK clients pointed at them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from extproc.dev.sim.server import SIMULATOR, SimConfig, Simulator, build_app


@dataclass
class RunningSim:
    url: str
    sim: Simulator

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"


StartSim = Callable[..., Awaitable[RunningSim]]


@pytest.fixture
async def start_sim() -> AsyncIterator[StartSim]:
    """``await start_sim(instance_id="a", ...)`` runs a simulator until the test ends."""
    runners: list[web.AppRunner] = []

    async def start(**overrides: Any) -> RunningSim:
        cfg = SimConfig(**{"port": 0, "time_scale": 0.0, **overrides})
        app = build_app(cfg)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return RunningSim(f"http://127.0.0.1:{port}", app[SIMULATOR])

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def sim(start_sim: StartSim) -> RunningSim:
    return await start_sim(instance_id="simA", served_aliases=("alias-a",))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
