"""The service's YAML configuration, loaded into typed dataclasses.

Every key is checked: an unknown key, a wrong type or a dangling model reference fails at load
time with the file and the dotted path of the bad key. The ``routing.decisions`` block accepts the
SAAR article's YAML as written (``modelRefs``, ``algorithm.session_aware``...).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration problem, naming the file and the key."""


@dataclass(frozen=True)
class Server:
    host: str = "127.0.0.1"
    grpc_port: int = 9002
    http_port: int = 9090
    drain_seconds: float = 1.0
    """On SIGTERM: not ready for this long (Envoy's health check moves new streams to the
    other replicas) before the server stops."""


@dataclass(frozen=True)
class Pricing:
    """US dollars per million tokens."""

    prompt: float = 1.0
    cached_input: float = 0.1
    completion: float = 4.0


@dataclass(frozen=True)
class WorkerSpec:
    address: str
    """``host:port`` of the model server."""
    metrics_url: str | None = None
    """Defaults to ``http://{address}/metrics``."""
    kv_events: str | None = None
    """ZMQ endpoint of its KV-event publisher, e.g. ``tcp://10.0.0.5:5557``."""


@dataclass(frozen=True)
class Model:
    """A physical model: the Envoy cluster that serves it, what it costs and how good it is.

    ``endpoints`` (``host:port``) are the model's workers; they go into the generated Envoy
    cluster and, later, into worker scoring.
    """

    cluster: str
    endpoints: tuple[str, ...] = ()
    workers: tuple[WorkerSpec, ...] = ()
    """Workers with more to say than ``endpoints`` (metrics URL, KV-event publisher)."""
    pricing: Pricing = field(default_factory=Pricing)
    quality: float = 0.5
    context_window: int = 131072

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every worker's ``host:port``, ``endpoints`` first, each once."""
        return tuple(dict.fromkeys((*self.endpoints, *(w.address for w in self.workers))))


@dataclass(frozen=True)
class SessionAware:
    """SAAR's knobs, with the defaults of vLLM Semantic Router."""

    base_method: str = "hybrid"
    idle_timeout_seconds: float = 300.0
    min_turns_before_switch: int = 1
    switch_margin: float = 0.05
    stay_bias: float = 0.10
    tool_loop_hard_lock: bool = True
    context_portability_hard_lock: bool = True
    decision_drift_reset: bool = True
    idle_reset: bool = True
    switch_pricing: bool = True
    tool_loop_stay_bias: float = 0.35
    prefix_cache_weight: float = 0.20
    handoff_penalty_weight: float = 1.0
    default_handoff_penalty: float = 0.05
    quality_gap_multiplier: float = 1.0
    max_cache_cost_multiplier: float = 2.5
    switch_history_weight: float = 0.04
    remaining_turn_prior_weight: float = 1.0
    remaining_turn_prior_horizon: int = 8


@dataclass(frozen=True)
class Algorithm:
    type: str = "session_aware"
    session_aware: SessionAware = field(default_factory=SessionAware)


@dataclass(frozen=True)
class ModelRef:
    model: str


@dataclass(frozen=True)
class Rules:
    """Signals a request must show for a decision to match; an empty block matches everything."""

    keywords: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    min_context_tokens: int = 0
    max_context_tokens: int = 0
    tools: bool | None = None
    apis: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    name: str
    modelRefs: tuple[ModelRef, ...]
    priority: int = 0
    difficulty: float = 0.5
    rules: Rules = field(default_factory=Rules)
    algorithm: Algorithm = field(default_factory=Algorithm)


@dataclass(frozen=True)
class Routing:
    logical_models: tuple[str, ...] = ("auto",)
    cluster_header: str = "x-saar-cluster"
    decisions: tuple[Decision, ...] = ()


@dataclass(frozen=True)
class Identity:
    tenant_header: str | None = None
    extra_session_headers: tuple[str, ...] = ()
    max_value_bytes: int = 256


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True)
class Memory:
    max_sessions: int = 100_000
    session_ttl_seconds: float = 3600.0
    max_owned_ids: int = 1_000_000
    owner_ttl_seconds: float = 86400.0
    """How long an issued id (tool call, response, provider state) keeps its owner."""


@dataclass(frozen=True)
class State:
    """Where router state lives: this process (``memory``) or Redis / Valkey (``redis``),
    shared by replicas and kept across restarts."""

    store: str = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "saar"
    timeout_ms: float = 50.0
    """The request path never waits longer than this on the shared store."""
    max_backlog: int = 100_000
    """Write batches kept for the store while it is down (the oldest are dropped beyond)."""


