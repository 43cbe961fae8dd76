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
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Sequence
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


@dataclass(slots=True)
class _WorkerView:
    engine: dict[EngineHash, int] = field(default_factory=dict)
    """Engine hash → own hash, oldest first (for the memory bound)."""
    held: dict[int, int] = field(default_factory=dict)
    """Own hash → how many engine blocks carry it (vLLM may mix a cache salt into its hash,
    so equal tokens can come as distinct engine blocks)."""
    last_seq: int | None = None
    stale: bool = False

    def clear(self) -> None:
        self.engine.clear()
        self.held.clear()

    def add(self, engine_hash: EngineHash, own: int) -> None:
        self.drop(engine_hash)
        self.engine[engine_hash] = own
        self.held[own] = self.held.get(own, 0) + 1

    def drop(self, engine_hash: EngineHash) -> None:
        own = self.engine.pop(engine_hash, None)
        if own is None:
            return
        if self.held[own] > 1:
            self.held[own] -= 1
        else:
            del self.held[own]


class PreciseKVIndex:
    """``PrefixIndex`` fed by the servers' KV events: a block counts only while its worker
    reports it stored on GPU.

    Request blocks must be hashed with ``hash_tokens`` (same block size and model seed). Blocks
    of another block size, of a LoRA adapter, or whose parent is unknown (missed events) are
    skipped and counted in ``skipped_blocks``: they cannot match a request hashed here, and
    under-reporting a match is safer than inventing one.
    """

    def __init__(
        self,
        *,
        block_size: int = 16,
        model: str | None = None,
        max_blocks_per_worker: int = 65536,
    ) -> None:
        if block_size < 1 or max_blocks_per_worker < 1:
            raise ValueError("block_size and max_blocks_per_worker must be positive")
        self.block_size = block_size
        self.max_blocks_per_worker = max_blocks_per_worker
        self._root = _root(model)
        self._views: dict[str, _WorkerView] = {}
        self.gaps = 0
        """Sequence gaps seen (each reset a worker's view and marked it stale)."""
        self.skipped_blocks = 0

    def hash_tokens(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """The request-side block hashes that ``matched_blocks`` compares."""
        return tuple(_chain(self._root, token_ids, self.block_size))

    def matched_blocks(self, worker: str, blocks: Sequence[int]) -> int:
        view = self._views.get(worker)
        if view is None:
            return 0
        matched = 0
        for block in blocks:
            if block not in view.held:
                break
            matched += 1
        return matched

    def routed(self, worker: str, blocks: Sequence[int], extends: int = 0) -> None:
        """Routing teaches nothing here: only the worker's events do."""

    def block_count(self, worker: str) -> int:
        view = self._views.get(worker)
        return 0 if view is None else len(view.engine)

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
        self._apply_events(view, batch.events)
        while len(view.engine) > self.max_blocks_per_worker:
            view.drop(next(iter(view.engine)))

    def _apply_events(self, view: _WorkerView, events: Iterable[KVEvent]) -> None:
        for event in events:
            match event:
                case BlockStored() if event.medium in (None, GPU):
                    self._store(view, event)
                case BlockRemoved() if event.medium in (None, GPU):
                    for engine_hash in event.block_hashes:
                        view.drop(engine_hash)
                case AllBlocksCleared():
                    view.clear()
                    view.stale = False

    def _store(self, view: _WorkerView, event: BlockStored) -> None:
        if event.parent_block_hash is None:
            parent: int | None = self._root
        else:
            parent = view.engine.get(event.parent_block_hash)
        count = len(event.block_hashes)
        if (
            parent is None
            or event.lora_id is not None
            or event.block_size != self.block_size
            or len(event.token_ids) != count * self.block_size
        ):
            self.skipped_blocks += count
            return
        own = _chain(parent, event.token_ids, self.block_size)
        for engine_hash, own_hash in zip(event.block_hashes, own, strict=True):
            view.add(engine_hash, own_hash)
