"""One simulated vLLM-like worker: a waiting queue, a running batch and a KV pool.

Time advances in macro-steps of a few engine iterations (continuous batching with chunked
prefill): each iteration decodes one token for every running request past its prefill and
spends up to ``chunk_tokens`` on prefill. Prefill cost is per uncached prompt token, growing
with context (attention); decode cost per iteration grows with batch size and with the KV the
batch reads. A request enters the batch only if its whole KV (prompt and output) fits beside
the running ones; cached blocks of finished requests fill the rest of the pool, LRU-evicted
into host memory (``tiers``). A request whose prefix sits in host memory waits in the batch for
its blocks to land, then prefills only the rest; the batch keeps running meanwhile.

Disaggregated, a prefill worker takes prefill-only requests (vLLM's ``max_tokens: 1`` call from
the decode worker's sidecar) and caches what it computed; the decode worker then admits the
request, pulls the KV it does not hold over its transfer link (vLLM's KV connector: a latency,
then ``kv_transfer_tokens_per_s``, one transfer at a time), computes the last token and decodes.

LoRA adapters take GPU slots (``max_lora``): a request whose adapter is not loaded loads it
into a free slot, or into the slot of the least recently used adapter no running request
uses, paying ``adapter_load_s``; with every slot busy it waits (vLLM skips it and schedules the
next request). The gauge ``vllm:lora_requests_info`` reports the adapters of the running and
the waiting requests.

The worker also takes the router's KV hints (``scheduling.kv_hints``) and resolves each against
what it knows of the session (``ownership``); it may ignore any of them.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...scheduling.kv_hints import KvHint
from .ownership import SessionBlocks
from .tiers import KVListener, TieredKV


@dataclass(frozen=True)
class CostModel:
    """Timing of one worker; defaults are in the range of a large MoE model on a TP4 H100 node."""

    prefill_s_per_token: float = 1 / 16000
    prefill_s_per_token_ctx: float = 1 / 16000 / 65536
    """Attention: a prompt token at 64k context costs twice one at the start."""
    decode_base_s: float = 0.018
    decode_s_per_seq: float = 0.0003
    decode_s_per_kv_token: float = 2e-8
    chunk_tokens: int = 8192
    """Prefill tokens per iteration (vLLM's ``max_num_batched_tokens``)."""
    iterations_per_step: int = 8
    """Engine iterations simulated as one event; trades timing resolution for speed."""
    cpu_tokens_per_s: float = 400_000.0
    """Host-to-device KV copy rate: about 50 GB/s (one PCIe Gen5 x16 link in practice) at
    ~127 KB of KV per token (62 layers, 8 KV heads of 128, FP8): 25 times the prefill rate.
    TP4 has four links, but copies of small blocks and contention with compute get less; a
    quarter of this (``--cpu-tokens-per-s 100000``) moves the hit rates by under half a point."""
    disk_tokens_per_s: float = 50_000.0
    """Disk-to-device rate: about 6 GB/s, one NVMe drive."""
    kv_transfer_tokens_per_s: float = 200_000.0
    """Prefill-to-decode KV transfer rate (NIXL over RDMA): about 25 GB/s, a 200 Gb/s NIC, at
    ~127 KB of KV per token."""
    kv_transfer_latency_s: float = 0.02
    """Per hand-off: the sidecar's extra HTTP round trip and the transfer's setup."""
    adapter_load_s: float = 0.25
    """Loading a LoRA adapter into a GPU slot (from host memory: weights of a rank-16..64
    adapter of a large model, plus vLLM's slot bookkeeping)."""


@dataclass(frozen=True)
class WorkerSpec:
    capacity_tokens: int = 512_000
    """The device KV pool."""
    max_batch: int = 64
    cpu_tokens: int = 1_024_000
    """Host-memory KV tier (0: none): twice the device pool, ~130 GB at 127 KB a token, what a
    node with 1-2 TB of DRAM gives an offloading connector."""
    disk_tokens: int = 0
    """Disk KV tier under host memory (0: none)."""
    offload: bool = True
    """Device evictions go to host memory (plain LRU offload, no hints needed)."""
    share_fraction: float = 0.2
    """At most this share of the device pool is pinned by ``share`` hints."""
    max_lora: int = 0
    """LoRA adapters batched at once (vLLM ``--max-loras``; 0: adapters not modelled)."""


@dataclass(slots=True, eq=False)
class SimRequest:
    """One turn on its way through a worker; the worker fills in the second half."""

    session: str
    prompt_tokens: int
    output_tokens: int
    blocks: Sequence[int]
    """Full prompt blocks (chained hashes)."""
    done_blocks: Sequence[int]
    """Full blocks of prompt and output: what the cache holds once the turn ends."""
    ready_s: float
    """When the turn was ready at the router: the origin of its TTFT."""
    priority: float = 0.0
    """Seconds of queue precedence (admission's demotion and resume boosts)."""
    adapter: str | None = None
    """The LoRA adapter it runs with (None: the base model)."""
    prefill_only: bool = False
    """A disaggregated prefill (the sidecar's call to a prefill worker): no answer of its own."""
    remote: bool = False
    """Its prefill was done on a prefill worker: the KV it lacks comes over the transfer link."""
    remote_tokens: int = 0
    """Prompt tokens whose KV was transferred (not computed here, not a cache hit here)."""
    cached_tokens: int = 0
    """Prompt tokens not prefilled: found on the device or copied from a lower tier."""
    lower_tokens: dict[str, int] = field(default_factory=dict)
    """Of those, the tokens copied from CPU / DISK on this request's critical path."""
    loaded_s: float = 0.0
    """When its copied blocks are on the device: prefill starts no earlier."""
    prefill_left: int = 0
    produced: int = 0
    kv_blocks: int = 0
    first_token_s: float | None = None
    done_s: float | None = None
    placed_s: float = 0.0
    """When the router sent it (after any wait in its queue or hold)."""


class EngineWorker:
    def __init__(self, address: str, spec: WorkerSpec, cost: CostModel, block_size: int,
                 listener: KVListener | None = None) -> None:
        self.address = address
        self.spec = spec
        self.cost = cost
        self.block_size = block_size
        self.total_blocks = spec.capacity_tokens // block_size
        self.kv = TieredKV(block_size=block_size, device_blocks=self.total_blocks,
                           cpu_blocks=spec.cpu_tokens // block_size,
                           disk_blocks=spec.disk_tokens // block_size, offload=spec.offload,
                           share_blocks=int(spec.share_fraction * self.total_blocks),
                           cpu_tokens_per_s=cost.cpu_tokens_per_s,
                           disk_tokens_per_s=cost.disk_tokens_per_s, listener=listener)
        self.sessions = SessionBlocks()
        self._here: Counter[str] = Counter()
        """Requests of each session waiting or running here: its KV is in use."""
        self.running: list[SimRequest] = []
        self.busy = False
        self._waiting: list[tuple[float, int, SimRequest]] = []
        self._seq = 0
        self._kv_blocks = 0
        self._reserved = 0
        self._plan: list[tuple[SimRequest, int]] = []
        self._decoders: list[SimRequest] = []
        self._iterations = 0
        self._link_free_s = 0.0
        """When the KV transfer link is free (transfers to this decode worker queue on it)."""
        self.adapters: dict[str, float] = {}
        """Adapters in GPU slots → when loaded (ready), least recently used first."""
        self.adapter_loads = 0

    def adapter_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """The adapters of the running and of the waiting requests (the LoRA gauge)."""
        running = frozenset(r.adapter for r in self.running if r.adapter is not None)
        waiting = frozenset(r.adapter for _, _, r in self._waiting if r.adapter is not None)
        return running, waiting

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return self._kv_blocks / self.total_blocks

    def submit(self, request: SimRequest, now: float) -> None:
        self._seq += 1
        heapq.heappush(self._waiting, (now - request.priority, self._seq, request))
        self._here[request.session] += 1
        self.sessions.update(request.session, request.blocks)

    def hint(self, hint: KvHint, now: float) -> bool:
        """Apply a router hint if it can; False: ignored (an unknown session, nothing to move,
        no room, or a demote of a session whose KV a request here is using)."""
        session = hint.session
        blocks = self.sessions.blocks(session)
        if not blocks:
            return False
        match hint.kind:
            case "share":
                return self.kv.share(session, blocks[: hint.prefix_tokens // self.block_size])
            case "prefetch":
                return self.kv.prefetch(session, blocks, now)
            case "demote":
                return not self._here[session] and self.kv.demote(
                    session, self.sessions.unique(session))
            case "release":
                keep = hint.prefix_tokens // self.block_size
                self.kv.release(session, self.sessions.forget(session, keep))
                return True

    def start_step(self, now: float) -> float | None:
        """Admit what fits, plan the next macro-step and return its duration (None: idle)."""
        self._admit(now)
        cost = self.cost
        self._decoders = [r for r in self.running if r.prefill_left == 0]
        self._plan = []
        budget = cost.chunk_tokens * cost.iterations_per_step
        prefill_s = 0.0
        loading = [r.loaded_s for r in self.running if r.prefill_left and r.loaded_s > now]
        for request in self.running:
            if budget == 0:
                break
            if request.prefill_left and request.loaded_s <= now:
                take = min(request.prefill_left, budget)
                context = request.prompt_tokens - request.prefill_left + take / 2
                prefill_s += take * (cost.prefill_s_per_token
                                     + cost.prefill_s_per_token_ctx * context)
                budget -= take
                self._plan.append((request, take))
        if not self._decoders and not self._plan:
            self.busy = bool(loading)
            return min(loading) - now if loading else None
        self.busy = True
        if self._decoders:
            remaining = max(r.output_tokens - r.produced for r in self._decoders)
            self._iterations = max(1, min(cost.iterations_per_step, remaining))
            kv = sum(r.prompt_tokens + r.produced for r in self._decoders)
            per_iteration = (cost.decode_base_s + cost.decode_s_per_seq * len(self._decoders)
                             + cost.decode_s_per_kv_token * kv)
        else:
            self._iterations = 0
            prefilled = sum(take for _, take in self._plan)
            per_iteration = cost.decode_base_s * math.ceil(prefilled / cost.chunk_tokens)
        return max(self._iterations, 1) * per_iteration + prefill_s

    def finish_step(self, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Apply the planned step; returns (requests that got their first token, finished)."""
        first: list[SimRequest] = []
        for request in self._decoders:
            request.produced = min(request.output_tokens, request.produced + self._iterations)
        for request, take in self._plan:
            request.prefill_left -= take
            if request.prefill_left == 0:
                request.first_token_s = now
                request.produced = 1
                first.append(request)
        done = [r for r in self.running
                if r.prefill_left == 0 and r.produced >= r.output_tokens]
        for request in done:
            request.done_s = now
            self.running.remove(request)
            self._kv_blocks -= request.kv_blocks
            self._reserved -= request.kv_blocks - len(request.blocks)
            self._here[request.session] -= 1
            if not self._here[request.session]:
                del self._here[request.session]
            self.sessions.update(request.session, request.done_blocks)
            self.kv.touch(request.done_blocks)
        if done:
            self.kv.reserve(self._reserved)
        return first, done

    def _admit(self, now: float) -> None:
        skipped: list[tuple[float, int, SimRequest]] = []
        while self._waiting and len(self.running) < self.spec.max_batch:
            request = self._waiting[0][2]
            need = -(-(request.prompt_tokens + request.output_tokens) // self.block_size)
            if self.running and self._kv_blocks + need > self.total_blocks:
                break
            entry = heapq.heappop(self._waiting)
            adapter_ready = self._adapter(request.adapter, now)
            if adapter_ready is None:  # every slot busy with running adapters: next request
                skipped.append(entry)
                continue
            lookable = max(request.prompt_tokens - 1, 0) // self.block_size
            found = self.kv.lookup(request.blocks, lookable, now)
            size = self.block_size
            request.lower_tokens = {m: n * size for m, n in found.lower.items()}
            request.cached_tokens = found.device * size + sum(request.lower_tokens.values())
            request.loaded_s = max(found.ready_s, adapter_ready)
            request.prefill_left = request.prompt_tokens - request.cached_tokens
            if request.remote and request.prefill_left > 1:
                request.remote_tokens = request.prefill_left - 1  # the last token: computed here
                request.prefill_left = 1
                rate = self.cost.kv_transfer_tokens_per_s
                self._link_free_s = max(now, self._link_free_s) + request.remote_tokens / rate
                request.loaded_s = max(request.loaded_s,
                                       self._link_free_s + self.cost.kv_transfer_latency_s)
            request.kv_blocks = need
            self._kv_blocks += need
            self._reserved += need - len(request.blocks)
            self.kv.reserve(self._reserved)
            self.running.append(request)
        for entry in skipped:
            heapq.heappush(self._waiting, entry)

    def _adapter(self, adapter: str | None, now: float) -> float | None:
        """When ``adapter`` is ready in a GPU slot (loading it if it must); None: no slot."""
        if adapter is None or not self.spec.max_lora:
            return now
        ready = self.adapters.pop(adapter, None)
        if ready is None:
            busy = {r.adapter for r in self.running}
            if len(self.adapters) >= self.spec.max_lora:
                idle = next((a for a in self.adapters if a not in busy), None)
                if idle is None:
                    return None
                del self.adapters[idle]
            ready = now + self.cost.adapter_load_s
            self.adapter_loads += 1
        self.adapters[adapter] = ready  # the most recently used last
        return ready
