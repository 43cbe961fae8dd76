"""Where the router's parts are made and put together: the one place.

The policy objects (identity, health, SAAR, the pools, the large-body gate) never build each
other; this module builds them from the configuration and hands each its collaborators — the
live service (``service.app``), the development tools (evaluation, simulators, benchmarks) and
the tests all get the same objects from here. The sinks made here (the replay JSONL file and
the Mooncake trace, each written by a thread) are closed by ``Parts.close``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Protocol

from .adapter.contract import (
    DESTINATION_HEADER,
    DIAGNOSTIC_PREFIX,
    OBSERVE_HEADER,
    PREFILL_HEADER,
)
from .config import Config
from .core.bodies import LargeBodies
from .core.exchange import Exchange, Options
from .core.health import ModelHealth
from .core.identity import IdentityReader
from .core.router import Router
from .core.saar import SaarEngine
from .core.selection import Selector
from .observability.journal import ReplayJournal
from .observability.metrics import Metrics
from .observability.replay import JsonlSink, ReplayStore
from .observability.trace import MooncakeTraceWriter
from .scheduling.disaggregation import Disaggregator
from .scheduling.placement import Pools
from .types import Clock


class _Closeable(Protocol):
    def close(self) -> None: ...


@dataclass
class Parts:
    """One router and everything beside it, made for one process."""

    config: Config
    metrics: Metrics
    router: Router
    replay: ReplayStore
    pools: Pools
    health: ModelHealth
    bodies: LargeBodies
    options: Options
    sinks: list[_Closeable] = field(default_factory=list)

    def exchange(self) -> Exchange:
        """A new exchange: one per ext_proc stream."""
        return Exchange(self.router, self.options, bodies=self.bodies)

    def close(self) -> None:
        """Flush the replay and trace sinks."""
        for sink in self.sinks:
            sink.close()


def assemble(
    config: Config,
    *,
    clock: Clock = time.time,
    metrics: Metrics | None = None,
    selector: Selector | None = None,
    secret: bytes | None = None,
    rng: random.Random | None = None,
    shared: bool | None = None,
) -> Parts:
    """The parts ``config`` describes. ``secret`` keys the tenant hash (replicas share it; a
    random one by default); ``shared``: whether a store other replicas write to is in use
    (default: ``state.store`` says)."""
    metrics = metrics or Metrics()
    settings = config.identity
    identity = IdentityReader(
        settings.tenant_header, settings.extra_session_headers, settings.max_value_bytes,
        **({"secret": secret} if secret else {}),
    )
    health = ModelHealth(clock=clock, failure_threshold=config.health.failure_threshold,
                         cooldown=config.health.cooldown_seconds)
    engine = SaarEngine(config, health, clock=clock, selector=selector)
    pools = Pools(config, clock=clock, rng=rng)
    pools.disaggregation = Disaggregator.from_config(
        config.scheduling, index=pools.index, rng=rng or random.Random(),
        tokens_per_block=pools.tokens_per_block, max_sessions=config.memory.max_sessions)
    sinks: list[_Closeable] = []
    sink = JsonlSink(config.replay.jsonl_path) if config.replay.jsonl_path else None
    replay = ReplayStore(config.replay.capacity, sink, clock=clock)
    sinks.append(replay)
    trace = None
    if config.replay.mooncake_trace_path:
        rows = JsonlSink(config.replay.mooncake_trace_path)
        sinks.append(rows)
        trace = MooncakeTraceWriter(rows.write)
    journal = ReplayJournal(replay, trace, metrics)
    router = Router(config, identity=identity, health=health, engine=engine, pools=pools,
                    journal=journal, metrics=metrics, clock=clock, new_id=replay.new_id)
    limits = config.limits
    bodies = LargeBodies(limits.large_body_bytes, limits.large_bodies_per_tenant,
                         limits.large_body_wait_seconds, limits.large_body_bytes_per_second,
                         limits.large_body_bytes_per_second_total)
    options = Options.from_config(
        config, shared=config.state.store == "redis" if shared is None else shared,
        diagnostic_prefix=DIAGNOSTIC_PREFIX, destination_header=DESTINATION_HEADER,
        observe_header=OBSERVE_HEADER, prefill_header=PREFILL_HEADER)
    return Parts(config, metrics, router, replay, pools, health, bodies, options, sinks)
