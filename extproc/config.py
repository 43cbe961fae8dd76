"""The service's YAML configuration, loaded into typed, validated dataclasses.

Every key is checked against a schema (pydantic): an unknown key, a wrong type, a value out of
its range or a dangling model reference fails at load time with the file and the dotted path
and line of the bad key (``saar.yaml:14: routing.decisions[0].modelRefs[2].model: unknown model
'gpt-9'``); a key given twice is refused, and an unknown key's near misses suggested.
The ``routing.decisions`` block accepts the SAAR article's YAML as written (``modelRefs``,
``algorithm.session_aware``...). The classes stay dataclasses: ``dataclasses.replace`` works
on them, and validates what it changes.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import field
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr, TypeAdapter
from pydantic import ValidationError as SchemaError
from pydantic.dataclasses import dataclass

from .adapter.contract import CLUSTER_HEADER, MODEL_HEADER
from .apis.normalise import CLAUDE_CODE_BILLING

_SCHEMA = ConfigDict(extra="forbid", use_attribute_docstrings=True)
Number = Annotated[float, Strict()]
"""A YAML number (an integer is fine, a string or a boolean is not)."""
Positive = Annotated[Number, Field(gt=0)]
NonNegative = Annotated[Number, Field(ge=0)]
Fraction = Annotated[Number, Field(ge=0, le=1)]
Count = Annotated[StrictInt, Field(ge=0)]
AtLeastOne = Annotated[StrictInt, Field(ge=1)]
Port = Annotated[StrictInt, Field(ge=0, le=65535)]
"""0 picks a free port (tests); the rest are TCP ports."""
Name = Annotated[StrictStr, Field(min_length=1, max_length=253)]
NonEmpty = Annotated[StrictStr, Field(min_length=1)]
_ADDRESS = r"^[^\s:/]+:\d{1,5}$|^\[[0-9a-fA-F:.]+\]:\d{1,5}$"
_HEADER = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
_REDIS_URL = (r"^(redis|rediss|unix)://"
              r"|^rediss?\+cluster://([^\s/@]+@)?[^\s/@,]+:\d{1,5}(,[^\s/@,]+:\d{1,5})*(/0?)?$")
_KEY_PREFIX = r"^[A-Za-z0-9_.-]{1,64}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_FORMS = {
    _ADDRESS: "host:port",
    _HEADER: "an HTTP header name",
    _REDIS_URL: "redis://host:port/db (or rediss://, unix://), or a cluster's "
                "redis+cluster://host:port[,host:port...] (or rediss+cluster://)",
    _KEY_PREFIX: "1-64 letters, digits, '_', '.', '-'",
    _ENV_NAME: "an environment variable name",
}
"""What each pattern asks for, in words, for the error messages."""
Address = Annotated[StrictStr, Field(pattern=_ADDRESS)]
"""``host:port`` (or ``[v6]:port``)."""
HeaderName = Annotated[StrictStr, Field(pattern=_HEADER)]
Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "both")


class ConfigError(ValueError):
    """A configuration problem, naming the file and the key."""


@dataclass(frozen=True, config=_SCHEMA)
class Tls:
    """TLS on the gRPC port: gateways reach an endpoint picker over TLS. Enabled without files,
    the service makes a self-signed certificate at start; files are read again when they change
    (a rotated Secret needs no restart). Off: plaintext, for a local Envoy."""

    enabled: StrictBool = False
    """Serve TLS on the gRPC port (without files: a self-signed certificate made at start)."""
    cert_file: StrictStr | None = None
    """PEM certificate (chain), read again when it changes; with ``key_file``."""
    key_file: StrictStr | None = None
    """The PEM private key of ``cert_file``."""
    client_ca_file: StrictStr | None = None
    """Mutual TLS: PEM CA certificate(s) a caller's client certificate must chain to; a caller
    without one is refused at the handshake (None: any caller). Read again when it changes."""

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.client_ca_file is not None and not self.enabled:
            raise ValueError("client_ca_file needs enabled: true (client certificates are "
                             "checked in the TLS handshake)")


NOTICE_SECONDS = 1.0
DRAIN_TIMEOUT_SECONDS = 25.0


@dataclass(frozen=True, config=_SCHEMA)
class Drain:
    """What the service does on SIGTERM (and SIGINT), so that a rolling update loses no
    request: it says not ready at once (gRPC health ``readiness`` NOT_SERVING, ``/readyz``
    503), goes on taking new streams for ``notice_seconds`` while Envoy's health check (or a
    gateway's endpoints) moves them to the other replicas, then refuses new streams and waits
    for those in flight — a long prefill, a streamed answer, a held request — to end, at most
    ``timeout_seconds``; then it stops. A pod's ``terminationGracePeriodSeconds`` must
    outlast its preStop sleep, the notice and the timeout (the Helm chart checks it)."""

    notice_seconds: NonNegative = NOTICE_SECONDS
    """Not ready but still taking new streams: at least one interval of the health check that
    routes to this replica (``saar envoy-config``'s is 0.5 s)."""
    timeout_seconds: NonNegative = DRAIN_TIMEOUT_SECONDS
    """The longest wait for the streams in flight; those still open then are cut (below
    Kubernetes' default grace period of 30 s)."""


@dataclass(frozen=True, config=_SCHEMA)
class Server:
    host: StrictStr = "127.0.0.1"
    """The address the gRPC ports (``grpc_port``, ``health_port``) listen on (``0.0.0.0``:
    every interface)."""
    http_host: StrictStr = "127.0.0.1"
    """The address the HTTP port listens on, whatever ``host`` is: loopback by default, so the
    admin API, the replay records and the web view stay on the machine; ``0.0.0.0`` where a
    Prometheus or a kubelet probe comes from outside (the Helm chart sets it, behind its
    NetworkPolicy)."""
    grpc_port: Port = 9002
    """ext_proc, gRPC health and the ``saar.v1.Replay`` service."""
    http_port: Port = 9090
    """``/metrics``, ``/healthz`` (live), ``/readyz`` (ready: 503 while starting or draining),
    the replay API (``/v1/replay``, ``/v1/sessions``, ``/v1/timeline``) and the web view
    (``/ui``)."""
    drain: Drain = field(default_factory=Drain)
    drain_seconds: NonNegative | None = None
    """Deprecated: the old name of ``drain.notice_seconds`` (an old config keeps loading, its
    value the notice); give one of the two."""
    tls: Tls = field(default_factory=Tls)
    health_port: Port | None = None
    """A plaintext port serving gRPC health only (kubelet's gRPC probes cannot speak TLS)."""

    def __post_init__(self) -> None:
        if self.drain_seconds is not None and self.drain.notice_seconds != NOTICE_SECONDS:
            raise ValueError("drain_seconds is the deprecated name of drain.notice_seconds: "
                             "give drain.notice_seconds only")

    @property
    def notice_seconds(self) -> float:
        """The drain's notice: ``drain.notice_seconds``, or the deprecated ``drain_seconds``."""
        return self.drain.notice_seconds if self.drain_seconds is None else self.drain_seconds


@dataclass(frozen=True, config=_SCHEMA)
class Pricing:
    """US dollars per million tokens."""

    prompt: NonNegative = 1.0
    """USD per million prompt tokens the model computes (uncached)."""
    cached_input: NonNegative = 0.1
    """USD per million prompt tokens served from its prefix cache."""
    completion: NonNegative = 4.0
    """USD per million output tokens."""


@dataclass(frozen=True, config=_SCHEMA)
class WorkerSpec:
    address: Address
    """``host:port`` of the model server."""
    metrics_url: StrictStr | None = None
    """Where its Prometheus metrics are scraped (default ``http://{address}/metrics``)."""
    kv_events: StrictStr | None = None
    """ZMQ endpoint of its KV-event publisher, e.g. ``tcp://10.0.0.5:5557``."""
    role: Role = "both"
    """Its phase in a disaggregated pool (llm-d's ``llm-d.ai/role``): ``prefill`` workers only
    prefill for a decode worker's sidecar, ``decode`` workers serve requests and may hand their
    prefill to a prefill worker, ``both`` do either (an ordinary worker)."""


@dataclass(frozen=True, config=_SCHEMA)
class Model:
    """A physical model: the Envoy cluster that serves it, what it costs and how good it is.

    ``endpoints`` (``host:port``) are the model's workers; they go into the generated Envoy
    cluster and, later, into worker scoring.
    """

    cluster: Name
    """The Envoy cluster serving this model (what the processor writes into
    ``routing.cluster_header``)."""
    endpoints: tuple[Address, ...] = ()
    """``host:port`` of its workers: the generated Envoy cluster's members and the pool the
    scheduler picks from."""
    workers: tuple[WorkerSpec, ...] = ()
    """Workers with more to say than ``endpoints`` (metrics URL, KV-event publisher)."""
    pricing: Pricing = field(default_factory=Pricing)
    quality: Fraction = 0.5
    """0..1, matched against a turn's difficulty: a model below it loses twice the gap, one above a
    quarter of it."""
    context_window: AtLeastOne = 131072
    """Tokens: a context larger than this never goes to this model (``GET /v1/models`` reports
    it)."""
    strip_volatile_preambles: StrictBool | None = None
    """Cut volatile preambles from the body sent to this model's workers; None follows
    ``routing.prompt_normalisation.strip_upstream``."""
    base: Name | None = None
    """This model is a LoRA adapter of the model ``base``, served by its workers (vLLM
    ``--lora-modules NAME=...``; the body's ``model`` names the adapter): it has no workers of
    its own, and its prefix cache, switch pricing and hard locks are its own."""

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every worker's ``host:port``, ``endpoints`` first, each once."""
        return tuple(dict.fromkeys((*self.endpoints, *(w.address for w in self.workers))))


@dataclass(frozen=True, config=_SCHEMA)
class SessionAware:
    """SAAR's knobs, with the defaults of vLLM Semantic Router; the last three are ours."""

    base_method: Literal["hybrid"] = "hybrid"
    """Base scores: ``hybrid``, a model's fit to the turn's difficulty less 0.35 × its prompt price
    relative to the dearest candidate (the only method)."""
    idle_timeout_seconds: NonNegative = 300.0
    """A session idle longer than this reopens selection (0: never)."""
    min_turns_before_switch: Count = 1
    """A priced switch waits until the session has run this many turns."""
    switch_margin: NonNegative = 0.05
    """A switch must beat staying by this much, after every bias and price."""
    stay_bias: NonNegative = 0.10
    """Added to the current model's score."""
    tool_loop_hard_lock: StrictBool = True
    """Tool results go to the model (and worker) that issued the calls, whatever the price."""
    context_portability_hard_lock: StrictBool = True
    """``previous_response_id``, encrypted reasoning and signed thinking blocks go to the model (and
    worker) that issued them."""
    decision_drift_reset: StrictBool = True
    """A turn that matches another decision on its content (keywords, regex) reopens selection."""
    idle_reset: StrictBool = True
    """A session idle longer than ``idle_timeout_seconds`` reopens selection."""
    switch_pricing: StrictBool = True
    """Price a switch by the prefix cache it throws away (off: for ablations)."""
    tool_loop_stay_bias: NonNegative = 0.35
    """The current model's bonus, instead of ``stay_bias``, while the session is in a tool loop."""
    prefix_cache_weight: NonNegative = 0.20
    """Weight, in score, of a switch's transition price counted in reference turns."""
    handoff_penalty_weight: NonNegative = 1.0
    """Times ``default_handoff_penalty``: the flat cost of any switch."""
    default_handoff_penalty: NonNegative = 0.05
    """The flat cost of any switch, before ``handoff_penalty_weight``."""
    quality_gap_multiplier: Positive = 1.0
    """Scales every base score."""
    max_cache_cost_multiplier: NonNegative = 2.5
    """Cap of a transition price, in reference turns (32,768 tokens at the dearest candidate's
    prompt price)."""
    switch_history_weight: NonNegative = 0.04
    """Penalty of a session that has switched often: this × min(switches / 8, 1)."""
    remaining_turn_prior_weight: NonNegative = 1.0
    """Weight of the turns expected to reuse the warm prefix: prior = this × min(1, remaining turns
    / ``remaining_turn_prior_horizon``)."""
    remaining_turn_prior_horizon: AtLeastOne = 8
    """Remaining turns from which the warm prefix counts in full."""
    remaining_turn_prior: Annotated[Number, Field(ge=0, le=10_000)] = 0.0
    """Turns a session of this decision is expected to run after its first (Semantic Router's
    ``remaining_turn_prior``: the mean session length − 1). At a session's turn ``t`` it expects
    ``max(0, prior − t)`` more; 0 (unknown): as many as the session has run, up to the horizon."""
    step_down_pricing: StrictBool = True
    """With ``switch_pricing``: a move to a weaker model must pay for itself, its saving over
    the expected remaining turns exceeding the cache it throws away and its quality risk (also
    at an idle boundary, where nothing cached is lost any more)."""
    return_rate: Fraction = 0.3
    """Chance per remaining turn that a session which leaves a model for a weaker one needs the
    stronger one again (hard turns come in runs). A step-down's quality risk is the chance of at
    least one such turn, ``1 − (1 − rate)^remaining``, times the fit that turn loses on the weaker
    model, priced at the rate the hybrid score trades fit for price."""
    drift_reset_warm_tokens: Count = 4096
    """From this many tokens of the request warm on the session's current model (measured on
    its best worker, else the backend's reported hit ratio), a drift reset's step-down must pay for
    itself, the cache it throws away counted, as on any turn; below it the reset takes the base
    choice (a small prefix is cheap to rebuild). 0: always priced."""


@dataclass(frozen=True, config=_SCHEMA)
class Algorithm:
    type: Literal["session_aware"] = "session_aware"
    """``session_aware`` (SAAR), the only algorithm."""
    session_aware: SessionAware = field(default_factory=SessionAware)


@dataclass(frozen=True, config=_SCHEMA)
class ModelRef:
    model: Name
    """A physical model's name (a key of ``models``)."""


@dataclass(frozen=True, config=_SCHEMA)
class Rules:
    """Signals a request must show for a decision to match; an empty block matches everything."""

    keywords: tuple[NonEmpty, ...] = ()
    """Whole words or phrases of the latest turn, any case (``ok`` does not match ``token``)."""
    regex: tuple[StrictStr, ...] = ()
    """Regular expressions searched in the latest turn, any case; one match is enough."""
    min_context_tokens: Count = 0
    """The context must be at least this large."""
    max_context_tokens: Count = 0
    """The context must be at most this large (0: no bound)."""
    tools: StrictBool | None = None
    """true: the request must offer tools; false: it must offer none; null: either."""
    apis: tuple[Literal["openai_chat", "openai_responses", "anthropic_messages",
                        "openai_completions"], ...] = ()
    """The request's API must be one of these (empty: any)."""
    headers: dict[str, StrictStr] = field(default_factory=dict)
    """Header name → the exact value the request must carry."""


@dataclass(frozen=True, config=_SCHEMA)
class Decision:
    name: Name
    """Named by ``x-saar-decision``, the replay records and the metrics."""
    modelRefs: tuple[ModelRef, ...]
    """The candidate models (``- model: NAME``)."""
    priority: StrictInt = 0
    """Decisions are tried highest first; the first whose rules match wins."""
    difficulty: Fraction = 0.5
    """0..1: how hard a turn of this decision is, matched against each model's ``quality``."""
    rules: Rules = field(default_factory=Rules)
    algorithm: Algorithm = field(default_factory=Algorithm)


@dataclass(frozen=True, config=_SCHEMA)
class PromptNormalisation:
    """Volatile preambles (``apis.normalise``): regular expressions matched at the start of
    a request's system prompt, text a harness puts there that changes per session or request
    (the default: Claude Code's ``x-anthropic-billing-header`` line). The router's prefix
    matching always ignores them; ``strip_upstream`` also cuts them from the body sent to the
    engine, so its prefix cache is shared across sessions and with sub-agents. On by default:
    the workers here are self-hosted engines; a model that is a hosted API reading the line
    turns it off (``models.<name>.strip_volatile_preambles: false``)."""

    volatile_preambles: tuple[NonEmpty, ...] = (CLAUDE_CODE_BILLING,)
    """Regular expressions matched at the start of a system prompt: text a harness puts there that
    changes per session or request."""
    strip_upstream: StrictBool = True
    """Also cut them from the body sent to the engine (per model:
    ``models.NAME.strip_volatile_preambles``)."""


@dataclass(frozen=True, config=_SCHEMA)
class Routing:
    logical_models: tuple[Name, ...] = ("auto",)
    """Names that go through SAAR; a physical model's name routes to it directly."""
    cluster_header: HeaderName = CLUSTER_HEADER
    """The request header the processor sets to the chosen model's cluster, which the route's
    ``cluster_header`` reads (the client's copy is removed)."""
    decisions: tuple[Decision, ...] = ()
    """Routing decisions: the first (by ``priority``) whose rules match a turn names its candidate
    models."""
    model_header: HeaderName = MODEL_HEADER
    """Set to the physical model on every routed request: what HTTPRoute rules match to pick
    that model's InferencePool (the client's copy is always removed)."""
    rewrite_model: StrictBool = True
    """Rewrite the body's ``model`` to the physical model. Off when the workers also serve the
    logical name (vLLM ``--served-model-name qwen3-32b auto``): the body goes upstream as the
    client sent it (Envoy need not copy it back), the answer's ``model`` is the logical one
    and ``x-saar-selected-model`` names the physical one."""
    prompt_normalisation: PromptNormalisation = field(default_factory=PromptNormalisation)
    side_request_max_tokens: Count = 4096
    """A request that opens a conversation of its own, offers no tools and holds at most this
    many context tokens is light; naming a model other than its session's usual one, it is a
    side request (OpenCode's title request, Claude Code's haiku calls): served, but it neither
    places nor moves the session, nor counts as its turn (``core.side``). 0: off."""


@dataclass(frozen=True, config=_SCHEMA)
class Identity:
    tenant_header: HeaderName | None = None
    """A header a trusted filter in front of Envoy sets to the tenant; without it the tenant is a
    keyed hash of the caller's ``authorization`` / ``x-api-key``."""
    extra_session_headers: tuple[HeaderName, ...] = ()
    """More session-id headers, read after the built-in families (lowest precedence)."""
    max_value_bytes: Annotated[StrictInt, Field(ge=16, le=4096)] = 256
    """Longer ids (and ids with control characters) are replaced by their hash."""
    tenant_secret_file: StrictStr | None = None
    """The key of the tenant hash (at least 16 bytes). Without it, a replica with the Redis
    store shares one kept there; a lone in-process router draws a random one."""


@dataclass(frozen=True, config=_SCHEMA)
class Limits:
    max_body_bytes: Annotated[StrictInt, Field(ge=1, le=1 << 30)] = 8 * 1024 * 1024
    """Larger request bodies are refused with 413."""
    large_body_bytes: AtLeastOne = 1024 * 1024
    """A body this large (by content-length, else as it arrived) is a large body."""
    large_bodies_per_tenant: AtLeastOne = 2
    """Large bodies of one tenant read and routed at a time; more wait, then get 429."""
    large_body_bytes_per_second: Annotated[Number, Field(gt=0)] = 16.0 * 1024 * 1024
    """Large bodies one tenant may send per second (a burst of one second's worth)."""
    large_body_bytes_per_second_total: Annotated[Number, Field(gt=0)] = 32.0 * 1024 * 1024
    """Large bodies all tenants together may send per second (a burst of one second's worth):
    what many credentials add up to. The tenants that sent any request in the last two seconds
    share it by their `scheduling.flow_control.tenant_weights`: a tenant's large bodies are
    charged to its part, so tenants of small requests keep the processor time theirs stands
    for; a tenant alone may use all of it."""
    large_body_wait_seconds: Annotated[Number, Field(ge=0, le=50)] = 5.0
    """How long a tenant's further large body waits for its turn (0: 429 at once)."""
    parse_thread_bytes: Count = 256 * 1024
    """Bodies at least this large are parsed on a worker thread, off the event loop (0: never)."""


@dataclass(frozen=True, config=_SCHEMA)
class Memory:
    max_sessions: AtLeastOne = 100_000
    """Session records kept in this process, least recently used dropped first (the prompt memo and
    the per-session figures are bounded by it too)."""
    session_ttl_seconds: Positive = 3600.0
    """A session record lives this long after its last write (here and in the shared store)."""
    max_owned_ids: AtLeastOne = 1_000_000
    """Issued ids (tool calls, responses, provider state) whose owner this process keeps."""
    owner_ttl_seconds: Positive = 86400.0
    """How long an issued id (tool call, response, provider state) keeps its owner."""


@dataclass(frozen=True, config=_SCHEMA)
class State:
    """Where router state lives: this process (``memory``) or Redis / Valkey (``redis``),
    shared by replicas and kept across restarts."""

    store: Literal["memory", "redis"] = "memory"
    """``memory`` (this process) or ``redis`` (Redis or Valkey: shared by replicas, kept across
    restarts)."""
    redis_url: Annotated[StrictStr, Field(pattern=_REDIS_URL)] = "redis://127.0.0.1:6379/0"
    """One server (``redis://``, ``rediss://``, ``unix://``), or a Redis / Valkey Cluster:
    ``redis+cluster://host:port[,host:port…]`` names seed nodes (``rediss+cluster://`` for
    TLS); see docs/state.md."""
    key_prefix: Annotated[StrictStr, Field(pattern=_KEY_PREFIX)] = "saar"
    """The namespace of every key in the store (deployments sharing a store need their own)."""
    timeout_ms: Annotated[Number, Field(gt=0, le=10_000)] = 50.0
    """The longest a request's load waits on the shared store; an answer's write of the ids it
    carries waits 20 times longer (their owners must be there before another replica is
    asked for the continuation)."""
    max_backlog: AtLeastOne = 100_000
    """Write batches kept for the store while it is down (the oldest are dropped beyond)."""
    settle_ms: Annotated[Number, Field(ge=0, le=5_000)] = 100.0
    """How long a request waits, at most, for the issuer of the newest id it continues when no
    store knows it yet: the claim of a streamed answer's ids by its observe stream, which Envoy
    does not wait for, may still be on its way (an answer that passes through the processor
    goes on only once its ids are in the store). Past it, the request goes by its session's
    record, which that answer's commit wrote before its first byte. 0: never wait."""


@dataclass(frozen=True, config=_SCHEMA)
class Health:
    """A model with this many consecutive 502/503/504/529 answers is taken out for the
    cooldown."""

    failure_threshold: AtLeastOne = 3
    """Consecutive 502/503/504/529 answers that take a model out (a 500 never does)."""
    cooldown_seconds: Positive = 5.0
    """How long a model taken out stays out."""
    locked_hold_seconds: Annotated[Number, Field(ge=0, le=50)] = 10.0
    """A request a hard lock binds to a model that is taken out waits at the processor this
    long at most for the model to come back (0: answer 503 at once)."""


@dataclass(frozen=True, config=_SCHEMA)
class Replay:
    capacity: AtLeastOne = 10_000
    """Records kept in memory, the oldest dropped first."""
    jsonl_path: StrictStr | None = None
    """Also append every record (its decision, then its outcome) to this JSONL file."""
    mooncake_trace_path: StrictStr | None = None
    """Also write every request as a content-free Mooncake trace row (``saar simulate --trace``)."""


@dataclass(frozen=True, config=_SCHEMA)
class Admin:
    """The credential of the admin surfaces: the replay API (HTTP and gRPC) and the web view.
    Without a token they answer 403 saying how to set one; ``/metrics`` and ``/healthz`` stay
    open (Prometheus and probes)."""

    token_file: StrictStr | None = None
    """A file whose content (surrounding whitespace stripped) is the admin token."""
    token_env: Annotated[StrictStr, Field(pattern=_ENV_NAME)] | None = None
    """An environment variable holding the token, read when there is no ``token_file``."""


@dataclass(frozen=True, config=_SCHEMA)
class Otlp:
    """OpenTelemetry traces over OTLP/gRPC: a span per routed request. Off, nothing of
    OpenTelemetry is imported (``pip install 'saar-extproc[otel]'`` to turn it on)."""

    enabled: StrictBool = False
    """Export a span per routed request."""
    endpoint: StrictStr = "http://127.0.0.1:4317"
    """The collector's OTLP/gRPC address; ``https://`` for TLS."""
    headers: dict[StrictStr, StrictStr] = field(default_factory=dict)
    """Sent with every export (a collector's API key, for instance)."""
    service_name: Name = "saar-extproc"
    """The resource's ``service.name``."""
    sample_ratio: Fraction = 1.0
    """Of the traces the client did not decide (a sampled ``traceparent`` is always kept)."""
    timeout_seconds: Positive = 10.0
    """An export's deadline."""


@dataclass(frozen=True, config=_SCHEMA)
class SharedReplay:
    """Replay records in the shared store (``state.store: redis``), written off the request
    path, so an ``x-replay-id`` one replica gave resolves on every other."""

    enabled: StrictBool = True
    """With ``state.store: redis``, write the records to the store."""
    ttl_seconds: Positive = 3600.0
    """A record lives this long in the store (memory ≈ request rate × TTL × ~2 KB)."""
    session_records: AtLeastOne = 256
    """Ids kept per session (the newest)."""
    flush_seconds: Annotated[Number, Field(gt=0, le=10)] = 0.05
    """The writer's period: records are written in batches this often."""
    max_pending: AtLeastOne = 10_000
    """Records waiting to be written; beyond, the oldest wait is dropped (and counted)."""


@dataclass(frozen=True, config=_SCHEMA)
class Observability:
    otlp: Otlp = field(default_factory=Otlp)
    shared_replay: SharedReplay = field(default_factory=SharedReplay)
    session_idle_seconds: Positive = 300.0
    """A session idle this long is over for the per-session metrics (turns, switches...)."""


@dataclass(frozen=True, config=_SCHEMA)
class Logging:
    """The service's log lines (``saar serve``; its ``-v`` and ``--log-level`` flags win over
    ``level``). A line logged while a request is handled carries its ``replay_id`` and
    ``session``."""

    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    """The least severe lines written; changed by SIGHUP without a restart."""
    format: Literal["text", "json"] = "text"
    """``text`` (for a terminal) or ``json``: one object per line (``time``, ``level``,
    ``logger``, ``message``, ``replay_id``, ``session``, ``exception``) for a log stack."""


@dataclass(frozen=True, config=_SCHEMA)
class TierWeightsConfig:
    """What a prefix block found in each memory tier is worth, in device blocks (precise mode;
    the approximate index has one tier). Dynamo credits host hits 0.75 and disk 0.25."""

    device: Fraction = 1.0
    """A block in the worker's GPU memory."""
    cpu: Fraction = 0.75
    """A block in its host memory (a copy back, no prefill)."""
    disk: Fraction = 0.25
    """A block on its disk tier."""
    shared: Fraction = 0.5
    """A block in the shared pool beyond the worker's device prefix (a network transfer)."""


@dataclass(frozen=True, config=_SCHEMA)
class SharedPoolConfig:
    """A shared KV store's event stream (Mooncake Store's master: ``enable_kv_events``)."""

    endpoint: StrictStr | None = None
    """ZMQ endpoint of its publisher (``tcp://host:5557``); none: no shared pool."""
    topic: StrictStr = ""
    """The ZMQ topic subscribed to (empty: every topic)."""
    objects_per_block: AtLeastOne = 1
    """Physical objects a block is stored as (tensor-parallel ranks x K/V when stored apart):
    a block counts once all are in."""


@dataclass(frozen=True, config=_SCHEMA)
class PrefixIndexConfig:
    """``approximate`` learns from routing (character blocks); ``precise`` reads the servers' KV
    events and needs the model's ``tokenizer.json``."""

    mode: Literal["approximate", "precise"] = "approximate"
    """``approximate`` (learnt from routing) or ``precise`` (vLLM's KV events over ZMQ,
    ``models.NAME.workers[].kv_events``)."""
    chars_per_block: AtLeastOne = 64
    """Approximate index: characters of the rendered prompt per block."""
    default_capacity_blocks: AtLeastOne = 65536
    """Approximate index: blocks remembered per worker (an LRU) until the server reports its KV
    capacity."""
    tokenizer: StrictStr | None = None
    """The model's local directory (``tokenizer.json`` with the chat template of its
    ``tokenizer_config.json``), or its bare ``tokenizer.json``: needed by ``precise``; in either
    mode, context windows are counted in its tokens."""
    block_size: AtLeastOne = 16
    """Precise index: tokens per KV block, as the engines cut them (vLLM's ``--block-size``:
    16 by default on GPUs, 128 on its CPU backend)."""
    kv_events_listen: StrictStr | None = None
    """Precise index: a ZMQ endpoint the router binds (``tcp://*:5557``) for engines that
    connect to it — vLLM connects to a ``tcp://`` endpoint that names a host, binds one with
    ``*`` or an ``ipc://`` one (``workers[].kv_events``, which the router connects to). Each
    engine names its worker in its topic: ``HOST:PORT`` or llm-d's ``kv@HOST@MODEL``."""
    tier_weights: TierWeightsConfig = field(default_factory=TierWeightsConfig)
    shared_pool: SharedPoolConfig = field(default_factory=SharedPoolConfig)


@dataclass(frozen=True, config=_SCHEMA)
class KvHintsConfig:
    """KV hints to the engines (share, prefetch, demote, release) on a side channel: ``POST
    /v1/kv/hints`` to each worker, batched off the request path, best effort."""

    enabled: StrictBool = False
    """Send KV hints to the workers."""
    timeout_seconds: Annotated[Number, Field(gt=0, le=10)] = 0.5
    """A delivery slower than this loses its batch (hints are advice)."""
    flush_seconds: Annotated[Number, Field(ge=0.005, le=10)] = 0.05
    """The sender's period: hints are batched per worker this long."""
    max_pending: AtLeastOne = 10_000
    """Hints waiting for delivery at most; the oldest are dropped past it (and counted)."""
    min_share_tokens: Count = 1024
    """A first turn's matched prefix shorter than this is not worth a ``share``."""


@dataclass(frozen=True, config=_SCHEMA)
class Admission:
    """Session-aware admission (ThunderAgent): pause ACTING sessions of an oversubscribed worker
    at their tool boundary, resume them when it has room. The ``saar simulate`` figures below
    were measured with holds that last until the session resumes (``hold_timeout_seconds``
    above every wait); at the default 30 s hold a paused session's turn goes ahead before it
    resumes, and most of the gain under oversubscription goes with it."""

    enabled: StrictBool = False
    """Pause the smallest ACTING sessions of an oversubscribed worker at their tool boundary; resume
    them when it has room."""
    tick_seconds: Positive = 5.0
    """The control period."""
    pause_threshold: Positive = 1.15
    """At this U a worker's smallest ACTING sessions are paused. U counts every program's whole
    context, but sessions on one worker share their system prompt (and sub-agents their parent's
    context) in the prefix cache, so U overstates the KV they need: ThunderAgent's 0.95 paused
    sessions that still fit (-15% throughput at 64 agent sessions in ``saar simulate``); 1.15 pauses
    only under real oversubscription."""
    resume_target: Positive = 1.00
    """Pausing stops once a worker's U is down to this."""
    demote_threshold: Positive = 1.00
    """From this U up to ``pause_threshold`` a worker's sessions are demoted."""
    hysteresis: NonNegative = 0.10
    """Paused sessions resume while U stays at or below ``pause_threshold`` − this."""
    demote_priority: Number = -2.0
    """Seconds a demoted session's next turn moves in its worker's queue (negative: back). Applied
    by ``saar simulate``'s engines; the live router sends engines no priority."""
    resume_priority: Number = 1.0
    """Seconds a resumed session's next turn moves ahead in its worker's queue (as
    ``demote_priority``)."""
    buffer_tokens: Count = 100
    """Added to a session's tokens (its last prompt and answer): the room its next turn needs."""
    acting_weight: Fraction = 1.0
    """Weight of an ACTING session's tokens in U (between turns its KV may be evicted)."""
    forced_resume_seconds: Positive = 1800.0
    """A session paused, or a new one held, this long goes ahead whatever U is: none starves."""
    hold_new_sessions: StrictBool = False
    """Also hold sessions admission has never seen while anything is paused or no worker has
    room under ``admit_threshold``, so freed room goes to paused programs first. Off by default:
    in ``saar simulate`` it lifts the prefix hit rate to >= 94.5% at every load but costs 4% of
    throughput at 32 sessions and 25% at 64, and minutes of TTFT for queued new sessions."""
    admit_threshold: Positive = 0.68
    """A new session starts at once only while some worker's U stays under this line with it
    (well below the pause line: sessions grow turn by turn); otherwise it is held until a
    tick finds it room. 0.68 keeps the prefix hit rate >= 94.5% at 64-192 agent sessions in
    ``saar simulate`` (0.90: 93-94.5%, 10-25 points more throughput at 64-192)."""
    new_session_tokens: Count = 16384
    """Estimated context of a held new session, the room its admission reserves (system prompt
    and task; its first turn replaces the estimate)."""
    on_paused: Literal["hold", "reject"] = "hold"
    """``hold`` the request at the processor until resumed, or ``reject`` it with 429."""
    hold_timeout_seconds: Positive = 30.0
    """The longest a paused session's request is held at the processor (``on_paused: hold``), then
    it goes ahead; an admitted new session whose first turn does not come within it loses its
    reservation. In ``saar simulate`` (4 workers, seeds 0-2) admission's throughput over KV-aware
    routing is +9 to +14% at 96 sessions, +5 to +7% at 128 and -2 to +0.4% at 192 with 30 s,
    against +28 / +42 / +58% (seed 0) with holds that last until resumed; a longer hold needs
    Envoy's ``max_message_timeout`` raised with it, and clients that wait that long."""
    host_weight: Fraction = 0.05
    """Share of a worker's host-memory KV tier (``num_cpu_blocks``) that U counts as capacity
    beside the device pool: a session waiting there comes back at the cost of a copy, not a
    prefill. In ``saar simulate`` (host tier twice the device) 0.05 lifts admission from -8%
    to -3% of KV-aware throughput at 64 sessions and from +24% / +49% to +30% / +60% at
    96 / 192 with the hit rate >= 94.5%; 0.1 pauses too late (94.1% / 93.1% at 96 / 192)."""


@dataclass(frozen=True, config=_SCHEMA)
class Discovery:
    """Where the workers come from: ``static`` (``models.*.endpoints`` / ``workers`` and the
    workers file) or ``kubernetes`` (the ready pods an InferencePool selects, watched)."""

    mode: Literal["static", "kubernetes"] = "static"
    """``static`` (``models.NAME.endpoints`` / ``workers`` and ``scheduling.workers_file``) or
    ``kubernetes`` (the ready pods of ``inference_pool``, watched)."""
    namespace: Name | None = None
    """The InferencePool's namespace; default: this pod's (``POD_NAMESPACE``, else the
    service account's)."""
    inference_pool: Name | None = None
    """The InferencePool (``inference.networking.k8s.io/v1``) whose pods are the workers."""
    role_label: Name = "llm-d.ai/role"
    """The pod label naming a worker's phase (``prefill``, ``decode``, ``both``; llm-d's);
    a pod without it is ``both``."""

    def __post_init__(self) -> None:
        if self.mode == "kubernetes" and self.inference_pool is None:
            raise ValueError("kubernetes discovery needs inference_pool")


@dataclass(frozen=True, config=_SCHEMA)
class Disaggregation:
    """Prefill/decode disaggregation: when a request's decode worker would prefill at least
    ``threshold_tokens`` it has not cached, a prefill worker (role ``prefill``) computes them
    and the decode worker's sidecar fetches the KV (``x-prefiller-host-port``, llm-d's)."""

    mode: Literal["session_aware", "always", "never"] = "session_aware"
    """``session_aware`` splits by the uncached tokens on the chosen decode worker (a tool-loop
    turn on a warm worker stays local); ``always`` splits every request (llm-d with a zero
    threshold); ``never`` does not split. Without prefill workers nothing is split."""
    threshold_tokens: Count = 8192
    """Uncached prompt tokens on the decode worker from which the prefill goes remote: below,
    a local prefill costs less than the hand-off (transfer, a second queue)."""
    max_prefill_requests: AtLeastOne = 2
    """A prefill worker with this many requests (running and waiting, as scraped) is full: a
    request finding every prefill worker full prefills on its decode worker rather than queue
    behind them (first turns of new sessions arriving in a burst). A prefill worker with more
    requests than the decode worker has waiting counts as full too: the local prefill starts
    sooner."""
    scorers: dict[StrictStr, NonNegative] = field(
        default_factory=lambda: {"prefix": 3.0, "queue": 2.0, "kv_utilization": 1.0})
    """The prefill pick's own scorers (plugin names) and weights: prefix overlap and load."""


@dataclass(frozen=True, config=_SCHEMA)
class PriorityClass:
    """One priority class of flow control: how it ranks, waits and is shed."""

    priority: StrictInt = 0
    """Higher goes first among a tenant's queued requests (the tenants' fair share ranks
    before it)."""
    ttl_seconds: Annotated[Number, Field(gt=0, le=3600)] = 60.0
    """The longest a request of this class waits in the queue (then 429, reason ``ttl``)."""
    sheddable: StrictBool = False
    """Refused (429, reason ``saturated``) rather than queued when its pool is saturated, and
    the first evicted when a queue is full."""
    ttft_seconds: Positive | None = None
    """The class's time-to-first-token target (a request's header overrides it): placement
    prefers workers predicted to meet it."""
    tpot_seconds: Positive | None = None
    """The class's per-output-token target (a request's header overrides it)."""
    kv_threshold: Fraction | None = None
    """The share of a worker's KV cache this class's prompts may fill (None: the pool's
    ``kv_threshold``), less what is reserved there for higher classes."""
    queue_depth: AtLeastOne | None = None
    """A worker with this many requests waiting takes no more of this class (None:
    ``queue_depth_threshold``): a lower class waits at the router, where it can be passed,
    rather than in a worker's own first-come queue in front of a higher class."""
    prefill_tokens: AtLeastOne | None = None
    """A worker with this many uncached prompt tokens sent and not yet answered (no first
    token) takes no more of this class (None: no limit): its long prefills do not fill the
    worker's chunked prefill ahead of a higher class's next turn."""


def _default_classes() -> dict[str, PriorityClass]:
    return {
        "interactive": PriorityClass(priority=2, ttl_seconds=60.0, ttft_seconds=2.0,
                                     kv_threshold=1.0),
        "batch": PriorityClass(priority=1, ttl_seconds=300.0, queue_depth=1,
                               prefill_tokens=8192),
        "sheddable": PriorityClass(priority=0, ttl_seconds=10.0, sheddable=True, queue_depth=1,
                                   prefill_tokens=8192),
    }


@dataclass(frozen=True, config=_SCHEMA)
class FlowControl:
    """A queue per pool in front of the pick, entered only while the pool is saturated, and
    dispatched fairly: tenants by weight, then priority class, then an open tool loop's
    continuation, then the programs of a tenant (a root session with its sub-agents) by least
    attained service, then a new session's first turn last (``docs/flow-control.md``)."""

    enabled: StrictBool = False
    """Queue requests while their pool is saturated, dispatched fairly (off: every request is placed
    at once)."""
    queue_depth_threshold: AtLeastOne = 5
    """A worker with this many requests waiting (as scraped, plus what was sent to it since)
    is saturated (llm-d's saturation detector default)."""
    kv_threshold: Fraction = 0.97
    """A request goes to a worker only while its prompt fits in the worker's KV cache below
    this share, beside what is in use and what is reserved there for higher classes (the
    rest is for answers' growth and a returning session's tool output); a worker that
    reports no KV capacity is saturated at this share in use. A class may set its own."""
    reserve_seconds: NonNegative = 20.0
    """After a turn with a TTFT target ends, its prompt and answer stay reserved on its worker
    this long against lower classes, so the session's next turn finds room there (0: none)."""
    spill_seconds: Positive = 5.0
    """A request that waited this long for room on its own worker (its context's: a hard
    lock's never) may go to another worker with room whose KV use is under
    ``spill_kv_threshold``, re-prefilling its context there."""
    spill_kv_threshold: Fraction = 0.8
    """A worker with less of its KV in use (and reserved for higher classes) than this takes
    the requests that waited ``spill_seconds`` for their own."""
    max_queued: AtLeastOne = 1000
    """Requests one pool's queue holds; past it the worst-ranked sheddable one is evicted, or
    the newcomer refused (reason ``queue_full``)."""
    half_life_seconds: Positive = 60.0
    """Attained service decays by half over this long (llm-d's program-aware fairness)."""
    output_weight: NonNegative = 2.0
    """An output token counts this many uncached input tokens of service (decode costs more)."""
    tenant_weights: dict[Name, Positive] = field(default_factory=dict)
    """Tenant → share weight (default 1): a tenant of weight 2 gets twice the service."""
    classes: dict[Name, PriorityClass] = field(default_factory=_default_classes)
    """Priority classes by name."""
    default_class: Name = "interactive"
    """The class of a request that names none or an unknown one (a key of ``classes``)."""
    class_header: HeaderName = "x-saar-class"
    """The request header naming its class (an unknown name is the default class)."""
    deadline_header: HeaderName = "x-saar-deadline-ms"
    """Milliseconds the client will wait at most: the request is never queued past it."""
    ttft_header: HeaderName = "x-saar-slo-ttft-ms"
    """The request header carrying its time-to-first-token target in milliseconds (overrides its
    class's)."""
    tpot_header: HeaderName = "x-saar-slo-tpot-ms"
    """The request header carrying its per-output-token target in milliseconds (overrides its
    class's)."""
    max_programs: AtLeastOne = 10_000
    """Programs whose attained service is remembered (the oldest forgotten first)."""

    def __post_init__(self) -> None:
        if self.default_class not in self.classes:
            raise ValueError(f"default_class {self.default_class!r} is not one of classes")


@dataclass(frozen=True, config=_SCHEMA)
class Scheduling:
    """Worker scoring inside a model's pool (weights as the Gateway API Inference Extension)."""

    enabled: StrictBool = True
    """Pick the worker inside a model's pool (a pool of one worker is left to Envoy)."""
    scorers: dict[StrictStr, NonNegative] = field(default_factory=lambda: _default_weights())
    """Scorer name → weight (0 leaves it out); the names and defaults are the plugin
    registry's (``scheduling.plugins``)."""
    cost_form: Literal["weighted", "dynamo", "predicted"] = "predicted"
    """``predicted`` (each worker's predicted time to first token in seconds — the queue
    ahead, the uncached prompt, decode steps — with the decode interference it adds and the
    KV it would evict from live sessions there, at rates learnt from the engines and the
    answers; lowest wins, the scorers break its ties), ``weighted`` (scorers × weights,
    highest wins) or ``dynamo`` (overlap weight × uncached prefill blocks + active decode
    blocks, lowest wins)."""
    overlap_weight: NonNegative = 1.0
    """``dynamo`` cost form: the weight of uncached prefill blocks against active decode blocks."""
    session_idle_seconds: Positive = 120.0
    """The ``active_sessions`` scorer counts a session on its worker until it has not been
    routed for this long (longer than most tool calls, shorter than a finished session's
    afterlife should be)."""
    max_waiting_per_worker: Count = 0
    """Shed load with 429 when every eligible worker has more waiting requests (0 = never)."""
    scrape_interval_seconds: Annotated[Number, Field(ge=0.01)] = 0.5
    """The fastest pace of a worker's ``/metrics`` reads (vLLM's and SGLang's names): the least
    time between two reads of a busy worker (one with requests in flight, load in its last
    read, or a request started or finished there since). Every 50 ms slowed a CPU engine's
    TTFT; more often than every 10 ms makes real servers unresponsive."""
    scrape_idle_interval_seconds: Annotated[Number, Field(ge=0.01)] = 1.0
    """How often an idle worker's ``/metrics`` is read; kept at most half of
    ``staleness_seconds`` (an idle worker never goes stale) and never under
    ``scrape_interval_seconds``."""
    staleness_seconds: Positive = 2.0
    """A worker not scraped for this long is stale: the scorers lean on the router's own in-flight
    counts, and it is not ready (``inference_pool_ready_pods``)."""
    workers_file: StrictStr | None = None
    """YAML ``{model: [host:port, ...]}`` reloaded when it changes, without a restart."""
    prefix: PrefixIndexConfig = field(default_factory=PrefixIndexConfig)
    admission: Admission = field(default_factory=Admission)
    hints: KvHintsConfig = field(default_factory=KvHintsConfig)
    discovery: Discovery = field(default_factory=Discovery)
    disaggregation: Disaggregation = field(default_factory=Disaggregation)
    flow_control: FlowControl = field(default_factory=FlowControl)
    pool_name: Name | None = None
    """This process is the endpoint picker of that model's pool (``saar serve --pool-name``):
    only its workers, a pick always sent."""


@dataclass(frozen=True, config=_SCHEMA)
class Config:
    models: dict[Name, Model]
    """The physical models by name: the name the body's ``model`` is rewritten to, so the one the
    model server serves."""
    routing: Routing = field(default_factory=Routing)
    server: Server = field(default_factory=Server)
    identity: Identity = field(default_factory=Identity)
    limits: Limits = field(default_factory=Limits)
    memory: Memory = field(default_factory=Memory)
    state: State = field(default_factory=State)
    health: Health = field(default_factory=Health)
    scheduling: Scheduling = field(default_factory=Scheduling)
    replay: Replay = field(default_factory=Replay)
    admin: Admin = field(default_factory=Admin)
    observability: Observability = field(default_factory=Observability)
    logging: Logging = field(default_factory=Logging)


    def strips_preambles(self, model: str) -> bool:
        """Whether the body sent to ``model``'s workers has its volatile preambles cut."""
        own = self.models[model].strip_volatile_preambles
        return self.routing.prompt_normalisation.strip_upstream if own is None else own


_ADAPTER = TypeAdapter(Config)


def load_config(path: str | Path) -> Config:
    """The config in the YAML file ``path``; every problem names ``file:line: dotted.key``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    data, lines = load_yaml(text, str(path))
    return parse_config(data, source=str(path), lines=lines)


def load_yaml(text: str, source: str) -> tuple[Any, dict[str, int]]:
    """The YAML document ``text`` and the line of each of its keys (``dotted.key`` → line,
    ``key[0]`` for a list's items). A key given twice in one mapping is refused (PyYAML keeps
    the second silently), naming the file, the line and the key."""
    loader = _Loader(text, source)
    try:
        return loader.load(), loader.lines
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        what = "; ".join(str(p) for p in (exc.context, exc.problem) if p)
        column = f" (column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{where}: cannot read YAML: {what}{column}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: cannot read YAML: {exc}") from None
    finally:
        loader.dispose()


_MERGE = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key given twice in one mapping and notes the line
    of every key, walking the node tree once before building the document."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.lines: dict[str, int] = {}

    def load(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        self._walk(node, "", frozenset())
        return self.construct_document(node)

    def _walk(self, node: yaml.Node, path: str, above: frozenset[int]) -> None:
        if id(node) in above:  # a recursive alias
            return
        above = above | {id(node)}
        if isinstance(node, yaml.MappingNode):
            self._mapping(node, path, above)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                where = f"{path}[{i}]"
                self.lines.setdefault(where, item.start_mark.line + 1)
                self._walk(item, where, above)

    def _mapping(self, node: yaml.MappingNode, path: str, above: frozenset[int]) -> None:
        first: dict[str, int] = {}
        merged: list[yaml.Node] = []
        for key, value in node.value:
            if key.tag == _MERGE:  # ``<<: *anchor``: its keys yield to the explicit ones
                merged += value.value if isinstance(value, yaml.SequenceNode) else [value]
                continue
            if not isinstance(key, yaml.ScalarNode):
                continue
            line, where = key.start_mark.line + 1, _join(path, str(key.value))
            if key.value in first:
                raise ConfigError(f"{self.source}:{line}: {where}: duplicate key (first at "
                                  f"line {first[key.value]})")
            first[key.value] = line
            self.lines.setdefault(where, line)
            self._walk(value, where, above)
        for mapping in merged:
            self._walk(mapping, path, above)


def parse_config(data: Any, *, source: str = "<config>",
                 lines: Mapping[str, int] | None = None) -> Config:
    """``data`` (a YAML document) validated; ``lines`` (``dotted.key`` → line, from
    ``load_yaml``) put each problem's line beside ``source``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level: expected a mapping, got {_shown(data)}")
    try:
        config = _ADAPTER.validate_python(data)
        _check_references(config, source)
    except SchemaError as exc:
        raise ConfigError(_located(_explain(exc, source), source, lines or {})) from None
    except ConfigError as exc:
        raise ConfigError(_located(str(exc), source, lines or {})) from None
    return config


def _located(message: str, source: str, lines: Mapping[str, int]) -> str:
    """Each ``source: dotted.key: what`` line as ``source:LINE: dotted.key: what``, the line of
    the key or, for one the file lacks (a required key), of the nearest key around it."""
    prefix, out = f"{source}: ", []
    for text in message.splitlines():
        where, found, what = text.removeprefix(prefix).partition(": ")
        probe = where if text.startswith(prefix) and found else ""
        while probe and probe not in lines:
            probe = probe[:probe.rindex("[")] if probe.endswith("]") else probe.rpartition(".")[0]
        out.append(f"{source}:{lines[probe]}: {where}: {what}" if probe else text)
    return "\n".join(out)


def _explain(error: SchemaError, source: str) -> str:
    """The first problem as ``file: dotted.key: what is wrong`` (one line; the rest follow)."""
    lines = []
    for problem in error.errors():
        where = _dotted(problem["loc"]) or "top level"
        kind = problem["type"]
        if kind == "unexpected_keyword_argument":
            loc = problem["loc"]
            what = "unknown key" + _did_you_mean(str(loc[-1]), _fields_at(loc[:-1]))
        elif kind == "missing":
            what = "required key is missing"
        elif kind == "string_pattern_mismatch":
            form = _FORMS.get(problem.get("ctx", {}).get("pattern", ""), "the documented form")
            what = f"must be {form}, got {_shown(problem['input'])}"
        else:
            message = problem["msg"].replace("Input should be", "must be", 1)
            what = f"{message}, got {_shown(problem['input'])}"
        lines.append(f"{source}: {where}: {what}")
    return "\n".join(dict.fromkeys(lines))


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _fields_at(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    """The keys the schema allows in the mapping at ``loc`` (none known: empty)."""
    kind: Any = Config
    for part in loc:
        kind = _unwrapped(kind)
        fields = getattr(kind, "__pydantic_fields__", None)
        if fields is not None:
            kind = fields[part].annotation if part in fields else None
        elif get_origin(kind) is dict:
            kind = get_args(kind)[1]
        elif get_origin(kind) is tuple:
            kind = get_args(kind)[0]
        else:
            return ()
    return tuple(getattr(_unwrapped(kind), "__pydantic_fields__", ()))


def _unwrapped(kind: Any) -> Any:
    """``kind`` without ``Annotated`` and ``| None``."""
    while True:
        if get_origin(kind) is Annotated:
            kind = get_args(kind)[0]
        elif get_origin(kind) in (Union, UnionType):
            rest = [a for a in get_args(kind) if a is not type(None)]
            if len(rest) != 1:
                return kind
            kind = rest[0]
        else:
            return kind


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_references(config: Config, source: str) -> None:
    """What one key's schema cannot say: references between keys, and ranges between them."""
    _check_scheduling(config.scheduling, source)
    if not config.models:
        raise ConfigError(f"{source}: models: at least one model is required")
    for name in config.routing.logical_models:
        if name in config.models:
            raise ConfigError(
                f"{source}: routing.logical_models: {name!r} is also a physical model name"
            )
    for k, pattern in enumerate(config.routing.prompt_normalisation.volatile_preambles):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{source}: routing.prompt_normalisation.volatile_preambles[{k}]: "
                              f"{exc}") from None
    for name, model in config.models.items():
        if model.base is None:
            continue
        where = f"{source}: models.{name}.base"
        base = config.models.get(model.base)
        if base is None:
            raise ConfigError(f"{where}: unknown model {model.base!r}")
        if base.base is not None:
            raise ConfigError(f"{where}: {model.base!r} is itself an adapter (of {base.base!r})")
        if model.addresses:
            raise ConfigError(f"{source}: models.{name}: an adapter has no workers of its own "
                              f"(it is served by {model.base!r}'s)")
        if model.cluster != base.cluster:
            raise ConfigError(f"{source}: models.{name}.cluster: an adapter goes to its base's "
                              f"cluster ({base.cluster!r})")
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
        rules = decision.rules
        if rules.max_context_tokens and rules.max_context_tokens < rules.min_context_tokens:
            raise ConfigError(f"{source}: {where}.rules.max_context_tokens: below "
                              f"min_context_tokens ({rules.min_context_tokens})")
        for k, pattern in enumerate(rules.regex):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{source}: {where}.rules.regex[{k}]: {exc}") from None


def _default_weights() -> dict[str, float]:
    from .scheduling.plugins import default_weights  # the registry imports this module

    return default_weights()


def _check_scheduling(scheduling: Scheduling, source: str) -> None:
    from .scheduling.plugins import SCORERS

    for where, scorers in (("scheduling.scorers", scheduling.scorers),
                           ("scheduling.disaggregation.scorers",
                            scheduling.disaggregation.scorers)):
        for name in scorers:
            if name not in SCORERS:
                raise ConfigError(f"{source}: {where}.{name}: unknown scorer"
                                  f"{_did_you_mean(name, SCORERS)}; one of {sorted(SCORERS)}")
    if scheduling.prefix.mode == "precise" and not scheduling.prefix.tokenizer:
        raise ConfigError(f"{source}: scheduling.prefix.tokenizer: precise mode needs the "
                          "path of the model's tokenizer.json")
    if scheduling.prefix.kv_events_listen and scheduling.prefix.mode != "precise":
        raise ConfigError(f"{source}: scheduling.prefix.kv_events_listen: KV events feed the "
                          "precise index only (scheduling.prefix.mode: precise)")
    admission = scheduling.admission
    if admission.pause_threshold <= admission.resume_target:
        raise ConfigError(f"{source}: scheduling.admission.pause_threshold: must be above "
                          f"resume_target ({admission.resume_target})")
    if admission.pause_threshold - admission.hysteresis <= 0:
        raise ConfigError(f"{source}: scheduling.admission.hysteresis: must be below "
                          f"pause_threshold ({admission.pause_threshold})")
