"""Helpers the apis tests share: a body through the parser, an answer as SSE, chunked feeding."""

from __future__ import annotations

from typing import Any

import orjson

from extproc.apis import ResponseObserver, parse_request
from extproc.types import Api, RequestSummary


def parse(api: Api, body: Any, limit: int = 1 << 20) -> RequestSummary:
    return parse_request(api, orjson.dumps(body), max_body_bytes=limit)


def sse(*events: dict[str, Any], done: bool = True) -> bytes:
    out = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def feed_in_pieces(observer: ResponseObserver, data: bytes, size: int = 7) -> None:
    """Chunk boundaries fall anywhere, mid-line included, as they do through Envoy."""
    for i in range(0, len(data), size):
        observer.feed(data[i : i + size])
    observer.feed(b"", end=True)


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    """JSON text of ``depth`` levels of objects and arrays around ``leaf``: deeper than orjson
    writes (254), as deep as it reads (1,024), so tests build such bodies as text."""
    opens = b"".join(b"[" if i % 2 else b'{"k":' for i in range(depth))
    closes = b"".join(b"]" if i % 2 else b"}" for i in reversed(range(depth)))
    return opens + leaf + closes
