"""The scheduling contract: what a worker looks like, what a request brings, and the plugin
protocols. Small on purpose: a scorer is one method, a picker is one method."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class EngineTotals:
    """Counters an engine's ``/metrics`` page keeps from its start (vLLM's names); None where
    the page does not say. Only their moves between two scrapes mean anything."""

    prompt_tokens: float | None = None
    """``vllm:prompt_tokens_total``: prompt tokens of the requests it ran."""
    cached_tokens: float | None = None
    """``vllm:prefix_cache_hits_total``: of those, the tokens found in its prefix cache."""
    prefill_seconds: float | None = None
    """``vllm:request_prefill_time_seconds_sum``: time its requests spent in prefill."""
    prefills: float | None = None
    """``vllm:request_prefill_time_seconds_count``."""
    itl_seconds: float | None = None
    """``vllm:inter_token_latency_seconds_sum`` (or ``time_per_output_token``)."""
    itls: float | None = None
    """Its ``_count``: the output tokens those gaps were measured over."""


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
    engine: EngineTotals | None = None
    """The engine's own running totals (prefill time, prompt and cached tokens, inter-token
    latency), when its ``/metrics`` reports them: the predicted cost form learns its rates
    from how they move between scrapes."""
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
    request_id: str | None = None
    """Names the request to the predicted cost form, which counts it in its worker's wait
    until its first token (``Scheduler.cost``'s ``first_token`` / ``finished``)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """One worker's predicted time to first token for one request, term by term, in seconds
    (the ``predicted`` cost form): the pick minimises ``cost_s``."""

    uncached_tokens: float
    """The prompt tokens this worker would prefill (its cached prefix, lower tiers weighted,
    taken off)."""
    ahead_tokens: float
    """Prefill queued ahead of it there: the uncached prompts of the requests routed there
    still without a first token, or its waiting requests at the average uncached prompt,
    whichever is more."""
    decoding: int
    """Requests decoding there while it waits and prefills."""
    wait_s: float
    """``ahead_tokens`` at the worker's prefill rate."""
    prefill_s: float
    """``uncached_tokens`` at the worker's prefill rate."""
    steps_s: float
    """The decode steps of the ``decoding`` requests the engine interleaves with those
    prefill chunks."""
    overhead_s: float
    """What every request pays besides (the network, the engine's scheduling): the same on
    every worker of a pool, so it never decides."""
    interference_s: float = 0.0
    """The decode interference it adds: each of the ``decoding`` requests there waits out its
    prefill chunks between two of its tokens (``decoding`` x ``prefill_s``)."""
    adapter_s: float = 0.0
    """Its LoRA adapter's load there (and the wait for a slot), if it is not loaded."""
    evicts_s: float = 0.0
    """The prefill its KV would cost the sessions live there: the part of its prompt that
    does not fit beside theirs (in host memory: a copy back) is prefilled again by someone."""

    @property
    def ttft_s(self) -> float:
        return (self.overhead_s + self.adapter_s + self.wait_s + self.prefill_s
                + self.steps_s)

    @property
    def cost_s(self) -> float:
        """What the pick minimises: its own time to first token and the time it costs the
        requests and sessions already there."""
        return self.ttft_s + self.interference_s + self.evicts_s


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
    predicted: Mapping[str, Prediction] = field(default_factory=dict)
    """address → its predicted time to first token (the ``predicted`` cost form)."""


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
