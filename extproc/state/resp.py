"""A lean Redis / Valkey client for the request path: one pipelined RESP2 connection.

The general-purpose client spends about 100 µs of Python per command on this machine (pool,
locks, encoders); the request path makes two store calls per request, so that alone would cost
more than the whole budget of the shared store. Here a command — or a batch of them
(``pipeline``) — is one ``write`` of its encoded bytes and one future per command: every caller
shares one connection, commands go out in call order and replies, which Redis sends in the same
order, resolve the futures first in, first out (hiredis parses them in C). A caller that stops
waiting (a timeout) leaves its futures in the queue, cancelled, so the next reply still finds
its own. A lost connection fails every waiting call and the next call opens a new one. A
cluster's client (``cluster``) keeps one of these per primary.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

import hiredis

Arg = bytes | str | int | float


Command = tuple[Arg, ...]
ASKING: Command = ("ASKING",)
"""Sent before a command a cluster redirected with ``ASK``: it holds for the next one only."""


class RespError(Exception):
    """Redis answered with an error reply (``-ERR ...``)."""


_SOURCES: dict[str, str] = {}
"""SHA1 → source of every ``Script`` made: what a server answering ``NOSCRIPT`` is sent."""


@dataclass(frozen=True)
class Script:
    """A Lua script, sent by its SHA1 (``EVALSHA``); whole (``EVAL``) to a server that has
    not seen it yet (a new node, a restart, ``SCRIPT FLUSH``)."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        sha = hashlib.sha1(self.source.encode()).hexdigest()
        object.__setattr__(self, "sha", sha)
        _SOURCES[sha] = self.source

    def command(self, keys: Sequence[str], args: Sequence[Arg]) -> Command:
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


class ConnectionLost(ConnectionError):
    """The connection closed with replies still owed."""


def checked(replies: list[Any]) -> list[Any]:
    """``replies``, the first error reply among them raised."""
    for reply in replies:
        if isinstance(reply, RespError):
            raise reply
    return replies


def encode(args: tuple[Arg, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def abandon(futures: Sequence[asyncio.Future[Any]]) -> None:
    """The caller gives up on these replies: pending ones are cancelled (their replies, when
    they come, are skipped), failed ones marked retrieved (never reported as lost)."""
    for future in futures:
        if not future.cancel() and not future.cancelled():
            future.exception()


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self._reader = hiredis.Reader()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            future = self.waiting.popleft()
            if future.done():
                continue  # its caller gave up waiting
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(RespError(str(reply)))
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(ConnectionLost(str(exc or "connection closed")))


class RespClient:
    """``redis://[user:password@]host:port/db``, ``rediss://…`` (TLS) or ``unix:///path``."""

    def __init__(self, url: str) -> None:
        self._url = urlparse(url)
        if self._url.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"unsupported store URL {url!r}")
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None

    async def call(self, *args: Arg) -> Any:
        protocol = await self._connected()
        assert protocol.transport is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        protocol.waiting.append(future)
        protocol.transport.write(encode(args))
        return await future

    async def execute(self, commands: Sequence[tuple[str, Command]]) -> list[Any]:
        """``pipeline`` of the commands of ``(key, command)`` pairs: one server holds every
        key (the cluster client's ``execute`` routes them by slot)."""
        return await self.pipeline([command for _, command in commands])

    async def ping(self) -> None:
        await self.call("PING")

    async def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one write; their replies in order, an error reply as its
        ``RespError`` in place. A script the server has not seen (``NOSCRIPT``) is sent again
        whole; a lost connection raises ``ConnectionLost``."""
        return await self.collect(commands, await self.send(commands))

    async def send(self, commands: Sequence[Command]) -> list[asyncio.Future[Any]]:
        """Write ``commands`` (connecting first if need be) without waiting for the replies:
        a caller writing to several servers sends to all before it collects from any."""
        protocol = await self._connected()
        assert protocol.transport is not None
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in commands]
        protocol.waiting.extend(futures)
        protocol.transport.write(b"".join(encode(args) for args in commands))
        return futures

    async def collect(self, commands: Sequence[Command],
                      futures: list[asyncio.Future[Any]]) -> list[Any]:
        """The replies of ``send``'s ``futures``, as ``pipeline`` returns them."""
        replies: list[Any] = []
        try:
            for future in futures:  # replies come in order: awaiting one by one costs nothing
                try:
                    replies.append(await future)
                except RespError as exc:
                    replies.append(exc)
        except BaseException:
            abandon(futures)
            raise
        unseen = [i for i, reply in enumerate(replies)
                  if isinstance(reply, RespError) and str(reply).startswith("NOSCRIPT")
                  and commands[i][1] in _SOURCES]
        if unseen:
            again: list[Command] = []
            for i in unseen:
                if i and commands[i - 1] == ASKING:  # a cluster's redirection holds for both
                    again.append(ASKING)
                again.append(("EVAL", _SOURCES[str(commands[i][1])], *commands[i][2:]))
            answers = iter(await self.pipeline(again))
            for i in unseen:
                if i and commands[i - 1] == ASKING:
                    next(answers)
                replies[i] = next(answers)
        return replies

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()

    async def _connected(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.transport is not None:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._protocol is None or self._protocol.transport is None:
                self._protocol = await self._open()
            return self._protocol

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        url = self._url
        if url.scheme == "unix":
            _, protocol = await loop.create_unix_connection(_Protocol, url.path)
        else:
            context = ssl.create_default_context() if url.scheme == "rediss" else None
            _, protocol = await loop.create_connection(
                _Protocol, url.hostname or "127.0.0.1", url.port or 6379, ssl=context
            )
        try:
            if url.password is not None:
                user = unquote(url.username) if url.username else "default"
                await self._handshake(protocol, "AUTH", user, unquote(url.password))
            database = url.path.strip("/") if url.scheme != "unix" else ""
            if database and database != "0":
                await self._handshake(protocol, "SELECT", database)
        except BaseException:
            if protocol.transport is not None:
                protocol.transport.close()
            raise
        return protocol

    @staticmethod
    async def _handshake(protocol: _Protocol, *args: Arg) -> None:
        assert protocol.transport is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        protocol.waiting.append(future)
        protocol.transport.write(encode(args))
        await future
