"""A lean keep-alive HTTP/1.1 client for the load generators (``saar bench soak``, the heavy-body
bench): requests written as bytes, answers read by content-length or chunked, nothing else. A
client library in the loop would cost more CPU than the proxy it measures on these machines."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


def post_request(netloc: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A JSON POST, ready to write."""
    lines = [f"POST {path} HTTP/1.1", f"host: {netloc}", "content-type: application/json",
             f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the connection stays open)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length, chunked, keep = 0, False, True
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value:
            chunked = True
        elif name == b"connection" and value == b"close":
            keep = False
    if not chunked:
        return status, await reader.readexactly(length), keep
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        parts.append((await reader.readexactly(size + 2))[:-2])
        if size == 0:
            return status, b"".join(parts), keep


class Http:
    """One keep-alive connection; reconnects when the server closes it."""

    def __init__(self, url: str) -> None:
        split = urlsplit(url)
        self.host, self.port, self.netloc = split.hostname or "127.0.0.1", split.port, split.netloc
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._conn
        try:
            writer.write(post_request(self.netloc, path, body, headers))
            status, payload, keep = await read_response(reader)
        except BaseException:
            self.close()
            raise
        if not keep:
            self.close()
        return status, payload

    def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None
