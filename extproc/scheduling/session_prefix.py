"""Which KV blocks belong to which sessions, and where each sits (Dynamo's Session-Prefix
Indexer): a prefix tree whose branches are sessions.

Blocks are chained hashes, so a block names its whole prefix and the tree's nodes are the blocks
themselves, each linked to the block before it; a session is a branch, the path of its latest
context from the root; a sub-agent's branch forks off its parent's (it starts from the parent's
context, so their paths share the parent's blocks). Each node counts the open (live or paused)
sessions whose branch runs through it, which tells a prefix several sessions reuse (the system
prompt, a parent's context) from a session's own tail, and remembers where the block sits:
worker → tier. The router's placements keep branches current (a session's blocks went to a
worker's device) and, in precise mode, the workers' KV events where blocks really are (moved to
host memory, evicted); admission says which sessions are paused, a session's end or a long idle
finishes it.

Bounded: at most ``max_blocks`` blocks over all branches (the least recently active sessions'
branches close first); a branch is its session's slot on the session table and leaves with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..state.table import Entry, SessionTable
from .kv_events import DEVICE

SessionState = Literal["live", "paused", "finished"]


@dataclass(slots=True)
class _Node:
    open: int = 0
    """Open sessions whose branch runs through this block."""
    where: dict[str, str] = field(default_factory=dict)
    """worker → tier holding the block."""


@dataclass(slots=True)
class Branch:
    """A session's path: its slot on the session table."""

    blocks: Sequence[int]
    parent: str | None
    state: SessionState = "live"


class SessionPrefixIndex:
    def __init__(self, *, max_sessions: int = 100_000, max_blocks: int = 4_000_000,
                 table: SessionTable | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``table``: the process's session table, where each session's branch hangs (its
        assembler calls ``left`` when a session leaves it); a table of its own, of
        ``max_sessions`` sessions, when none is given."""
        if max_sessions < 1 or max_blocks < 1:
            raise ValueError("max_sessions and max_blocks must be positive")
        self._max_blocks = max_blocks
        self._nodes: dict[int, _Node] = {}
        self._count = 0
        self._held = 0
        """Blocks over all open branches."""
        if table is None:
            table = SessionTable(max_sessions=max_sessions, clock=clock)
            table.leaving(self.left)
        self._table = table

    # -- kept current -------------------------------------------------------------------------

    def placed(self, session: str, blocks: Sequence[int], worker: str, *,
               parent: str | None = None) -> None:
        """``session`` (a sub-agent of ``parent``) sent ``blocks``, its context, to ``worker``:
        its branch now ends there, and the worker's device holds them."""
        entry = self._table.touch(session)
        branch = entry.branch
        if branch is None:
            branch = entry.branch = Branch((), parent)
            self._count += 1
        elif branch.state == "finished":  # a session id used again
            branch.state, branch.blocks = "live", ()
        self._move(branch.blocks, blocks)
        branch.blocks = blocks
        for block in blocks:
            self._nodes[block].where[worker] = DEVICE
        self._bound(session)

    def located(self, worker: str, tier: str, blocks: Sequence[int], stored: bool) -> None:
        """A worker's KV events: ``blocks`` (the index's hashes) were stored in ``tier`` or
        removed from it (the precise index's listener). Blocks no session has are ignored."""
        for block in blocks:
            node = self._nodes.get(block)
            if node is None:
                continue
            if stored:
                if node.where.get(worker) != DEVICE:
                    node.where[worker] = tier
            elif node.where.get(worker) == tier:
                del node.where[worker]

    def paused(self, session: str) -> None:
        self._set(session, "paused")

    def resumed(self, session: str) -> None:
        self._set(session, "live")

    def finished(self, session: str) -> None:
        """The session ended: its branch no longer holds its blocks (its state is kept while
        the session is on the table)."""
        branch = self._branch(session)
        if branch is not None:
            self._close(branch)

    def left(self, key: str, entry: Entry) -> None:
        """The session left the table: its branch goes (a table's leaving hook)."""
        branch, entry.branch = entry.branch, None
        if branch is not None:
            self._close(branch)
            self._count -= 1

    # -- queries ------------------------------------------------------------------------------

    def state(self, session: str) -> SessionState | None:
        branch = self._branch(session)
        return None if branch is None else branch.state

    def sessions(self, state: SessionState | None = None) -> list[str]:
        """The sessions with a branch, least recently active first."""
        return [k for k, e in self._table.oldest()
                if e.branch is not None and (state is None or e.branch.state == state)]

    def lineage(self, session: str) -> list[str]:
        """The session's ancestors, its parent first."""
        chain: list[str] = []
        branch = self._branch(session)
        while branch is not None and branch.parent is not None and branch.parent not in chain:
            chain.append(branch.parent)
            branch = self._branch(branch.parent)
        return chain

    def shared(self, session: str) -> int:
        """Leading blocks of the session's context that another open session's context also
        runs through (a prefix: past the first block it alone has, nothing is shared)."""
        branch = self._branch(session)
        if branch is None:
            return 0
        mine = 0 if branch.state == "finished" else 1
        depth = 0
        for block in branch.blocks:
            node = self._nodes.get(block)
            if node is None or node.open <= mine:
                break
            depth += 1
        return depth

    def unique(self, session: str) -> Sequence[int]:
        """The session's own tail: its blocks past the shared prefix."""
        branch = self._branch(session)
        return () if branch is None else branch.blocks[self.shared(session):]

    def where(self, block: int) -> dict[str, str]:
        """worker → tier of a block some session has."""
        node = self._nodes.get(block)
        return {} if node is None else dict(node.where)

    def __len__(self) -> int:
        return self._count

    @property
    def blocks(self) -> int:
        """Blocks over all open branches."""
        return self._held

    # -- internals ----------------------------------------------------------------------------

    def _branch(self, session: str | None) -> Branch | None:
        entry = self._table.get(session)
        return None if entry is None else entry.branch

    def _set(self, session: str, state: SessionState) -> None:
        branch = self._branch(session)
        if branch is not None and branch.state != "finished":
            branch.state = state

    def _close(self, branch: Branch) -> None:
        if branch.state != "finished":
            self._move(branch.blocks, ())
            branch.state = "finished"

    def _move(self, old: Sequence[int], new: Sequence[int]) -> None:
        """A branch goes from ``old`` to ``new``: an extension counts only the new tail (equal
        chained hashes at a position mean an equal prefix)."""
        keep = len(old) if old and len(old) <= len(new) and new[len(old) - 1] == old[-1] else 0
        nodes = self._nodes
        for block in old[keep:]:
            nodes[block].open -= 1
            if not nodes[block].open:
                del nodes[block]
        for block in new[keep:]:
            nodes.setdefault(block, _Node()).open += 1
        self._held += len(new) - len(old)

    def _bound(self, keep: str) -> None:
        """Over the bound of blocks: the least recently active open branches close first
        (never the one just placed)."""
        for key, entry in self._table.oldest():
            if self._held <= self._max_blocks:
                return
            if key != keep and entry.branch is not None and entry.branch.state != "finished":
                self._close(entry.branch)