@dataclass(frozen=True)
class Health:
    """A model with this many consecutive 5xx answers is taken out for the cooldown."""

    failure_threshold: int = 3
    cooldown_seconds: float = 5.0


@dataclass(frozen=True)
class Replay:
    capacity: int = 10_000
    jsonl_path: str | None = None
    mooncake_trace_path: str | None = None
    """Also write every request as a content-free Mooncake trace row (``saar simulate --trace``)."""


@dataclass(frozen=True)
class PrefixIndexConfig:
    """``approximate`` learns from routing (character blocks); ``precise`` reads the servers' KV
    events and needs the model's ``tokenizer.json``."""

    mode: str = "approximate"
    chars_per_block: int = 64
    default_capacity_blocks: int = 65536
    tokenizer: str | None = None


@dataclass(frozen=True)
class Admission:
    """Session-aware admission (ThunderAgent): pause ACTING sessions of an oversubscribed worker
    at their tool boundary, resume them when it has room."""

    enabled: bool = False
    tick_seconds: float = 5.0
    pause_threshold: float = 1.15
    """U counts every program's whole context, but sessions on one worker share their system
    prompt (and sub-agents their parent's context) in the prefix cache, so U overstates the KV
    they need: ThunderAgent's 0.95 paused sessions that still fit (-15% throughput at 64 agent
    sessions in ``saar simulate``); 1.15 pauses only under real oversubscription."""
    resume_target: float = 1.00
    demote_threshold: float = 1.00
    hysteresis: float = 0.10
    demote_priority: float = -2.0
    resume_priority: float = 1.0
    buffer_tokens: int = 100
    acting_weight: float = 1.0
    forced_resume_seconds: float = 1800.0
    hold_new_sessions: bool = False
    """Also hold sessions admission has never seen while anything is paused or no worker has
    room under ``admit_threshold``, so freed room goes to paused programs first. Off by default:
    in ``saar simulate`` it lifts the prefix hit rate to >= 94.5% at every load but costs 4% of
    throughput at 32 sessions and 25% at 64, and minutes of TTFT for queued new sessions."""
    admit_threshold: float = 0.68
    """A new session starts at once only while some worker's U stays under this line with it
    (well below the pause line: sessions grow turn by turn); otherwise it is held until a
    tick finds it room. 0.68 keeps the prefix hit rate >= 94.5% at 64-192 agent sessions in
    ``saar simulate`` (0.90: 93-94.5%, 10-25 points more throughput at 64-192)."""
    new_session_tokens: int = 16384
    """Estimated context of a held new session, the room its admission reserves (system prompt
    and task; its first turn replaces the estimate)."""
    on_paused: str = "hold"
    """``hold`` the request at the processor until resumed, or ``reject`` it with 429."""
    hold_timeout_seconds: float = 30.0


@dataclass(frozen=True)
class Scheduling:
    """Worker scoring inside a model's pool (weights as the Gateway API Inference Extension)."""

    enabled: bool = True
    scorers: dict[str, float] = field(
        default_factory=lambda: {"prefix": 3.0, "queue": 2.0, "kv_utilization": 2.0,
                                 "session_affinity": 1.0, "active_sessions": 3.0}
    )
    cost_form: str = "weighted"
    """``weighted`` (scorers × weights) or ``dynamo`` (overlap weight × uncached prefill blocks +
    active decode blocks, lowest wins)."""
    overlap_weight: float = 1.0
    session_idle_seconds: float = 120.0
    """The ``active_sessions`` scorer counts a session on its worker until it has not been
    routed for this long (longer than most tool calls, shorter than a finished session's
    afterlife should be)."""
    max_waiting_per_worker: int = 0
    """Shed load with 429 when every eligible worker has more waiting requests (0 = never)."""
    scrape_interval_seconds: float = 0.05
    staleness_seconds: float = 2.0
    workers_file: str | None = None
    """YAML ``{model: [host:port, ...]}`` reloaded when it changes, without a restart."""
    prefix: PrefixIndexConfig = field(default_factory=PrefixIndexConfig)
    admission: Admission = field(default_factory=Admission)


@dataclass(frozen=True)
class Config:
    models: dict[str, Model]
    routing: Routing = field(default_factory=Routing)
    server: Server = field(default_factory=Server)
    identity: Identity = field(default_factory=Identity)
    limits: Limits = field(default_factory=Limits)
    memory: Memory = field(default_factory=Memory)
    state: State = field(default_factory=State)
    health: Health = field(default_factory=Health)
    scheduling: Scheduling = field(default_factory=Scheduling)
    replay: Replay = field(default_factory=Replay)


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read YAML: {exc}") from None
    return parse_config(data, source=str(path))


