"""The shared KV pool: blocks kept in a store every worker can load from (Mooncake Store), from
the store's own KV events, so placement can credit a worker for what it would load rather than
prefill (Dynamo's shared-pool indexer).

Wire format, as ``mooncake_master`` publishes it (``KvEventPublisher``, RFC #1527 envelope): ZMQ
multipart ``[topic, sequence (8-byte big-endian, from 1), msgpack payload]``, the payload
``[timestamp_ms, events, dp_rank]`` and each event a map: ``event_type`` ``"stored"`` /
``"removed"`` (legacy alias ``type``: ``BlockStored`` / ``BlockRemoved``), ``seq_hashes`` (the
object key read as a rolling block hash, decimal or ``0x`` hex), ``object_key``, ``medium``,
``backend_id``, ``tenant_id``, ``group_id`` and, for ``stored``, ``base_block_idx``,
``parent_hash`` and ``token_ids`` (nil from the master, which knows keys, not tokens). The
earlier array form of Mooncake's subscriber guide is read too: ``["BlockStoreEvent", key,
replicas, model, block_size, block_hash, parent_block_hash, token_ids]``, ``["BlockUpdateEvent",
key, replicas]`` (no replica left: removed) and ``["RemoveAllEvent"]``.

A pool block is named by the engine's block hash; the precise index knows which of its own
hashes that is from the workers' events (an engine writes a block to the store after computing
it on its device), and a stored event with token ids is hashed directly. A block counts only
once every physical object of it is in the pool (``objects_per_block``: one per tensor-parallel
rank and K/V, when the engine stores them apart).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from .kv_events import KVEventDecodeError, PreciseKVIndex

log = logging.getLogger(__name__)

StoreKind = Literal["stored", "removed", "cleared"]


@dataclass(frozen=True, slots=True)
class StoreEvent:
    kind: StoreKind
    seq_hashes: tuple[int, ...] = ()
    object_key: str | None = None
    medium: str | None = None
    token_ids: tuple[int, ...] | None = None
    parent_hash: int | None = None


_KINDS: dict[str, StoreKind] = {
    "stored": "stored", "BlockStored": "stored", "BlockStoreEvent": "stored",
    "removed": "removed", "BlockRemoved": "removed",
    "cleared": "cleared", "AllBlocksCleared": "cleared", "RemoveAllEvent": "cleared",
}


def decode_store_frames(frames: Sequence[bytes]) -> tuple[int, list[StoreEvent]]:
    """``(sequence, events)`` of one message of the store's publisher."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise KVEventDecodeError("expected [topic, 8-byte sequence, payload]")
    try:
        doc = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    except ValueError as exc:
        raise KVEventDecodeError(f"not msgpack: {exc}") from None
    if not isinstance(doc, list) or len(doc) < 2 or not isinstance(doc[1], list):
        raise KVEventDecodeError("payload is not [timestamp, events, dp_rank?]")
    events = (_event(raw) for raw in doc[1])
    return int.from_bytes(frames[1], "big"), [e for e in events if e is not None]


def _event(raw: Any) -> StoreEvent | None:
    if isinstance(raw, dict):
        kind = _KINDS.get(raw.get("event_type") or raw.get("type") or "")
        if kind is None:
            return None
        hashes = raw.get("seq_hashes", raw.get("block_hashes")) or []
        key = raw.get("object_key")
        if not hashes and isinstance(key, str):
            hashes = [h for h in (parse_seq_hash(key),) if h is not None]
        tokens = raw.get("token_ids")
        return StoreEvent(kind, _hashes(hashes), _text(key), _text(raw.get("medium")),
                          None if not tokens else _tokens(tokens),
                          _parent(raw.get("parent_hash", raw.get("parent_block_hash"))))
    if not isinstance(raw, list) or not raw or not isinstance(raw[0], str):
        raise KVEventDecodeError(f"event is neither a map nor a tagged array: {raw!r:.80}")
    tag = raw[0]
    if tag == "RemoveAllEvent":
        return StoreEvent("cleared")
    if tag not in ("BlockStoreEvent", "BlockUpdateEvent") or len(raw) < 3:
        return None
    key = _text(raw[1])
    found = parse_seq_hash(key or "")
    hashes = () if found is None else (found,)
    if tag == "BlockUpdateEvent":
        return StoreEvent("stored" if raw[2] else "removed", hashes, key)
    block_hash = parse_seq_hash(str(raw[5])) if len(raw) > 5 and raw[5] else None
    tokens = raw[7] if len(raw) > 7 and raw[7] else None
    return StoreEvent("stored", hashes if block_hash is None else (block_hash,), key, None,
                      None if tokens is None else _tokens(tokens),
                      parse_seq_hash(str(raw[6])) if len(raw) > 6 and raw[6] else None)


def parse_seq_hash(key: str) -> int | None:
    """An object key as a rolling hash: decimal or ``0x`` hex (Mooncake's rule)."""
    try:
        return int(key, 16) if key[:2].lower() == "0x" else int(key, 10)
    except ValueError:
        return None


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(h) is int for h in value):
        raise KVEventDecodeError(f"seq_hashes is not a list of integers: {value!r:.80}")
    return tuple(h & (1 << 64) - 1 for h in value)  # legacy aliases are signed


