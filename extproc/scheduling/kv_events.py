"""Precise prefix index: which token blocks each worker holds, from vLLM's KV events over ZMQ.

Wire format (vLLM ``ZmqEventPublisher``): multipart ``[topic, sequence (8-byte big-endian),
msgpack payload]``; the payload is ``[ts, events, dp_rank?]`` and each event a tagged array
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]``,
``["BlockRemoved", block_hashes, medium, ...]`` or ``["AllBlocksCleared"]``. Trailing fields a
version does not send are optional, later ones are ignored, and the map form some builds emit
(``{"type": "BlockStored", ...}``) is accepted too.

The index never trusts the engine's block hashes for matching (they depend on vLLM's hash
function and seed): it recomputes its own chained hash from each event's ``token_ids`` and keeps,
per worker, engine hash → own hash so that ``BlockRemoved`` (engine hashes only) can be applied.

Memory tiers: each event's ``medium`` puts its blocks on the worker's device (``GPU``, or none
given), in host memory (``CPU``: vLLM's offloading connector, LMCache) or on disk. Offloading
connectors report a block moved below with its engine hash and no token ids; the index knows
its own hash from when the device stored it. A shared pool (Mooncake Store, ``shared_pool``)
holds blocks any worker can load. Per worker a request's overlap is the device prefix depth D,
the host-memory and disk depth beyond it, and the shared pool's hits beyond D only, so a device
hit is never counted twice; the index weighs them into device-equivalent blocks
(``TierWeights``: Dynamo credits a host hit 0.75 and a disk hit 0.25 of a device hit).
"""

from __future__ import annotations

import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgpack
import xxhash

from ..apis import chain_hashes

log = logging.getLogger(__name__)

EngineHash = int | bytes
"""vLLM's block hash: an int in older releases, a digest (bytes) in newer ones."""

GPU = "GPU"
DEVICE, CPU, DISK = "device", "cpu", "disk"
"""The index's tiers, as ``scheduling.prefix.tier_weights`` names them."""
_TIER_OF_MEDIUM = {"gpu": DEVICE, "cuda": DEVICE, "device": DEVICE, "hbm": DEVICE,
                   "cpu": CPU, "cpu_pinned": CPU, "host": CPU, "dram": CPU,
                   "disk": DISK, "ssd": DISK, "nvme": DISK, "local_disk": DISK}
_BIT = {DEVICE: 1, CPU: 2, DISK: 4}


def tier_of(medium: str | None) -> str | None:
    """The tier an event's ``medium`` names (none: the device); None for a medium the index
    does not keep (an engine's own view of external storage: the shared pool has its own
    feed)."""
    return DEVICE if medium is None else _TIER_OF_MEDIUM.get(medium.lower())


class KVEventDecodeError(ValueError):
    """A frame or payload that is not a vLLM KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    dp_rank: int | None = None


# -- wire format -----------------------------------------------------------------------------


def encode_batch(batch: EventBatch) -> bytes:
    """The msgpack payload, array-shaped as vLLM's msgspec structs encode it."""
    doc: list[Any] = [batch.ts, [_encode_event(e) for e in batch.events]]
    if batch.dp_rank is not None:
        doc.append(batch.dp_rank)
    return msgpack.packb(doc, use_bin_type=True)


def encode_frames(topic: str, seq: int, batch: EventBatch) -> list[bytes]:
    return [topic.encode(), seq.to_bytes(8, "big"), encode_batch(batch)]


