"""Redis Cluster / Valkey Cluster for the request path: the lean client, aware of slots.

A cluster splits the keys into 16384 slots, each served by one primary, and a command (a Lua
script too) may only touch keys of one slot. ``ClusterClient`` keeps the slot map (``CLUSTER
SLOTS``) and one pipelined ``RespClient`` per primary. ``execute`` sends each command to the
primary of its key's slot — one write per primary, every primary at once — and follows the
cluster's redirections: ``MOVED`` (the slot has a new owner: the map says so at once and is read
again whole off the caller's path), ``ASK`` (the slot is migrating: this command alone goes to
the importing node, after ``ASKING``) and ``TRYAGAIN`` (a multi-key command caught mid-migration).
A primary that cannot be reached fails the call (the state layer serves from local state) and
the map is read again, so a replica promoted in its place is found; ``ping`` reads the map and
pings every primary, so the layer's recovery marks the store up only when all of them answer.

URL: ``redis+cluster://[user:password@]host:port[,host:port…]`` (``rediss+cluster://`` for
TLS): the seed nodes the map is read from when no primary it knows answers.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from .resp import ASKING, Command, RespClient, RespError, abandon

log = logging.getLogger(__name__)

SLOTS = 16384
MAX_REDIRECTS = 5
"""Redirections followed per command before its last error reply is returned."""
TRYAGAIN_SECONDS = 0.005
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

Node = tuple[str, int]
"""(host, port) of a primary."""


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0] in CLUSTER_SCHEMES


def connect(url: str) -> RespClient | ClusterClient:
    """The lean client of the store at ``url``: a cluster's (``redis+cluster://``) or one
    server's. Both ``execute`` ``(key, command)`` pairs in one round trip, ``ping`` and
    ``close``."""
    return ClusterClient(url) if is_cluster_url(url) else RespClient(url)


def key_slot(key: str | bytes) -> int:
    """The slot of ``key``: CRC16 (XMODEM) of its hash tag — the text between its first
    ``{`` and the next ``}``, when not empty — else of the whole key, modulo 16384."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    return binascii.crc_hqx(data, 0) % SLOTS


@dataclass(frozen=True)
class ClusterUrl:
    seeds: tuple[Node, ...]
    tls: bool = False
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> ClusterUrl:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in CLUSTER_SCHEMES:
            raise ValueError(f"not a cluster URL (redis+cluster://host:port,…): {url!r}")
        rest = rest.rstrip("/").removesuffix("/0")
        userinfo, at, hosts = rest.rpartition("@")
        username = password = None
        if at:
            user, colon, secret = userinfo.partition(":")
            username, password = (unquote(user) or None), (unquote(secret) if colon else None)
        seeds = tuple(_node(part, url) for part in hosts.split(","))
        return cls(seeds, scheme == "rediss+cluster", username, password)

    def node_url(self, node: Node) -> str:
        """The ``RespClient`` URL of one node, with this URL's credentials and TLS."""
        host, port = node
        auth = ""
        if self.password is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        elif self.username:
            auth = f"{quote(self.username, safe='')}@"
        shown = f"[{host}]" if ":" in host else host
        return f"{'rediss' if self.tls else 'redis'}://{auth}{shown}:{port}/0"


def _node(text: str, url: str) -> Node:
    host, colon, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{url!r}: {text!r} is not host:port")
    return host, int(port)