def _tokens(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(t) is int and t >= 0 for t in value):
        raise KVEventDecodeError("token_ids is not a list of token ids")
    return tuple(value)


def _parent(value: Any) -> int | None:
    if value is None or type(value) is int:
        return value
    if isinstance(value, str):
        return parse_seq_hash(value)
    raise KVEventDecodeError(f"parent hash is invalid: {value!r:.80}")


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise KVEventDecodeError(f"expected a string: {value!r:.80}")


class SharedKVPool:
    """The pool's blocks in the precise index's own hashes, attached to ``index`` (which
    credits them beyond each worker's device prefix). Bounded: at most ``max_blocks`` blocks,
    the oldest forgotten first; events for blocks no worker has reported yet wait (at most
    as many again) until one does."""

    def __init__(self, index: PreciseKVIndex, *, objects_per_block: int = 1,
                 max_blocks: int = 1_000_000) -> None:
        if objects_per_block < 1 or max_blocks < 1:
            raise ValueError("objects_per_block and max_blocks must be positive")
        self.index = index
        self.objects_per_block = objects_per_block
        self.max_blocks = max_blocks
        self._objects: OrderedDict[int, set[str]] = OrderedDict()
        """Engine hash → the block's objects in the pool, oldest first."""
        self._own: dict[int, int] = {}
        """Engine hash → own hash, for blocks resolved."""
        self._pending: set[int] = set()
        """Engine hashes no worker had reported when the pool stored them."""
        self._counted: set[int] = set()
        self._hits: dict[int, int] = {}
        """Own hash → engine blocks complete in the pool: what the index reads."""
        self.last_seq: int | None = None
        self.resets = 0
        self.skipped = 0
        index.shared = self._hits

    def __len__(self) -> int:
        return len(self._hits)

    def clear(self) -> None:
        self._objects.clear()
        self._own.clear()
        self._pending.clear()
        self._counted.clear()
        self._hits.clear()

    def apply(self, events: Sequence[StoreEvent], seq: int | None = None) -> None:
        """Apply one published batch; a lost batch (sequence gap) or a restarted publisher
        (sequence going back) clears the pool: the true state is unknown, and crediting a
        block that is gone costs a prefill where none was planned."""
        if seq is not None:
            if self.last_seq is not None and seq != self.last_seq + 1:
                log.warning("shared pool events: sequence %d after %d; pool cleared",
                            seq, self.last_seq)
                self.resets += 1
                self.clear()
            self.last_seq = seq
        for event in events:
            if event.kind == "cleared":
                self.clear()
            elif not event.seq_hashes:
                self.skipped += 1
            elif event.kind == "stored":
                self._stored(event)
            else:
                for engine_hash in event.seq_hashes:
                    self._removed(engine_hash, event.object_key)
        for engine_hash in list(self._pending):
            own = self.index.own_hash(engine_hash)
            if own is not None:
                self._pending.discard(engine_hash)
                self._own[engine_hash] = own
                self._refresh(engine_hash)
        while len(self._objects) > self.max_blocks:
            self._forget(next(iter(self._objects)))

    def _stored(self, event: StoreEvent) -> None:
        own = self._hash_tokens(event)
        for engine_hash, own_hash in zip(event.seq_hashes, own, strict=True):
            self._objects.setdefault(engine_hash, set()).add(event.object_key or str(engine_hash))
            if engine_hash not in self._own:
                own_hash = own_hash if own_hash is not None else self.index.own_hash(engine_hash)
                if own_hash is None:
                    self._pending.add(engine_hash)
                    continue
                self._own[engine_hash] = own_hash
            self._refresh(engine_hash)

    def _hash_tokens(self, event: StoreEvent) -> list[int | None]:
        """Own hashes of a stored event that carries its tokens (chained from its parent)."""
        index, size, count = self.index, self.index.block_size, len(event.seq_hashes)
        if event.token_ids is None or len(event.token_ids) != size * count:
            return [None] * count
        if event.parent_hash is None:
            return list(index.hash_tokens(event.token_ids))
        parent = self._own.get(event.parent_hash) or index.own_hash(event.parent_hash)
        if parent is None:
            return [None] * count
        return list(index.extend_hash(parent, event.token_ids))

    def _removed(self, engine_hash: int, key: str | None) -> None:
        objects = self._objects.get(engine_hash)
        if objects is None:
            return
        objects.discard(key or str(engine_hash))
        if objects:
            self._refresh(engine_hash)
        else:
            self._forget(engine_hash)

    def _forget(self, engine_hash: int) -> None:
        self._objects.pop(engine_hash, None)
        self._refresh(engine_hash)
        self._own.pop(engine_hash, None)
        self._pending.discard(engine_hash)

    def _refresh(self, engine_hash: int) -> None:
        """Count the block among the hits exactly while it is resolved and complete."""
        own = self._own.get(engine_hash)
        complete = own is not None and len(
            self._objects.get(engine_hash, ())) >= self.objects_per_block
        if complete and engine_hash not in self._counted:
            assert own is not None
            self._counted.add(engine_hash)
            self._hits[own] = self._hits.get(own, 0) + 1
        elif not complete and engine_hash in self._counted:
            assert own is not None
            self._counted.discard(engine_hash)
            if self._hits[own] > 1:
                self._hits[own] -= 1
            else:
                del self._hits[own]