def decode_frames(frames: Sequence[bytes]) -> tuple[str, int, EventBatch]:
    """``(topic, sequence, batch)`` of one published message."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"expected [topic, sequence, payload], got {len(frames)} frames")
    if len(frames[1]) != 8:
        raise KVEventDecodeError(f"sequence is {len(frames[1])} bytes, not 8")
    try:
        topic = bytes(frames[0]).decode()
    except UnicodeDecodeError as exc:
        raise KVEventDecodeError(f"topic is not UTF-8: {exc}") from None
    return topic, int.from_bytes(frames[1], "big"), decode_batch(frames[2])


def decode_batch(payload: bytes) -> EventBatch:
    """A payload as ``EventBatch``; events of unknown type are skipped (newer vLLM releases may
    add some), malformed known ones raise ``KVEventDecodeError``."""
    try:
        doc = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except ValueError as exc:
        raise KVEventDecodeError(f"not msgpack: {exc}") from None
    if isinstance(doc, dict):
        doc = [doc.get("ts"), doc.get("events"), doc.get("data_parallel_rank")]
    if not isinstance(doc, list) or len(doc) < 2:
        raise KVEventDecodeError("payload is not [ts, events, dp_rank?]")
    ts, events, dp_rank = (*doc, None)[:3]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not isinstance(events, list):
        raise KVEventDecodeError("payload is not [ts, events, dp_rank?]")
    decoded = (_decode_event(e) for e in events)
    return EventBatch(
        float(ts),
        tuple(e for e in decoded if e is not None),
        _optional(dp_rank, int, "dp_rank"),
    )


def _encode_event(event: KVEvent) -> list[Any]:
    match event:
        case BlockStored():
            return [
                "BlockStored",
                list(event.block_hashes),
                event.parent_block_hash,
                list(event.token_ids),
                event.block_size,
                event.lora_id,
                event.medium,
            ]
        case BlockRemoved():
            return ["BlockRemoved", list(event.block_hashes), event.medium]
        case AllBlocksCleared():
            return ["AllBlocksCleared"]


_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _decode_event(raw: Any) -> KVEvent | None:
    if isinstance(raw, dict):
        tag = raw.get("type")
        values = [raw.get(name) for name in _FIELDS.get(tag, ())] if isinstance(tag, str) else []
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        values = [*raw[1:], *[None] * len(_FIELDS.get(tag, ()))]
    else:
        raise KVEventDecodeError(f"event is not a tagged array: {raw!r:.80}")
    if tag == "BlockStored":
        hashes, parent, tokens, block_size, lora_id, medium = values[:6]
        if not isinstance(tokens, list) or not all(_is_token(t) for t in tokens):
            raise KVEventDecodeError("BlockStored.token_ids is not a list of token ids")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise KVEventDecodeError(f"BlockStored.block_size is not positive: {block_size!r}")
        if parent is not None and not _is_hash(parent):
            raise KVEventDecodeError(f"BlockStored.parent_block_hash is invalid: {parent!r}")
        return BlockStored(
            _hashes(hashes),
            parent,
            tuple(tokens),
            block_size,
            _optional(lora_id, int, "lora_id"),
            _optional(medium, str, "medium"),
        )
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(values[0]), _optional(values[1], str, "medium"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _is_hash(value: Any) -> bool:
    return isinstance(value, bytes) or (isinstance(value, int) and not isinstance(value, bool))


def _is_token(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 32


def _hashes(value: Any) -> tuple[EngineHash, ...]:
    if not isinstance(value, list) or not all(_is_hash(h) for h in value):
        raise KVEventDecodeError(f"block_hashes is not a list of hashes: {value!r:.80}")
    return tuple(value)


def _optional(value: Any, kind: type, name: str) -> Any:
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise KVEventDecodeError(f"{name} is not {kind.__name__} or nil: {value!r:.80}")
    return value


# -- the router's own block hash -------------------------------------------------------------


def token_block_hashes(
    token_ids: Sequence[int], block_size: int, model: str | None = None
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (packed as little-endian uint32):
    ``h[i] = xxh3_64(block i, seed=h[i-1])``, the chain seeded by ``model`` as the approximate
    index's is. A trailing partial block has none."""
    return _chain(_root(model), token_ids, block_size)


def _root(model: str | None) -> int:
    return xxhash.xxh3_64_intdigest(model.encode()) if model else 0


def _chain(parent: int, token_ids: Sequence[int], block_size: int) -> list[int]:
    pack = _packer(block_size).pack
    stop = len(token_ids) - block_size + 1
    return chain_hashes(
        (pack(*token_ids[start : start + block_size]) for start in range(0, stop, block_size)),
        seed=parent,
    )


@lru_cache(maxsize=8)
def _packer(block_size: int) -> struct.Struct:
    return struct.Struct(f"<{block_size}I")


# -- the index -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TierWeights:
    """What a block found in each tier is worth, in device blocks (host memory and disk cost a
    copy to the device instead of a prefill; the shared pool a network transfer)."""

    device: float = 1.0
    cpu: float = 0.75
    disk: float = 0.25
    shared: float = 0.5