def parse_config(data: Any, *, source: str = "<config>") -> Config:
    config = _build(Config, data, source, "")
    _check_references(config, source)
    return config


def _build(tp: Any, value: Any, source: str, where: str) -> Any:
    """Turn YAML data into ``tp``, naming ``source`` and the dotted key on any mismatch."""
    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{source}: {where or 'top level'}: expected {expected}, got {value!r}")

    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise fail("a mapping")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        for key in value:
            if key not in fields:
                raise ConfigError(f"{source}: {_join(where, key)}: unknown key")
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = _build(hints[name], value[name], source, _join(where, name))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{source}: {_join(where, name)}: required key is missing")
        return typing.cast(Any, tp)(**kwargs)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _build(inner, value, source, where)
    if origin is tuple:
        if not isinstance(value, list):
            raise fail("a list")
        inner = typing.get_args(tp)[0]
        return tuple(_build(inner, v, source, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise fail("a mapping")
        _, inner = typing.get_args(tp)
        return {str(k): _build(inner, v, source, _join(where, str(k))) for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail("a number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("an integer")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    raise ConfigError(f"{source}: {where}: unsupported type {tp}")  # pragma: no cover


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_references(config: Config, source: str) -> None:
    _check_scheduling(config.scheduling, source)
    if config.state.store not in ("memory", "redis"):
        raise ConfigError(f"{source}: state.store: 'memory' or 'redis', "
                          f"got {config.state.store!r}")
    if not config.models:
        raise ConfigError(f"{source}: models: at least one model is required")
    for name in config.routing.logical_models:
        if name in config.models:
            raise ConfigError(
                f"{source}: routing.logical_models: {name!r} is also a physical model name"
            )
    if config.routing.logical_models and not config.routing.decisions:
        raise ConfigError(f"{source}: routing.decisions: a logical model needs a decision")
    for i, decision in enumerate(config.routing.decisions):
        where = f"routing.decisions[{i}]"
        if not decision.modelRefs:
            raise ConfigError(f"{source}: {where}.modelRefs: at least one model is required")
        for j, ref in enumerate(decision.modelRefs):
            if ref.model not in config.models:
                raise ConfigError(
                    f"{source}: {where}.modelRefs[{j}].model: unknown model {ref.model!r}"
                )
        if decision.algorithm.type != "session_aware":
            raise ConfigError(
                f"{source}: {where}.algorithm.type: only 'session_aware' is supported, "
                f"got {decision.algorithm.type!r}"
            )
        if decision.algorithm.session_aware.base_method != "hybrid":
            raise ConfigError(
                f"{source}: {where}.algorithm.session_aware.base_method: only 'hybrid' is "
                f"supported, got {decision.algorithm.session_aware.base_method!r}"
            )
        for k, pattern in enumerate(decision.rules.regex):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{source}: {where}.rules.regex[{k}]: {exc}") from None


SCORERS = frozenset(
    {"prefix", "queue", "kv_utilization", "session_affinity", "active_sessions"}
)


def _check_scheduling(scheduling: Scheduling, source: str) -> None:
    for name in scheduling.scorers:
        if name not in SCORERS:
            raise ConfigError(
                f"{source}: scheduling.scorers.{name}: unknown scorer; one of {sorted(SCORERS)}"
            )
    if scheduling.session_idle_seconds <= 0:
        raise ConfigError(f"{source}: scheduling.session_idle_seconds: must be positive")
    if scheduling.cost_form not in ("weighted", "dynamo"):
        raise ConfigError(f"{source}: scheduling.cost_form: 'weighted' or 'dynamo', "
                          f"got {scheduling.cost_form!r}")
    if scheduling.prefix.mode not in ("approximate", "precise"):
        raise ConfigError(f"{source}: scheduling.prefix.mode: 'approximate' or 'precise', "
                          f"got {scheduling.prefix.mode!r}")
    if scheduling.prefix.mode == "precise" and not scheduling.prefix.tokenizer:
        raise ConfigError(f"{source}: scheduling.prefix.tokenizer: precise mode needs the "
                          "path of the model's tokenizer.json")
    if scheduling.admission.on_paused not in ("hold", "reject"):
        raise ConfigError(f"{source}: scheduling.admission.on_paused: 'hold' or 'reject', "
                          f"got {scheduling.admission.on_paused!r}")