class ClusterClient:
    """Commands routed by slot, over one pipelined connection per primary."""

    def __init__(self, url: str) -> None:
        self._url = ClusterUrl.parse(url)
        self._clients: dict[Node, RespClient] = {}
        self._slots: list[Node | None] = []
        """Slot → its primary; empty until first read."""
        self._reading: asyncio.Lock | None = None
        self._refresh: asyncio.Task[None] | None = None

    @property
    def primaries(self) -> set[Node]:
        return {node for node in self._slots if node is not None}

    async def execute(self, commands: Sequence[tuple[str, Command]]) -> list[Any]:
        """Run each ``(key, command)`` on the primary of ``key``'s slot; the replies in order,
        an error reply as its ``RespError`` in place. Raises when a primary cannot be
        reached."""
        if not self._slots:
            await self.read_slots()
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))
        asked: dict[int, Node] = {}
        """Command → the node an ``ASK`` sent it to."""
        for _ in range(MAX_REDIRECTS + 1):
            routes: dict[Node, list[int]] = {}
            for i in pending:
                node = asked.get(i) or self.node_of(commands[i][0])
                routes.setdefault(node, []).append(i)
            pending, wait = [], False
            for i, reply in await self._send(routes, commands, asked):
                replies[i] = reply
                if not isinstance(reply, RespError):
                    continue
                kind, _, where = str(reply).partition(" ")
                if kind == "MOVED":
                    slot, address = where.split()
                    self._slots[int(slot)] = _node(address, address)
                    asked.pop(i, None)
                    self._stale()
                elif kind == "ASK":
                    asked[i] = _node(where.split()[1], where)
                elif kind == "TRYAGAIN":
                    wait = True
                else:
                    continue
                pending.append(i)
            if not pending:
                break
            if wait:
                await asyncio.sleep(TRYAGAIN_SECONDS)
        return replies

    async def call(self, key: str, *args: Any) -> Any:
        """One command on the primary of ``key``'s slot; an error reply raises."""
        reply = (await self.execute([(key, args)]))[0]
        if isinstance(reply, RespError):
            raise reply
        return reply

    async def read_slots(self) -> None:
        """Read the slot map from the first node that answers: the primaries known, then the
        seeds. Raises ``ConnectionError`` when none does."""
        if self._reading is None:
            self._reading = asyncio.Lock()
        async with self._reading:
            error: BaseException | None = None
            for node in dict.fromkeys([*sorted(self.primaries), *self._url.seeds]):
                try:
                    reply = await self._client(node).call("CLUSTER", "SLOTS")
                except (OSError, RespError) as exc:
                    error = exc
                    continue
                self._slots = _slot_map(reply, node[0])
                for gone in set(self._clients) - self.primaries - set(self._url.seeds):
                    await self._clients.pop(gone).close()
                return
            raise ConnectionError(f"no node of the cluster answered: {error}")

    async def ping(self) -> None:
        """The map read again, and every primary answers."""
        await self.read_slots()
        await asyncio.gather(*(self._client(node).call("PING") for node in self.primaries))

    async def close(self) -> None:
        refresh, self._refresh = self._refresh, None
        if refresh is not None:
            refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresh
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()

    # -- internals -------------------------------------------------------------------------

    def node_of(self, key: str) -> Node:
        """The primary the map says serves ``key``'s slot."""
        node = self._slots[key_slot(key)]
        if node is None:
            raise RespError(f"CLUSTERDOWN slot {key_slot(key)} is not served")
        return node

    def _client(self, node: Node) -> RespClient:
        client = self._clients.get(node)
        if client is None:
            client = self._clients[node] = RespClient(self._url.node_url(node))
        return client

    async def _send(
        self, routes: dict[Node, list[int]], commands: Sequence[tuple[str, Command]],
        asked: dict[int, Node],
    ) -> list[tuple[int, Any]]:
        """Write every primary's batch, then read the replies: the round trips overlap."""
        sent: list[tuple[RespClient, list[int], list[Command], list[asyncio.Future[Any]]]] = []
        try:
            for node, indices in routes.items():
                batch: list[Command] = []
                for i in indices:
                    if i in asked:
                        batch.append(ASKING)
                    batch.append(commands[i][1])
                client = self._client(node)
                sent.append((client, indices, batch, await client.send(batch)))
            out = []
            for client, indices, batch, futures in sent:
                replies = iter(await client.collect(batch, futures))
                for i in indices:
                    if i in asked:
                        next(replies)  # ASKING's OK
                    out.append((i, next(replies)))
            return out
        except BaseException as exc:
            if isinstance(exc, OSError):  # ConnectionLost too: a failover may move the slots
                self._stale()
            for *_, futures in sent:
                abandon(futures)
            raise

    def _stale(self) -> None:
        """Read the map again soon, off the caller's path."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._read_quietly(), name="cluster-slot-map")

    async def _read_quietly(self) -> None:
        try:
            await self.read_slots()
        except (OSError, RespError) as exc:
            log.debug("reading the cluster's slot map failed: %s", exc)


def _slot_map(reply: list[Any], asked: str) -> list[Node | None]:
    """``CLUSTER SLOTS``: ``[start, end, [host, port, id, …], replicas…]`` per range; an
    empty host is the node that answered."""
    slots: list[Node | None] = [None] * SLOTS
    for start, end, primary, *_ in reply:
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        node = (host if host and host != "?" else asked, int(primary[1]))
        slots[int(start):int(end) + 1] = [node] * (int(end) - int(start) + 1)
    return slots