@dataclass(frozen=True, slots=True)
class TierOverlap:
    """Where a request's prefix is on one worker, in blocks: ``device`` = D, the device prefix
    depth; ``cpu`` and ``disk`` the depth beyond it that host memory and then disk continue;
    ``shared`` the shared pool's hits in ``[D, request blocks)``."""

    device: int = 0
    cpu: int = 0
    disk: int = 0
    shared: int = 0
    weighted: float = 0.0
    """Device-equivalent blocks: each block counted once, at its best tier's weight."""


@dataclass(slots=True)
class _WorkerView:
    engine: dict[EngineHash, int] = field(default_factory=dict)
    """Engine hash → own hash, oldest first (for the memory bound), while any tier holds it."""
    tiers: dict[EngineHash, int] = field(default_factory=dict)
    """Engine hash → the tiers holding it (bits of ``_BIT``)."""
    held: dict[str, dict[int, int]] = field(
        default_factory=lambda: {DEVICE: {}, CPU: {}, DISK: {}})
    """Per tier, own hash → how many engine blocks carry it there (vLLM may mix a cache salt
    into its hash, so equal tokens can come as distinct engine blocks)."""
    last_seq: int | None = None
    stale: bool = False

    def clear(self) -> None:
        self.engine.clear()
        self.tiers.clear()
        for held in self.held.values():
            held.clear()

    def add(self, engine_hash: EngineHash, own: int, tier: str) -> None:
        if self.engine.get(engine_hash, own) != own:
            self.drop(engine_hash)
        self.engine[engine_hash] = own
        bits = self.tiers.get(engine_hash, 0)
        if not bits & _BIT[tier]:
            self.tiers[engine_hash] = bits | _BIT[tier]
            held = self.held[tier]
            held[own] = held.get(own, 0) + 1

    def drop(self, engine_hash: EngineHash, tier: str | None = None) -> None:
        """Drop the block from ``tier`` (None: from every tier)."""
        bits = self.tiers.get(engine_hash, 0)
        for name, bit in _BIT.items():
            if bits & bit and (tier is None or tier == name):
                bits &= ~bit
                held, own = self.held[name], self.engine[engine_hash]
                if held[own] > 1:
                    held[own] -= 1
                else:
                    del held[own]
        if bits:
            self.tiers[engine_hash] = bits
        else:
            self.tiers.pop(engine_hash, None)
            self.engine.pop(engine_hash, None)


_NO_VIEW = _WorkerView()
"""What a worker that never reported looks like (read only)."""
_NO_ROUTED: OrderedDict[int, float] = OrderedDict()
"""A worker nothing was routed to lately (read only)."""
ROUTED_SECONDS = 10.0
"""How long routed blocks count as on a worker's device before its events confirm them:
longer than a request's queue and prefill usually take, short enough that a request refused
or sent elsewhere stops counting soon."""


