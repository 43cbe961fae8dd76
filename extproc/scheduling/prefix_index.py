"""The approximate prefix index: what each worker probably caches, learnt from where the router
sent which prompt blocks (the Gateway API Inference Extension's approximate mode).

Each worker holds *chains*: the chained block hashes of a prompt routed there, least recently
routed first, sized like its KV cache in distinct blocks; a block is held while any chain holds
it (sessions sharing a system prompt share its blocks). A chain is named by its last hash, and
a chained hash names its whole prefix, so a session's next prompt — its previous one plus what
is new — replaces that chain at the cost of the new blocks only (``extends``: how many leading
blocks the caller knows are the previous prompt's). Evicting whole chains, least recent first,
keeps each worker's set closed under prefixes (block ``i`` held ⇒ blocks ``0..i-1`` held), so
``matched_blocks`` binary-searches the longest held prefix in O(log n).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

from ..apis import CHARS_PER_TOKEN
from ..config import PrefixIndexConfig
from .types import Worker

Chain = bytes | tuple[int, ...]


def _packed(blocks: Sequence[int]) -> Chain:
    """``blocks`` as a chain is kept: packed in bytes, which the garbage collector does not
    track (an array or a list is one more object for every full collection to scan); a tuple
    (untracked once collected) for hashes that are not unsigned 64-bit."""
    if isinstance(blocks, array) and blocks.typecode == "Q":
        return blocks.tobytes()
    try:
        return array("Q", blocks).tobytes()
    except OverflowError:
        return tuple(blocks)


def _unpacked(chain: Chain) -> Sequence[int]:
    return memoryview(chain).cast("Q") if isinstance(chain, bytes) else chain


class _Chains:
    """One worker's view: chains by their last hash (least recent first), and per block how
    many chains hold it."""

    __slots__ = ("chains", "refs")

    def __init__(self) -> None:
        self.chains: OrderedDict[int, Chain] = OrderedDict()
        """Chains by their last hash, each packed (``_packed``)."""
        self.refs: dict[int, int] = {}

    def add(self, blocks: Sequence[int]) -> None:
        refs = self.refs
        for block in blocks:
            refs[block] = refs.get(block, 0) + 1

    def drop(self, blocks: Sequence[int]) -> None:
        refs = self.refs
        for block in blocks:
            left = refs[block] - 1
            if left:
                refs[block] = left
            else:
                del refs[block]


class ApproximatePrefixIndex:
    """Per-worker bounded LRU of prompt chains (``PrefixIndex`` protocol)."""

    def __init__(self, *, chars_per_block: int = 64, default_capacity_blocks: int = 65536) -> None:
        if chars_per_block < 1 or default_capacity_blocks < 1:
            raise ValueError("chars_per_block and default_capacity_blocks must be positive")
        self.chars_per_block = chars_per_block
        self.default_capacity_blocks = default_capacity_blocks
        self._workers: dict[str, _Chains] = {}
        self._capacity: dict[str, int] = {}

    @classmethod
    def from_config(cls, config: PrefixIndexConfig) -> ApproximatePrefixIndex:
        return cls(
            chars_per_block=config.chars_per_block,
            default_capacity_blocks=config.default_capacity_blocks,
        )

    def capacity(self, worker: str) -> int:
        return self._capacity.get(worker, self.default_capacity_blocks)

    def __len__(self) -> int:
        """Blocks recorded, over every worker (each worker's distinct ones)."""
        return sum(len(view.refs) for view in self._workers.values())

    def held(self, worker: str) -> int:
        """Distinct blocks currently recorded for ``worker``."""
        view = self._workers.get(worker)
        return 0 if view is None else len(view.refs)

    def holds(self, worker: str, block: int) -> bool:
        view = self._workers.get(worker)
        return view is not None and block in view.refs

    def resize(self, worker: Worker, *, host: bool = False) -> None:
        """Size ``worker``'s set like its reported KV cache (tokens * 4 chars / block chars),
        with ``host`` its host-memory tier too, or the default while it has reported none;
        shrinking evicts the least recent blocks."""
        tokens = worker.capacity_tokens
        if host and tokens is not None:
            tokens += (worker.cpu_blocks or 0) * worker.block_size
        blocks = (
            self.default_capacity_blocks
            if tokens is None
            else max(1, tokens * CHARS_PER_TOKEN // self.chars_per_block)
        )
        if self._capacity.get(worker.address) != blocks:
            self._capacity[worker.address] = blocks
            self._evict(worker.address)

    def forget(self, worker: str) -> None:
        """``worker`` left its pool: drop what it held."""
        self._workers.pop(worker, None)
        self._capacity.pop(worker, None)

    def matched_blocks(self, worker: str, blocks: Sequence[int]) -> int:
        """Length of the longest prefix of ``blocks`` (a chain, as ``prompt_blocks`` makes)
        that ``worker`` holds."""
        view = self._workers.get(worker)
        if view is None or not view.refs:
            return 0
        held = view.refs
        low, high = 0, len(blocks)
        while low < high:
            middle = (low + high + 1) // 2
            if blocks[middle - 1] in held:
                low = middle
            else:
                high = middle - 1
        return low

    def routed(self, worker: str, blocks: Sequence[int], extends: int = 0) -> None:
        """``blocks`` were sent to ``worker``: the most recent chain now. When the first
        ``extends`` of them are a chain ``worker`` holds (the session's previous prompt), that
        chain grows into this one: only the new blocks are counted."""
        if not blocks:
            return
        capacity = self.capacity(worker)
        if len(blocks) > capacity:
            # A prompt longer than the worker's cache leaves only its head there: count only
            # that, so a long session's next turn (the same head) costs nothing, not the whole
            # prompt added and evicted again.
            blocks, extends = blocks[:capacity], min(extends, capacity)
        view = self._workers.get(worker)
        if view is None:
            view = self._workers[worker] = _Chains()
        tip = blocks[-1]
        if tip in view.chains:
            view.chains.move_to_end(tip)
            return
        previous = blocks[extends - 1] if 0 < extends <= len(blocks) else None
        if previous is not None and previous in view.chains:
            del view.chains[previous]  # its blocks are this chain's first ``extends``
            view.add(blocks[extends:])
        else:
            view.add(blocks)
        view.chains[tip] = _packed(blocks)
        self._evict(worker)

    def _evict(self, worker: str) -> None:
        """Least recent chains out until the distinct blocks fit; a lone chain longer than the
        capacity keeps its head (an engine's cache holds the front of a prompt it cannot hold
        whole: the tail is what it evicts first)."""
        view = self._workers.get(worker)
        if view is None:
            return
        capacity = self.capacity(worker)
        while len(view.refs) > capacity and len(view.chains) > 1:
            _, oldest = view.chains.popitem(last=False)
            view.drop(_unpacked(oldest))
        if len(view.refs) > capacity:
            _, packed = view.chains.popitem()
            chain = _unpacked(packed)
            view.drop(chain[capacity:])
            view.chains[chain[capacity - 1]] = _packed(chain[:capacity])
