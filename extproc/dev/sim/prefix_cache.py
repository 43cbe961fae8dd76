"""A block-level prefix cache with vLLM's shape, so routing for cache affinity can be measured.

Tokens are deterministic pieces of text (see ``tokenize``), or real token ids when the simulator
has a tokenizer (needed to publish KV events), grouped into blocks of ``block_size``. A block is
identified by a chained hash, ``h[i] = xxh3_64(block i, seed=h[i-1])``, so equal block contents at
different positions or after different prefixes never collide; a hit on block ``i`` therefore
implies the whole prefix up to ``i`` matches. Only full blocks are cached, as in vLLM. Eviction is
LRU over blocks; a request touches its blocks tail-first so that the head of a shared prefix stays
the most recently used and the tails are evicted first (vLLM frees a request's blocks in reverse
order for the same reason). Blocks of running requests are not pinned: the simulator tracks KV
usage of running requests separately (see ``server``).

A host-memory (CPU) tier of ``num_cpu_blocks`` takes what the router's KV hints move there:
``demote`` moves blocks off the device, ``prefetch`` brings them back, ``release`` frees them in
both tiers, ``share`` pins device blocks against eviction (within ``share_blocks``). A lookup
that continues its device prefix in host memory copies those blocks back (the caller charges
the transfer) instead of computing them. Every move is told to the listener as vLLM KV events
with their ``medium``, in the order an offloading connector reports them (stored below before
removed above, so a subscriber always knows the block).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Protocol

from ...apis import chain_hashes
from ...scheduling.kv_events import CPU, GPU, BlockRemoved, BlockStored, KVEvent

_Block = tuple[int | None, tuple[Any, ...]]
"""A cached block: its parent's hash and its tokens (what a ``BlockStored`` carries)."""

TOKEN_CHARS = 4
"""A token is at most this many characters, matching the router's chars/4 context estimate."""

_BLOCK_SEPARATOR = "\x1f"


def tokenize(text: str) -> list[str]:
    """Split on whitespace, then cut each word into pieces of at most ``TOKEN_CHARS`` characters.

    Deterministic and cheap; a word of up to four characters is exactly one token, which the
    generated text relies on to make its output token count exact.
    """
    return [
        word[start : start + TOKEN_CHARS]
        for word in text.split()
        for start in range(0, len(word), TOKEN_CHARS)
    ]


