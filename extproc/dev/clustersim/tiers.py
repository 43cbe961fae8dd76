"""A worker's KV memory tiers: the device (GPU) pool, host memory (CPU), optionally disk.

Each tier is an LRU of chained block hashes plus blocks *held* out of its LRU for a session:
on the device, prefixes pinned by ``share`` hints; in host memory, what ``demote`` moved there,
kept for its session until a prefetch takes it back or the session is released. With
``offload`` on, a block the device evicts goes to host memory instead of vanishing (vLLM's CPU
offloading connector, LMCache) and one host memory evicts goes to disk when there is a disk
tier. A hit in a lower tier is copied back to the device (the lower copy stays, as those
connectors keep it) and costs a host-to-device transfer instead of a prefill.

Transfers queue on one host-to-device link per worker, off the compute path: the engine keeps
decoding while a request waits for its blocks. Device-to-host copies are not timed: PCIe is
full duplex, and what is offloaded is at most what was computed or loaded, so stores keep up.
Every change is published as vLLM KV events (``BlockStored`` / ``BlockRemoved``) with their
``medium``, as an engine with offloading reports them (without token ids: the simulator has
none, so they are for counting per-tier traffic, not for the precise prefix index).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ...scheduling.kv_events import BlockRemoved, BlockStored, KVEvent

GPU, CPU, DISK = "GPU", "CPU", "DISK"

KVListener = Callable[[KVEvent], None]


class Tier:
    """One medium: an LRU of blocks and the blocks held for sessions, within ``capacity``."""

    def __init__(self, medium: str, capacity: int) -> None:
        self.medium = medium
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._held: dict[int, set[str]] = {}
        self._holds: dict[str, set[int]] = {}

    def __contains__(self, block: object) -> bool:
        return block in self._lru or block in self._held

    def __len__(self) -> int:
        return len(self._lru) + len(self._held)

    @property
    def held(self) -> int:
        return len(self._held)

    def is_held(self, block: int) -> bool:
        return block in self._held

    def resident(self, blocks: Sequence[int], start: int = 0, above: Tier | None = None) -> int:
        """How many of ``blocks`` from ``start`` on the tier holds in a row (and ``above``,
        the tier searched first, does not)."""
        lru, held = self._lru, self._held
        for n in range(start, len(blocks)):
            block = blocks[n]
            if (block not in lru and block not in held) or (above is not None and block in above):
                return n - start
        return len(blocks) - start

    def add(self, blocks: Iterable[int]) -> list[int]:
        """Make ``blocks`` the most recent, in order (the last one most); returns the new ones."""
        lru, held, refresh = self._lru, self._held, self._lru.move_to_end
        stored = []
        for block in blocks:
            if block in lru:
                refresh(block)
            elif block not in held:
                lru[block] = None
                stored.append(block)
        return stored

    def evict(self) -> list[int]:
        """Least recent LRU blocks past the capacity (held blocks never go this way)."""
        excess = min(len(self._lru) + len(self._held) - self.capacity, len(self._lru))
        pop = self._lru.popitem
        return [pop(last=False)[0] for _ in range(excess)]

    def hold(self, session: str, blocks: Iterable[int]) -> list[int]:
        """Hold ``blocks`` for ``session`` out of the LRU; returns those new to the tier."""
        stored = []
        holds = self._holds.setdefault(session, set())
        for block in blocks:
            if self._lru.pop(block, 0) is not None and block not in self._held:
                stored.append(block)
            self._held.setdefault(block, set()).add(session)
            holds.add(block)
        return stored

    def unhold(self, session: str) -> None:
        """``session`` no longer holds its blocks: those nobody else holds rejoin the LRU."""
        for block in self._holds.pop(session, ()):
            sessions = self._held[block]
            sessions.discard(session)
            if not sessions:
                del self._held[block]
                self._lru[block] = None

    def unhold_block(self, block: int) -> None:
        """The block was copied back to the device: its copy here is a plain LRU block again."""
        for session in self._held.pop(block, ()):
            self._holds[session].discard(block)
        self._lru[block] = None

    def discard(self, block: int) -> bool:
        """Drop an unheld block; False if it is held or absent."""
        return self._lru.pop(block, 0) is None


@dataclass(slots=True)
class Lookup:
    """Where a prompt's cached prefix was found, in blocks, and when its KV is on the device."""

    device: int = 0
    lower: dict[str, int] = field(default_factory=dict)
    """Blocks copied from (or still arriving from) CPU / DISK for this request."""
    ready_s: float = 0.0


