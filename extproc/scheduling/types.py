"""The scheduling contract: what a worker looks like, what a request brings, and the plugin
protocols. Small on purpose: a scorer is one method, a picker is one method."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class Worker:
    """One model server in a model's pool, with the load signals scraped from its ``/metrics``
    (vLLM or SGLang names) and the router's own in-flight count."""

    address: str
    """``host:port``: what Envoy's override_host policy routes to."""
    model: str
    metrics_url: str | None = None
    kv_events: str | None = None
    """ZMQ endpoint of the server's KV-event publisher, for the precise prefix index."""
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    """Fraction of the KV cache in use, 0..1."""
    block_size: int = 16
    num_blocks: int | None = None
    """KV capacity in blocks as the server reports it (``vllm:cache_config_info``)."""
    cpu_blocks: int | None = None
    """Host-memory KV tier in blocks, when the server reports one (``num_cpu_blocks``)."""
    role: str = "both"
    """``prefill``, ``decode`` or ``both`` (``config.Role``): its phase in a disaggregated pool."""
    adapters_running: frozenset[str] = frozenset()
    """LoRA adapters with requests running (``vllm:lora_requests_info``)."""
    adapters_waiting: frozenset[str] = frozenset()
    """LoRA adapters with requests waiting for a slot."""
    max_lora: int | None = None
    """Adapters it batches at once (vLLM ``--max-loras``); None: not reported."""
    in_flight: int = 0
    routed: int = 0
    """Requests the router started or finished on it, ever: the scrape pacer reads a worker
    soon after this moves (``pacing``)."""
    since_scrape: int = 0
    """Requests the router started on it less those it finished since the last scrape."""
    scraped_at: float | None = None
    stale: bool = False
    """No scrape within the staleness window: the load signals are old, lean on ``in_flight``."""
    healthy: bool = True

    @property
    def requests(self) -> int:
        """Its running and waiting requests now: the last scrape moved on by what the router
        started and finished there since (a scrape is a snapshot; a request that ended just
        after it no longer counts), never below the router's own in-flight count; that count
        alone when the scrape is stale."""
        if self.stale:
            return self.in_flight
        return max(self.in_flight, self.running + self.waiting + self.since_scrape)

    @property
    def capacity_tokens(self) -> int | None:
        return None if self.num_blocks is None else self.num_blocks * self.block_size

    @property
    def decodes(self) -> bool:
        """It serves requests (a prefill-only worker answers only its sidecars' calls)."""
        return self.role != "prefill"

    @property
    def prefills(self) -> bool:
        """It takes remote prefills for decode workers."""
        return self.role == "prefill"


@dataclass(frozen=True, slots=True)
class SchedulingRequest:
    """What scheduling needs to know of one request; built once per request by the router."""

    model: str
    session_key: str | None
    prompt_blocks: Sequence[int]
    """Chained block hashes of the rendered prompt (approximate index: character blocks)."""
    prompt_tokens: int
    subset: frozenset[str] | None = None
    """The proxy's subset hint: only these addresses may be picked (None = no hint)."""
    bound_worker: str | None = None
    """The worker that served the session's last turn (its record's binding), if any."""
    pinned: str | None = None
    """A hard lock's worker (the tool calls' or provider state's issuer): first if eligible."""
    reused: int = 0
    """Leading blocks identical to the session's previous prompt (the index extends its
    chain instead of counting them again)."""
    matched: Mapping[str, float] | None = None
    """Prefix blocks each worker already holds (device-equivalent: lower tiers weighted), when
    the caller has measured them: computed once per request and read by every scorer (the
    scheduler measures what is missing)."""
    parent_session: str | None = None
    """A sub-agent's parent session key: the child starts from its parent's context, so its
    first turn goes where the parent is."""
    adapter: str | None = None
    """The LoRA adapter the request names (``model`` is then an adapter of a base model)."""
    ttft: float | None = None
    """Its time-to-first-token target in seconds (flow control's header or class), if any."""
    tpot: float | None = None
    """Its per-output-token target in seconds, if any."""


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    """Addresses best first (the rest are fallbacks for retries) and each scorer's view."""

    ordered: tuple[str, ...]
    scores: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """scorer name → address → score in [0, 1]."""
    total: Mapping[str, float] = field(default_factory=dict)
    matched_blocks: Mapping[str, float] = field(default_factory=dict)
    """Prefix blocks of this request already cached on each worker (from the prefix index;
    device-equivalent, lower tiers weighted)."""
    durations: Mapping[str, float] = field(default_factory=dict)
    """plugin name → seconds it took, for the metrics."""
    failed: tuple[str, ...] = ()
    """Plugins that raised this time (contained: a scorer counts as 0, a filter as a no-op)."""
    shed: bool = False
    """Every candidate's queue is over ``max_waiting_per_worker``: answer 429, not 503."""


class Filter(Protocol):
    name: str

    def filter(self, request: SchedulingRequest, workers: Sequence[Worker]) -> list[Worker]:
        """The workers that may serve this request (never raises; may return none)."""
        ...


class Scorer(Protocol):
    name: str

    def score(self, request: SchedulingRequest, workers: Sequence[Worker]) -> dict[str, float]:
        """address → score in [0, 1], higher is better; the runner clamps and weights."""
        ...


class Picker(Protocol):
    def pick(self, totals: Mapping[str, float]) -> list[str]:
        """Addresses ordered best first; ties broken at random (seeded by the runner)."""
        ...


class PickObserver(Protocol):
    def picked(self, request: SchedulingRequest, address: str) -> None:
        """The runner sent ``request`` to ``address`` (a stateful scorer learns from it)."""
        ...


class PrefixIndex(Protocol):
    """Which prompt blocks each worker holds: approximate (learnt from routing) or precise
    (from the servers' KV events)."""

    def matched_blocks(self, worker: str, blocks: Sequence[int]) -> float:
        """Length of the longest prefix of ``blocks`` that ``worker`` holds (an index with
        memory tiers weighs the blocks held below the device)."""
        ...

    def routed(self, worker: str, blocks: Sequence[int], extends: int = 0) -> None:
        """``blocks`` were sent to ``worker`` (the approximate index learns; precise ignores).
        ``extends``: how many leading blocks are the session's previous prompt."""
        ...
