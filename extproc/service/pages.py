"""Reading the workers' ``/metrics`` pages: one kept-alive HTTP/1.1 connection per server and
a plain ``GET``, nothing else. aiohttp's client spent about 575 µs of CPU on each such read
(measured on the sim's 6 KB page), more than half of what an idle processor spends reading
four workers a second; this reader spends a fraction of that (``tests/service/test_pages``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import urlsplit

MAX_PAGE = 16 * 1024 * 1024
"""A page larger than this is refused (a worker's metrics are kilobytes)."""


class PageError(Exception):
    """The server answered, but not with a page (a status other than 200, or a broken
    answer)."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class PageReader:
    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._idle: dict[tuple[str, str, int], Connection] = {}
        self._tls: ssl.SSLContext | None = None

    async def get(self, url: str) -> str:
        """The page at ``url`` (``http://`` or ``https://``), within the timeout. Raises
        ``TimeoutError``, ``OSError`` (unreachable, or the connection broke) or
        ``PageError``."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PageError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        key = (parts.scheme, parts.hostname, parts.port or (443 if tls else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = (f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: text/plain\r\n"
                   "Accept-Encoding: identity\r\n\r\n").encode()
        async with asyncio.timeout(self._timeout):
            kept = self._idle.pop(key, None)
            if kept is not None:
                try:
                    return await self._exchange(key, kept, request)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    pass  # the server closed the kept connection: once more, on a new one
            connection = await asyncio.open_connection(
                key[1], key[2], ssl=self._context() if tls else None)
            try:
                return await self._exchange(key, connection, request)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                raise PageError("the answer ended early, or its head is too long") from exc

    async def close(self) -> None:
        idle, self._idle = self._idle, {}
        for _, writer in idle.values():
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def _exchange(self, key: tuple[str, str, int], connection: Connection,
                        request: bytes) -> str:
        """One request on ``connection``; kept for the next when the server allows."""
        reader, writer = connection
        try:
            writer.write(request)
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
            status = head[0].split(None, 2)
            if len(status) < 2 or not status[0].startswith(b"HTTP/1."):
                raise PageError(f"not an HTTP answer: {head[0][:80]!r}")
            headers: dict[bytes, bytes] = {}
            for line in head[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            keep = status[0] == b"HTTP/1.1" and headers.get(b"connection", b"").lower() != (
                b"close")
            if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                body = await _chunked(reader)
            elif b"content-length" in headers:
                length = int(headers[b"content-length"])
                if length > MAX_PAGE:
                    raise PageError(f"a page of {length} bytes")
                body = await reader.readexactly(length)
            else:
                body, keep = await reader.read(MAX_PAGE), False
            if status[1] != b"200":
                raise PageError(f"status {status[1].decode(errors='replace')}")
        except ValueError as exc:  # a length or chunk size that is no number
            writer.close()
            raise PageError(f"a broken answer: {exc}") from exc
        except BaseException:
            writer.close()
            raise
        if keep:
            self._idle[key] = connection
        else:
            writer.close()
        return body.decode(errors="replace")


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size = int((await reader.readline()).split(b";", 1)[0].strip() or b"x", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(body)
        if len(body) + size > MAX_PAGE:
            raise PageError("a page too large")
        body += await reader.readexactly(size)
        await reader.readline()