def block_hashes(tokens: Sequence[str] | Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (text pieces, or token ids when a real
    tokenizer is configured); a trailing partial block has none."""
    stop = len(tokens) - block_size + 1
    return chain_hashes(
        _BLOCK_SEPARATOR.join(map(str, tokens[start : start + block_size])).encode()
        for start in range(0, stop, block_size)
    )


class CacheListener(Protocol):
    """Told of every change, so it can be published as KV events (see ``kv_publisher``)."""

    def changed(
        self, tokens: Any, hashes: Sequence[int], stored: Collection[int], evicted: Sequence[int]
    ) -> None: ...

    def cleared(self) -> None: ...

    def publish(self, events: Sequence[KVEvent]) -> None: ...


class PrefixCache:
    """Fixed-capacity LRU set of block hashes with a longest-cached-prefix lookup."""

    def __init__(
        self,
        *,
        block_size: int = 16,
        num_gpu_blocks: int = 2048,
        num_cpu_blocks: int = 0,
        share_blocks: int = 0,
        listener: CacheListener | None = None,
    ) -> None:
        if block_size < 1 or num_gpu_blocks < 1 or num_cpu_blocks < 0 or share_blocks < 0:
            raise ValueError("block_size and num_gpu_blocks must be positive")
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.share_blocks = share_blocks
        self.listener = listener
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._cpu: OrderedDict[int, _Block] = OrderedDict()
        self._pinned: set[int] = set()
        self.loaded = 0
        """Blocks the last lookup copied back from host memory."""

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    @property
    def cpu_blocks(self) -> int:
        return len(self._cpu)

    @property
    def usage_fraction(self) -> float:
        """Share of the capacity holding cached blocks, 0..1."""
        return len(self._blocks) / self.num_gpu_blocks

    def lookup_and_insert(self, tokens: Sequence[str] | Sequence[int]) -> int:
        """Cached prefix length in tokens, then cache (or refresh) every full block of ``tokens``.

        Like vLLM, at least one prompt token is always computed, so a fully cached prompt reports
        the cached blocks of all but its last token.
        """
        hashes = block_hashes(tokens, self.block_size)
        lookable = max(len(tokens) - 1, 0) // self.block_size
        hits = 0
        for block_hash in hashes[:lookable]:
            if block_hash not in self._blocks:
                break
            hits += 1
        loaded = hits
        while loaded < lookable and hashes[loaded] in self._cpu:
            loaded += 1
        self.loaded = loaded - hits
        stored, evicted = self._touch(hashes, tokens)
        if self.listener is not None and (stored or evicted):
            self.listener.changed(tokens, hashes, stored, evicted)
        return loaded * self.block_size

    def clear(self) -> None:
        self._blocks.clear()
        self._cpu.clear()
        self._pinned.clear()
        if self.listener is not None:
            self.listener.cleared()

    # -- KV hints ---------------------------------------------------------------------------

    def demote(self, hashes: Iterable[int]) -> int:
        """Move these device blocks (unpinned) to host memory; returns how many moved (none
        without a host tier). Host memory evicts its least recent blocks to make room."""
        moving = [h for h in hashes if h in self._blocks and h not in self._pinned]
        moving = moving[: self.num_cpu_blocks]
        if not moving:
            return 0
        for block_hash in moving:
            self._cpu[block_hash] = self._blocks.pop(block_hash)
        dropped = self._overflow()
        self._publish([BlockStored(tuple(moving), None, (), self.block_size, None, CPU),
                       BlockRemoved(tuple(moving), GPU), *dropped])
        return len(moving)

    def prefetch(self, hashes: Sequence[int]) -> int:
        """Bring back to the device the leading blocks of ``hashes`` that host memory holds
        (a context is only useful from its start); returns how many came back."""
        back: list[int] = []
        for block_hash in hashes:
            if block_hash in self._blocks:
                continue
            if block_hash not in self._cpu:
                break
            back.append(block_hash)
        if not back:
            return 0
        events: list[KVEvent] = []
        for block_hash in back:
            parent, tokens = self._blocks[block_hash] = self._cpu.pop(block_hash)
            events.append(BlockStored((block_hash,), parent, tokens, self.block_size, None, GPU))
        events.append(BlockRemoved(tuple(back), CPU))
        events += self._evict()
        self._publish(events)
        return len(back)

    def release(self, hashes: Iterable[int]) -> int:
        """Free these blocks in both tiers now (the session that had them ended)."""
        wanted = list(hashes)
        self._pinned.difference_update(wanted)
        gpu = [h for h in wanted if self._blocks.pop(h, None) is not None]
        cpu = [h for h in wanted if self._cpu.pop(h, None) is not None]
        self._publish([*([BlockRemoved(tuple(gpu), GPU)] if gpu else ()),
                       *([BlockRemoved(tuple(cpu), CPU)] if cpu else ())])
        return len(gpu) + len(cpu)

    def share(self, hashes: Iterable[int]) -> int:
        """Pin these device blocks against eviction while the budget lasts."""
        pinned = 0
        for block_hash in hashes:
            if block_hash in self._blocks and block_hash not in self._pinned:
                if len(self._pinned) >= self.share_blocks:
                    break
                self._pinned.add(block_hash)
                pinned += 1
        return pinned

    # -- internals --------------------------------------------------------------------------

    def _touch(self, hashes: Sequence[int], tokens: Sequence[Any]) -> tuple[set[int], list[int]]:
        """Blocks newly cached, then blocks evicted to make room (possibly some new ones)."""
        stored: set[int] = set()
        size = self.block_size
        for index in range(len(hashes) - 1, -1, -1):
            block_hash = hashes[index]
            if block_hash in self._blocks:
                self._blocks.move_to_end(block_hash)
            else:
                parent = hashes[index - 1] if index else None
                self._blocks[block_hash] = (parent, tuple(tokens[index * size:(index + 1) * size]))
                stored.add(block_hash)
        evicted: list[int] = []
        while len(self._blocks) > self.num_gpu_blocks:
            evicted.append(self._pop_lru())
        return stored, evicted

    def _pop_lru(self) -> int:
        """The least recent unpinned block (pinned ones go back to the recent end)."""
        while True:
            block_hash, block = self._blocks.popitem(last=False)
            if block_hash not in self._pinned or len(self._pinned) >= len(self._blocks) + 1:
                self._pinned.discard(block_hash)
                return block_hash
            self._blocks[block_hash] = block

    def _evict(self) -> list[KVEvent]:
        evicted = [self._pop_lru() for _ in range(len(self._blocks) - self.num_gpu_blocks)]
        return [BlockRemoved(tuple(evicted), GPU)] if evicted else []

    def _overflow(self) -> list[KVEvent]:
        dropped = [self._cpu.popitem(last=False)[0]
                   for _ in range(len(self._cpu) - self.num_cpu_blocks)]
        return [BlockRemoved(tuple(dropped), CPU)] if dropped else []

    def _publish(self, events: Sequence[KVEvent]) -> None:
        if self.listener is not None and events:
            self.listener.publish(events)