class PreciseKVIndex:
    """``PrefixIndex`` fed by the servers' KV events: a block counts while its worker reports
    it stored, on the device at full weight, in host memory or on disk at its tier's weight
    (``matched_blocks``; ``overlap`` tells the tiers apart), and in the shared pool for every
    worker beyond its device prefix.

    Request blocks must be hashed with ``hash_tokens`` (same block size and model seed). Blocks
    of another block size, of a LoRA adapter, whose parent is unknown (missed events), or moved
    below without token ids before the index knew them are skipped and counted in
    ``skipped_blocks``: they cannot match a request hashed here, and under-reporting a match is
    safer than inventing one.
    """

    def __init__(
        self,
        *,
        block_size: int = 16,
        model: str | None = None,
        max_blocks_per_worker: int = 65536,
        weights: TierWeights | None = None,
        routed_seconds: float = ROUTED_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``routed_seconds``: how long blocks routed to a worker count as on its device before
        its events confirm them (0: never)."""
        if block_size < 1 or max_blocks_per_worker < 1:
            raise ValueError("block_size and max_blocks_per_worker must be positive")
        self.routed_seconds = routed_seconds
        self._clock = clock
        self._routed: dict[str, OrderedDict[int, float]] = {}
        """worker → own hash → until when it counts as on the device, soonest first."""
        self.block_size = block_size
        self.max_blocks_per_worker = max_blocks_per_worker
        self.weights = weights or TierWeights()
        self._root = _root(model)
        self._views: dict[str, _WorkerView] = {}
        self.shared: Mapping[int, object] = {}
        """The shared pool's blocks (own hashes), when a pool is attached (``SharedKVPool``)."""
        self.listeners: list[Callable[[str, str, Sequence[int], bool], None]] = []
        """Told ``(worker, tier, own hashes, stored)`` of every change applied (the
        session-prefix index follows where blocks sit)."""
        self.gaps = 0
        """Sequence gaps seen (each reset a worker's view and marked it stale)."""
        self.skipped_blocks = 0

    def __len__(self) -> int:
        """Engine blocks known, over every worker and tier (what the memory bound counts)."""
        return sum(len(view.engine) for view in self._views.values())

    def hash_tokens(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """The request-side block hashes that ``matched_blocks`` compares."""
        return tuple(_chain(self._root, token_ids, self.block_size))

    def extend_hash(self, parent: int, token_ids: Sequence[int]) -> list[int]:
        """Own hashes of the full blocks of ``token_ids`` after the block hashed ``parent``."""
        return _chain(parent, token_ids, self.block_size)

    def own_hash(self, engine_hash: EngineHash) -> int | None:
        """The index's hash of a block some worker reported under ``engine_hash``."""
        for view in self._views.values():
            own = view.engine.get(engine_hash)
            if own is not None:
                return own
        return None

    def matched_blocks(self, worker: str, blocks: Sequence[int]) -> float:
        """The request's overlap with ``worker`` in device-equivalent blocks (``overlap``)."""
        return self.overlap(worker, blocks).weighted

    def overlap(self, worker: str, blocks: Sequence[int]) -> TierOverlap:
        view = self._views.get(worker)
        if view is None:
            view = _NO_VIEW
        device, cpu, disk = view.held[DEVICE], view.held[CPU], view.held[DISK]
        total = len(blocks)
        depth = 0
        routed = self._routed_now(worker)
        while depth < total and (blocks[depth] in device or blocks[depth] in routed):
            depth += 1
        if not (cpu or disk or self.shared):
            return TierOverlap(depth, weighted=float(depth))
        host = depth
        while host < total and (blocks[host] in cpu or blocks[host] in device):
            host += 1
        local = host
        while local < total and (blocks[local] in disk or blocks[local] in cpu
                                 or blocks[local] in device):
            local += 1
        w = self.weights
        pool = self.shared
        weighted = w.device * depth
        shared = 0
        for at in range(depth, total):
            in_pool = blocks[at] in pool
            shared += in_pool
            tier = w.cpu if at < host else w.disk if at < local else 0.0
            weighted += max(tier, w.shared if in_pool else 0.0)
        return TierOverlap(depth, host - depth, local - host, shared, weighted)

    def routed(self, worker: str, blocks: Sequence[int], extends: int = 0) -> None:
        """``blocks`` were sent to ``worker``: they count as on its device (soon cached
        there) for ``routed_seconds``, or until its events say it dropped them — so a
        concurrent request with the same prompt, or the session's next turn sent before the
        events came, finds them there (Dynamo's predicted-on-route side index)."""
        if self.routed_seconds <= 0 or not blocks:
            return
        routed = self._routed_now(worker)
        if not routed:
            routed = self._routed[worker] = OrderedDict()
        until = self._clock() + self.routed_seconds
        for block in blocks[: self.max_blocks_per_worker]:
            routed[block] = until
            routed.move_to_end(block)
        while len(routed) > self.max_blocks_per_worker:
            routed.popitem(last=False)

    def _routed_now(self, worker: str) -> OrderedDict[int, float]:
        """``worker``'s routed blocks still counting (the lapsed ones dropped)."""
        routed = self._routed.get(worker)
        if not routed:
            return _NO_ROUTED
        now = self._clock()
        while routed and next(iter(routed.values())) <= now:
            routed.popitem(last=False)
        return routed

    def block_count(self, worker: str, tier: str | None = None) -> int:
        """Blocks ``worker`` reports (in ``tier``; None: in any)."""
        view = self._views.get(worker)
        if view is None:
            return 0
        if tier is None:
            return len(view.engine)
        return sum(1 for bits in view.tiers.values() if bits & _BIT[tier])

    def last_seq(self, worker: str) -> int | None:
        view = self._views.get(worker)
        return None if view is None else view.last_seq

    def stale(self, worker: str) -> bool:
        """True when events were missed and the view may lack blocks; cleared by the next
        ``AllBlocksCleared`` (the only point where the true state is known again)."""
        view = self._views.get(worker)
        return view is not None and view.stale

    def forget(self, worker: str) -> None:
        self._views.pop(worker, None)
        self._routed.pop(worker, None)

    def apply(self, worker: str, batch: EventBatch, seq: int | None = None) -> None:
        """Apply one published batch. ``seq`` (the wire sequence number) detects lost batches:
        a gap resets the view and marks it stale; sequence 0 after others is a publisher
        restart, whose cache starts empty, so the view is reset but exact."""
        view = self._views.setdefault(worker, _WorkerView())
        if seq is not None:
            if view.last_seq is None:
                view.stale = seq != 0
            elif seq == 0:
                view.clear()
                view.stale = False
            elif seq != view.last_seq + 1:
                log.warning("KV events from %s: sequence %d after %d; view reset",
                            worker, seq, view.last_seq)
                self.gaps += 1
                view.clear()
                view.stale = True
            view.last_seq = seq
        self._apply_events(worker, view, batch.events)
        while len(view.engine) > self.max_blocks_per_worker:
            self._drop(worker, view, next(iter(view.engine)), None)

    def _apply_events(self, worker: str, view: _WorkerView, events: Iterable[KVEvent]) -> None:
        for event in events:
            match event:
                case BlockStored():
                    tier = tier_of(event.medium)
                    if tier is None:
                        self.skipped_blocks += len(event.block_hashes)
                    else:
                        self._store(worker, view, event, tier)
                case BlockRemoved():
                    tier = tier_of(event.medium)
                    for engine_hash in event.block_hashes if tier is not None else ():
                        self._drop(worker, view, engine_hash, tier)
                case AllBlocksCleared():
                    for tier, held in view.held.items():
                        self._tell(worker, tier, list(held), False)
                    view.clear()
                    view.stale = False
                    self._routed.pop(worker, None)

    def _store(self, worker: str, view: _WorkerView, event: BlockStored, tier: str) -> None:
        count = len(event.block_hashes)
        if event.lora_id is not None or event.block_size != self.block_size:
            self.skipped_blocks += count
            return
        if not event.token_ids:  # moved between tiers: known by its engine hash
            known = [(e, view.engine.get(e)) for e in event.block_hashes]
            own = [o for _, o in known if o is not None]
            self.skipped_blocks += count - len(own)
            for engine_hash, own_hash in known:
                if own_hash is not None:
                    view.add(engine_hash, own_hash, tier)
            self._tell(worker, tier, own, True)
            return
        if event.parent_block_hash is None:
            parent: int | None = self._root
        else:
            parent = view.engine.get(event.parent_block_hash)
        if parent is None or len(event.token_ids) != count * self.block_size:
            self.skipped_blocks += count
            return
        own = _chain(parent, event.token_ids, self.block_size)
        for engine_hash, own_hash in zip(event.block_hashes, own, strict=True):
            view.add(engine_hash, own_hash, tier)
        self._tell(worker, tier, own, True)

    def _drop(self, worker: str, view: _WorkerView, engine_hash: EngineHash,
              tier: str | None) -> None:
        own, bits = view.engine.get(engine_hash), view.tiers.get(engine_hash, 0)
        if own is None:
            return
        view.drop(engine_hash, tier)
        for name, bit in _BIT.items():
            if bits & bit and (tier is None or tier == name) and own not in view.held[name]:
                self._tell(worker, name, [own], False)
                if name == DEVICE:  # gone from the device: no longer soon cached either
                    self._routed.get(worker, _NO_ROUTED).pop(own, None)

    def _tell(self, worker: str, tier: str, own: Sequence[int], stored: bool) -> None:
        if own:
            for listener in self.listeners:
                listener(worker, tier, own, stored)