class TieredKV:
    """The device pool and the lower tiers of one worker, with its host-to-device link."""

    def __init__(self, *, block_size: int, device_blocks: int, cpu_blocks: int = 0,
                 disk_blocks: int = 0, offload: bool = True, share_blocks: int = 0,
                 cpu_tokens_per_s: float = 400_000.0, disk_tokens_per_s: float = 50_000.0,
                 listener: KVListener | None = None) -> None:
        self.block_size = block_size
        self.total_blocks = device_blocks
        self.device = Tier(GPU, device_blocks)
        self.lower = [t for t in (Tier(CPU, cpu_blocks), Tier(DISK, disk_blocks)) if t.capacity]
        self.offload = offload
        self.share_blocks = share_blocks
        self._seconds_per_block = {CPU: block_size / cpu_tokens_per_s,
                                   DISK: block_size / disk_tokens_per_s}
        self.listener = listener
        self._arriving: dict[int, tuple[float, str]] = {}
        """Device blocks copied from below: when each lands and where it comes from."""
        self._all_landed_s = 0.0
        """When the last copy queued lands (then ``_arriving`` can be forgotten)."""
        self._link_free_s = 0.0

    @property
    def cpu(self) -> Tier | None:
        return self.lower[0] if self.lower and self.lower[0].medium == CPU else None

    def tier_of(self, block: int) -> str | None:
        if block in self.device:
            return GPU
        return next((t.medium for t in self.lower if block in t), None)

    # -- the request path ----------------------------------------------------------------

    def lookup(self, blocks: Sequence[int], lookable: int, now: float) -> Lookup:
        """The cached prefix of the first ``lookable`` blocks by tier, loading what lower tiers
        hold; then every block is cached on the device (the request computes the rest)."""
        found = Lookup(ready_s=now)
        loads: dict[str, list[int]] = {}
        if now >= self._all_landed_s:
            self._arriving.clear()
        wanted, at = blocks[:lookable], 0
        while at < len(wanted):
            run = self.device.resident(wanted, at)
            if run:
                self._count_resident(found, wanted[at:at + run], now)
            else:
                tier = next((t for t in self.lower if wanted[at] in t), None)
                if tier is None:
                    break
                run = tier.resident(wanted, at, self.device)
                loads.setdefault(tier.medium, []).extend(wanted[at:at + run])
            at += run
        if loads:
            found.ready_s = max(found.ready_s, self._load(loads, now))
            for medium, loaded in loads.items():
                found.lower[medium] = found.lower.get(medium, 0) + len(loaded)
        self.touch(blocks)
        return found

    def _count_resident(self, found: Lookup, blocks: Sequence[int], now: float) -> None:
        """Device blocks still arriving from below count for their tier, and delay the
        request until they land."""
        if not self._arriving:
            found.device += len(blocks)
            return
        for block in blocks:
            arriving = self._arriving.get(block)
            if arriving is None or arriving[0] <= now:
                found.device += 1
            else:
                found.ready_s = max(found.ready_s, arriving[0])
                found.lower[arriving[1]] = found.lower.get(arriving[1], 0) + 1

    def touch(self, blocks: Sequence[int]) -> None:
        """Cache a prompt's blocks on the device, its head the most recent (tails go first)."""
        stored = self.device.add(reversed(blocks))
        self._emit_stored(GPU, stored)
        self._settle()

    def reserve(self, blocks: int) -> None:
        """Leave ``blocks`` of the pool to running requests: evict the cache to fit."""
        self.device.capacity = max(self.total_blocks - blocks, 1)
        self._settle()

    # -- hints -----------------------------------------------------------------------------

    def share(self, session: str, blocks: Sequence[int]) -> bool:
        """Pin the device-resident ``blocks`` (a prefix) for ``session`` within the share
        budget; ignored if it would exceed it."""
        resident = [b for b in blocks if b in self.device]
        new = sum(not self.device.is_held(b) for b in resident)
        if not resident or self.device.held + new > self.share_blocks:
            return False
        self.device.hold(session, resident)
        return True

    def demote(self, session: str, blocks: Sequence[int]) -> bool:
        """Move ``blocks`` (the session's own, unpinned) from the device to host memory and hold
        them there for it; ignored when host memory has no room beyond what it already holds
        for other sessions (the blocks stay on the device and LRU evicts them in time)."""
        cpu = self.cpu
        movable = [b for b in blocks if (b in self.device and not self.device.is_held(b))
                   or (cpu is not None and b in cpu and not cpu.is_held(b))]
        if cpu is None or not movable or cpu.held + len(movable) > cpu.capacity:
            return False
        removed = [b for b in movable if self.device.discard(b)]
        self._forget_arrivals(removed)
        self._emit_removed(GPU, removed)
        self._emit_stored(CPU, cpu.hold(session, movable))
        self._overflow(0)
        return True

    def prefetch(self, session: str, blocks: Sequence[int], now: float) -> bool:
        """Copy the prefix of ``blocks`` that lower tiers hold back to the device, ahead of the
        session's next turn; ignored if the device already has it all (or nothing is below)."""
        loads: dict[str, list[int]] = {}
        held = 0
        for block in blocks:
            if block not in self.device:
                tier = next((t for t in self.lower if block in t), None)
                if tier is None:
                    break
                loads.setdefault(tier.medium, []).append(block)
            held += 1
        if not loads:
            return False
        self._load(loads, now)
        self.touch(blocks[:held])
        return True

    def release(self, session: str, unique: Sequence[int]) -> None:
        """The session ended: drop its pins and holds, and free its ``unique`` blocks in every
        tier now instead of letting them age out (shared blocks are not among them)."""
        self.device.unhold(session)
        for tier in self.lower:
            tier.unhold(session)
        for tier in (self.device, *self.lower):
            self._emit_removed(tier.medium, [b for b in unique if tier.discard(b)])
        self._forget_arrivals(unique)

    # -- internals ---------------------------------------------------------------------------

    def _load(self, loads: dict[str, list[int]], now: float) -> float:
        """Queue the copies on the link; returns when the last block lands (until then the
        blocks count as arriving). Loaded blocks held in host memory for a session are back on
        the device: the hold ends."""
        landed = max(now, self._link_free_s) + sum(self._seconds_per_block[m] * len(b)
                                                   for m, b in loads.items())
        self._link_free_s = self._all_landed_s = landed
        cpu = self.cpu
        for medium, loaded in loads.items():
            for block in loaded:
                self._arriving[block] = (landed, medium)
                if medium == CPU and cpu is not None and cpu.is_held(block):
                    cpu.unhold_block(block)
        return landed

    def _settle(self) -> None:
        evicted = self.device.evict()
        if not evicted:
            return
        self._forget_arrivals(evicted)
        self._emit_removed(GPU, evicted)
        if self.offload:
            self._store(0, evicted)

    def _forget_arrivals(self, blocks: Iterable[int]) -> None:
        if self._arriving:
            for block in blocks:
                self._arriving.pop(block, None)

    def _store(self, level: int, blocks: list[int]) -> None:
        """Offload ``blocks`` evicted from the tier above into ``lower[level]``."""
        if blocks and level < len(self.lower):
            tier = self.lower[level]
            self._emit_stored(tier.medium, tier.add(blocks))
            self._overflow(level)

    def _overflow(self, level: int) -> None:
        """``lower[level]`` evicts past its capacity into the next tier down (if any)."""
        evicted = self.lower[level].evict()
        self._emit_removed(self.lower[level].medium, evicted)
        self._store(level + 1, evicted)

    def _emit_stored(self, medium: str, blocks: list[int]) -> None:
        if blocks and self.listener is not None:
            self.listener(BlockStored(tuple(blocks), None, (), self.block_size, None, medium))

    def _emit_removed(self, medium: str, blocks: list[int]) -> None:
        if blocks and self.listener is not None:
            self.listener(BlockRemoved(tuple(blocks), medium))
