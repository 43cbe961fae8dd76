"""Closed-loop HTTP/1.1 keep-alive load: ``wrk`` when installed, else a lean asyncio client.

Either way each of ``concurrency`` connections sends the same POST back to back, first for a
warm-up that is not recorded, then for the measured window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class Load:
    url: str
    body: bytes
    headers: dict[str, str]
    concurrency: int
    warmup_s: float
    duration_s: float


@dataclass(frozen=True)
class LoadResult:
    requests: int
    non_200: int
    duration_s: float
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        """200s per second: fast failures must not pass for throughput."""
        ok = self.requests - self.non_200
        return ok / self.duration_s if self.duration_s > 0 else 0.0


def pick_client(name: str) -> str:
    if name == "auto":
        return "wrk" if shutil.which("wrk") else "python"
    if name == "wrk" and not shutil.which("wrk"):
        raise RuntimeError("wrk is not installed (apt-get install -y wrk)")
    return name


def run_load(load: Load, client: str) -> LoadResult:
    return run_wrk(load) if client == "wrk" else asyncio.run(run_python(load))


# -- wrk ---------------------------------------------------------------------------------------

_WRK_SCRIPT = """
wrk.method = "POST"
local f = assert(io.open(%(body)s, "rb"))
wrk.body = f:read("*a")
f:close()
%(headers)s
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%%d,"duration_us":%%d,"non_200":%%d,"p50_us":%%d,"p99_us":%%d}\\n',
    summary.requests, summary.duration, e.status + e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def _lua_string(value: str) -> str:
    return json.dumps(value)  # a JSON string of printable ASCII is a valid Lua string literal


def run_wrk(load: Load) -> LoadResult:
    """wrk counts status >= 400 and socket errors; both are reported as ``non_200``."""
    with tempfile.TemporaryDirectory(prefix="saar-wrk-") as tmp:
        body = Path(tmp) / "body.json"
        body.write_bytes(load.body)
        headers = "\n".join(
            f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}" for k, v in load.headers.items()
        )
        script = Path(tmp) / "post.lua"
        script.write_text(_WRK_SCRIPT % {"body": _lua_string(str(body)), "headers": headers})
        if load.warmup_s > 0:
            _wrk(load, script, load.warmup_s)
        out = _wrk(load, script, load.duration_s)
    stats = json.loads(out.strip().splitlines()[-1])
    return LoadResult(
        requests=stats["requests"],
        non_200=stats["non_200"],
        duration_s=stats["duration_us"] / 1e6,
        p50_ms=stats["p50_us"] / 1e3,
        p99_ms=stats["p99_us"] / 1e3,
    )


def _wrk(load: Load, script: Path, seconds: float) -> str:
    whole = max(1, math.ceil(seconds))  # wrk takes whole seconds
    argv = ["wrk", "-t1", f"-c{load.concurrency}", f"-d{whole}s", "--timeout",
            f"{REQUEST_TIMEOUT:.0f}s", "-s", str(script), load.url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=whole + 30, check=True)
    return done.stdout


# -- asyncio fallback --------------------------------------------------------------------------


def _request_bytes(load: Load) -> tuple[str, int, bytes]:
    url = urlsplit(load.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    lines = [f"POST {url.path or '/'} HTTP/1.1", f"host: {url.netloc}",
             f"content-length: {len(load.body)}"]
    lines += [f"{k}: {v}" for k, v in load.headers.items()]
    return host, port, ("\r\n".join(lines) + "\r\n\r\n").encode() + load.body


async def _connection(
    host: str, port: int, request: bytes, start: float, stop: float, latencies: list[float]
) -> int:
    """Send ``request`` until ``stop``; record latencies from ``start``; return non-200s."""
    reader, writer = await asyncio.open_connection(host, port)
    non_200 = 0
    try:
        while (sent := time.perf_counter()) < stop:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = _content_length(head)
                if length is None:
                    await _read_chunks(reader)
                else:
                    await reader.readexactly(length)
            if sent >= start:
                latencies.append(time.perf_counter() - sent)
                non_200 += head[9:12] != b"200"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return non_200


def _content_length(head: bytes) -> int | None:
    """The body's length, or None for a chunked body (a streamed answer)."""
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            return int(value)
        chunked = chunked or (name == b"transfer-encoding" and b"chunked" in value.lower())
    if chunked:
        return None
    raise RuntimeError(f"response without content-length: {head[:200]!r}")


async def _read_chunks(reader: asyncio.StreamReader) -> None:
    """Read a chunked body to its last chunk (and the empty trailer line after it)."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return


async def run_python(load: Load) -> LoadResult:
    host, port, request = _request_bytes(load)
    start = time.perf_counter() + load.warmup_s
    stop = start + load.duration_s
    latencies: list[float] = []
    non_200 = await asyncio.gather(*(
        _connection(host, port, request, start, stop, latencies) for _ in range(load.concurrency)
    ))
    # Requests that started in the window may finish after it: time up to the last one.
    elapsed = max(time.perf_counter(), stop) - start
    return LoadResult(
        requests=len(latencies),
        non_200=sum(non_200),
        duration_s=elapsed,
        p50_ms=_percentile(latencies, 50) * 1e3,
        p99_ms=_percentile(latencies, 99) * 1e3,
    )


def _percentile(values: list[float], pct: float) -> float:
    """Nearest rank, like wrk."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]
