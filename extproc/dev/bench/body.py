"""``saar bench body``: the body phase over gRPC, side by side with the pass-throughs.

Each variant's processor runs as its own process (a real stack, Envoy idle beside it); a gRPC
client plays Envoy on the processor's port: per turn of a growing agent session, a stream with
the request headers, the whole body (``BUFFERED``) and the response headers; the figure is how
long the body's reply took (the routing: parse, facts, SAAR, the pick, the body back), the
median of the session's last turns. The variants:

* ``passthrough``: answers every message with an empty CONTINUE (the floor of any processor);
* ``echo``: returns the body unchanged as a body mutation (the floor of one that must return it);
* ``saar``: the router as configured (the model rewritten into the body);
* ``saar-no-rewrite``: ``routing.rewrite_model: false`` (nothing comes back but the route).

Compare ``saar`` with ``echo`` and ``saar-no-rewrite`` with ``passthrough`` (a shared, noisy
machine: the ratio, not the milliseconds).
"""

from __future__ import annotations

import asyncio
import copy
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from .. import EXAMPLE_CONFIG
from ..harness import run_stack
from .overhead import UNTHROTTLED
from .passthrough import command
from .route import MEASURED, SIZES, session_bodies

VARIANTS = ("passthrough", "echo", "saar", "saar-no-rewrite")
DEFAULT_SIZES = ("1mb", "4mb")
TARGET = 1.5
"""``saar`` within this many times ``echo``; ``saar-no-rewrite`` within it of ``passthrough``."""
PAIRS = {"saar": "echo", "saar-no-rewrite": "passthrough"}
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Cell:
    variant: str
    size: str
    bytes: int
    median_ms: float
    p90_ms: float


def _headers(values: dict[str, str]) -> ep.HttpHeaders:
    return ep.HttpHeaders(headers=core.HeaderMap(headers=[
        core.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]))


async def _turn(stub: ep_grpc.ExternalProcessorStub, body: bytes, session: str) -> float:
    """One request's stream; seconds from sending the body to its reply."""
    outbox: asyncio.Queue[ep.ProcessingRequest | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[ep.ProcessingRequest]:
        while (message := await outbox.get()) is not None:
            yield message

    call = stub.Process(requests())
    await outbox.put(ep.ProcessingRequest(request_headers=_headers({
        ":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
        "content-length": str(len(body)), "x-session-id": session,
        "authorization": "Bearer bench"})))
    await call.read()
    started = time.perf_counter()
    await outbox.put(ep.ProcessingRequest(
        request_body=ep.HttpBody(body=body, end_of_stream=True)))
    reply = await call.read()
    took = time.perf_counter() - started
    if reply.HasField("immediate_response"):
        raise RuntimeError(f"refused: {reply.immediate_response.body[:200]!r}")
    await outbox.put(ep.ProcessingRequest(response_headers=_headers(
        {":status": "200", "content-type": "application/json"})))
    answer = await call.read()
    if answer.HasField("mode_override") and answer.mode_override.response_body_mode:
        await outbox.put(ep.ProcessingRequest(response_body=ep.HttpBody(
            body=b'{"choices": [{"message": {"content": "ok"}}]}', end_of_stream=True)))
        await call.read()
    await outbox.put(None)
    call.cancel()
    return took


async def _measure(port: int, bodies: Sequence[bytes], session: str) -> list[float]:
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = ep_grpc.ExternalProcessorStub(channel)
        return [await _turn(stub, body, session) for body in bodies]


def _config(base: dict[str, Any], variant: str) -> dict[str, Any]:
    config = copy.deepcopy(base)
    config.setdefault("limits", {}).update(UNTHROTTLED)
    if variant == "saar-no-rewrite":
        config.setdefault("routing", {})["rewrite_model"] = False
    return config


def run(base: dict[str, Any], variants: Sequence[str], sizes: Sequence[str],
        workers: int = 2) -> list[Cell]:
    """Every (variant, size): a fresh stack per variant, one session per size."""
    cells = []
    with tempfile.TemporaryDirectory(prefix="saar-bench-body-") as tmp:
        for variant in variants:
            with run_stack(_config(base, variant), workers_per_model=workers,
                           sim_args=["--time-scale", "0"], processor=command(variant),
                           workdir=Path(tmp) / variant) as stack:
                port = stack.processors[0].grpc_port
                for size in sizes:
                    bodies = session_bodies(SIZES[size])
                    times = asyncio.run(_measure(port, bodies, f"bench-{variant}-{size}"))
                    last = sorted(times[-MEASURED:])
                    cells.append(Cell(variant, size, len(bodies[-1]),
                                      round(statistics.median(last) * 1000, 3),
                                      round(last[int(0.9 * (len(last) - 1))] * 1000, 3)))
    return cells


def format_table(cells: Sequence[Cell]) -> str:
    by = {(c.variant, c.size): c for c in cells}
    rows = [("variant", "body", "bytes", "median ms", "p90 ms", "against", "ratio")]
    verdicts = []
    for c in cells:
        floor = by.get((PAIRS.get(c.variant, ""), c.size))
        ratio = f"{c.median_ms / floor.median_ms:.2f}x" if floor else ""
        rows.append((c.variant, c.size, str(c.bytes), f"{c.median_ms:.2f}", f"{c.p90_ms:.2f}",
                     floor.variant if floor else "", ratio))
        if floor:
            met = c.median_ms <= TARGET * floor.median_ms
            verdicts.append(f"{c.variant} {c.size}: {c.median_ms / floor.median_ms:.2f}x "
                            f"{floor.variant} (target <= {TARGET}x): "
                            f"{'met' if met else 'MISSED'}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"the body phase over gRPC: medians of a growing session's last {MEASURED} turns"]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([*lines, *verdicts])


def main(config_path: str | None, variants: Sequence[str], sizes: Sequence[str], *,
         as_json: bool) -> int:
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    base = yaml.safe_load(Path(config_path or EXAMPLE_CONFIG).read_text())
    cells = run(base, variants, sizes)
    print(format_table(cells), flush=True)
    if as_json:
        print(json.dumps([asdict(c) for c in cells]), flush=True)
    return 0
