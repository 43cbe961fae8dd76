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
from typing import TYPE_CHECKING, Protocol

from .adapter.contract import (
    DESTINATION_HEADER,
    DIAGNOSTIC_PREFIX,
    OBSERVE_HEADER,
    PREFILL_HEADER,
)
from .apis import Preambles
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
from .scheduling import (
    AdmissionController,
    ApproximatePrefixIndex,
    KvHintEmitter,
    SessionPrefixIndex,
    WorkerRegistry,
    from_config,
)
from .scheduling.disaggregation import Disaggregator
from .scheduling.flow import FlowController
from .scheduling.kv_events import PreciseKVIndex, TierWeights
from .scheduling.latency import LatencyPredictor
from .scheduling.memo import BlockMemo
from .scheduling.placement import Pools
from .scheduling.shared_pool import SharedKVPool
from .state.table import SessionTable
from .types import Clock

if TYPE_CHECKING:
    from .scheduling.tokenizer import Tokenizer


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
    table: SessionTable
    """This process's live sessions, every component's per-session slots."""
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
    table = SessionTable(max_sessions=config.memory.max_sessions,
                         ttl_seconds=config.memory.session_ttl_seconds, clock=clock)
    pools = _pools(config, clock, table, rng or random.Random())
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
                    journal=journal, metrics=metrics, clock=clock, new_id=replay.new_id,
                    table=table,
                    preambles=Preambles(config.routing.prompt_normalisation.volatile_preambles))
    limits = config.limits
    bodies = LargeBodies(limits.large_body_bytes, limits.large_bodies_per_tenant,
                         limits.large_body_wait_seconds, limits.large_body_bytes_per_second,
                         limits.large_body_bytes_per_second_total,
                         weights=config.scheduling.flow_control.tenant_weights)
    options = Options.from_config(
        config, shared=config.state.store == "redis" if shared is None else shared,
        diagnostic_prefix=DIAGNOSTIC_PREFIX, destination_header=DESTINATION_HEADER,
        observe_header=OBSERVE_HEADER, prefill_header=PREFILL_HEADER)
    return Parts(config, metrics, router, replay, pools, health, bodies, options, table, sinks)


def _pools(config: Config, clock: Clock, table: SessionTable, rng: random.Random) -> Pools:
    """The worker side: the registry, the prefix index (approximate, or precise with its
    tokenizer, its tiers and a shared pool), the prompt memo, admission, flow control and its
    latency predictor, the scheduler with
    its plugins, and with KV hints their emitter and the session-prefix index — each session's
    slots on ``table``."""
    scheduling = config.scheduling
    prefix = scheduling.prefix
    registry = WorkerRegistry(config.models, clock=clock,
                              staleness_seconds=scheduling.staleness_seconds)
    tokenizer: Tokenizer | None = None
    index: ApproximatePrefixIndex | PreciseKVIndex
    if prefix.tokenizer:
        from .scheduling.tokenizer import Tokenizer  # the tokenizers library only when named

        tokenizer = Tokenizer(prefix.tokenizer)
    if prefix.mode == "precise":
        weights = prefix.tier_weights
        index = PreciseKVIndex(block_size=prefix.block_size, weights=TierWeights(
            weights.device, weights.cpu, weights.disk, weights.shared), clock=clock)
    else:
        index = ApproximatePrefixIndex.from_config(prefix)
    memo = BlockMemo(prefix.chars_per_block, table=table)
    admission = AdmissionController(scheduling.admission, clock=clock, table=table)
    predictor = LatencyPredictor() if scheduling.flow_control.enabled else None
    flow = FlowController(scheduling.flow_control, clock=clock, predictor=predictor)
    scheduler = from_config(scheduling, index=index, rng=rng, clock=clock,
                            max_sessions=config.memory.max_sessions,
                            prefer=admission.preferred_worker, table=table, predictor=predictor)
    shared_pool = None
    if isinstance(index, PreciseKVIndex) and prefix.shared_pool.endpoint:
        shared_pool = SharedKVPool(index, objects_per_block=prefix.shared_pool.objects_per_block)
    hints = sessions = None
    if scheduling.hints.enabled:
        hints = KvHintEmitter(min_share_tokens=scheduling.hints.min_share_tokens, table=table)
        sessions = SessionPrefixIndex(table=table)
        if isinstance(index, PreciseKVIndex):
            index.listeners.append(sessions.located)
    tokens_per_block = (prefix.block_size if prefix.mode == "precise"
                        else max(1, prefix.chars_per_block // 4))
    disaggregation = Disaggregator.from_config(
        scheduling, index=index, rng=rng, tokens_per_block=tokens_per_block,
        max_sessions=config.memory.max_sessions, table=table)
    pools = Pools(config, registry=registry, index=index, memo=memo, admission=admission,
                  scheduler=scheduler, table=table, flow=flow, tokenizer=tokenizer,
                  shared_pool=shared_pool, hints=hints, sessions=sessions,
                  disaggregation=disaggregation, predictor=predictor)
    table.leaving(pools.left)
    return pools
