"""Ordinary agent clients beside clients looping large bodies: what the large bodies cost the
others (issue 9, item 6). ``python -m extproc.dev.bench.heavy [--json]``.

A stack (Envoy, the processor, two workers per model, Envoy's canned answer as the upstream so
the model servers cost nothing) is loaded first by ``ordinary`` closed-loop clients alone —
each its own tenant and session, a 2 KB chat turn —, then by the same clients while ``heavy``
clients loop a body just under ``limits.max_body_bytes`` (8 MiB by default) with ``model:
auto``. Heavy clients ignore ``Retry-After`` and reconnect whenever Envoy closes: a hostile
caller's loop. The figures are the ordinary clients' req/s, p50 and p99 in both phases, and
what the heavy clients got, and the cores each part used while the ordinary clients were
counted (the processor, Envoy, and the bench's clients: one event loop for all of them).
``--rounds`` repeats both phases on one stack, each round's kept ratio taken side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import yaml

from .. import EXAMPLE_CONFIG
from ..harness import Stack, run_stack
from .bodies import body
from .load import _percentile
from .overhead import cpu_seconds
from .upstream import canned_upstream
from .variants import TRANSFORMS, pointed_at
from .wire import post_request, read_response

TIMEOUT = 30.0


@dataclass(frozen=True)
class Settings:
    ordinary: int = 8
    heavy: int = 4
    heavy_bytes: int = 8 * 1024 * 1024 - 64 * 1024
    heavy_tenants: int = 1
    """How many API keys the heavy clients share out (1: one tenant looping from 4 clients)."""
    warmup_s: float = 2.0
    duration_s: float = 15.0
    rounds: int = 1
    """Alone, then beside the heavy clients, this many times on one stack: each round's ratio
    is taken side by side (this machine's speed moves between minutes)."""


@dataclass
class Phase:
    name: str
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    heavy: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0
    """From the first request counted to the ordinary clients' last answer (not the heavy
    clients' last one: a large body sent just before the end may take seconds more)."""
    cores: dict[str, float] = field(default_factory=dict)
    """Part (processor, envoy, clients) → CPU seconds it used per second of the phase."""

    def as_json(self) -> dict[str, Any]:
        ok = self.statuses.get(200, 0)
        return {
            "phase": self.name,
            "ordinary_rps": round(ok / self.seconds, 1) if self.seconds else 0.0,
            "ordinary_p50_ms": round(_percentile(self.latencies, 50) * 1e3, 2),
            "ordinary_p99_ms": round(_percentile(self.latencies, 99) * 1e3, 2),
            "ordinary_statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "heavy_statuses": {str(k): v for k, v in sorted(self.heavy.items())},
            "cores": {part: round(used, 2) for part, used in self.cores.items()},
        }


def heavy_body(size: int) -> bytes:
    """A valid chat body of about ``size`` bytes: an agent's long history, ``model: auto``."""
    filler = "the parser module reads tokens and builds a tree for each file in the repo. " * 40
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    total = 200
    while total < size - len(filler) - 200:
        role = "user" if len(messages) % 2 else "assistant"
        messages.append({"role": role, "content": filler})
        total += len(filler) + 32
    messages.append({"role": "user", "content": "Please debug the failing test."})
    raw = orjson.dumps({"model": "auto", "messages": messages})
    pad = size - len(raw)
    if pad > 0:
        messages[0]["content"] += "x" * pad
        raw = orjson.dumps({"model": "auto", "messages": messages})
    return raw


async def _client(url: str, request: bytes, start: float, stop: float,
                  record: Any) -> None:
    """Send ``request`` back to back until ``stop``; ``record(status, seconds)`` from
    ``start`` on; reconnect whenever the proxy closes (an early answer to a large body)."""
    split = urlsplit(url)
    while time.perf_counter() < stop:
        try:
            reader, writer = await asyncio.open_connection(split.hostname, split.port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        try:
            while (sent := time.perf_counter()) < stop:
                async with asyncio.timeout(TIMEOUT):
                    writer.write(request)
                    status, _, keep = await read_response(reader)
                if sent >= start:
                    record(status, time.perf_counter() - sent)
                if not keep:
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            if time.perf_counter() >= start:
                record(0, 0.0)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _phase(stack: Stack, settings: Settings, name: str, heavy: bool) -> Phase:
    phase = Phase(name)
    url = stack.url
    start = time.perf_counter() + settings.warmup_s
    stop = start + settings.duration_s
    small = body("2kb", "auto")
    netloc = urlsplit(url).netloc
    tasks = []
    for i in range(settings.ordinary):
        request = post_request(netloc, "/v1/chat/completions", small,
                           {"authorization": f"Bearer ordinary-{i}",
                            "x-session-id": f"ordinary-{name}-{i}"})

        def ordinary(status: int, seconds: float) -> None:
            phase.statuses[status] += 1
            phase.seconds = max(phase.seconds, time.perf_counter() - start)
            if status == 200:
                phase.latencies.append(seconds)

        tasks.append(_client(url, request, start, stop, ordinary))
    if heavy:
        payload = heavy_body(settings.heavy_bytes)
        for i in range(settings.heavy):
            request = post_request(netloc, "/v1/chat/completions", payload,
                               {"authorization": f"Bearer heavy-{i % settings.heavy_tenants}"})
            tasks.append(_client(url, request, start, stop,
                                 lambda status, _s: phase.heavy.update([status])))
    tasks.append(_cores(stack, phase, start, stop))
    await asyncio.gather(*tasks)
    phase.seconds = max(phase.seconds, stop - start)
    return phase


async def _cores(stack: Stack, phase: Phase, start: float, stop: float) -> None:
    """The cores each part uses from ``start`` to ``stop``: the window the ordinary clients
    are counted in (the heavy clients' last bodies run on after it)."""
    await asyncio.sleep(start - time.perf_counter())
    before, clients = cpu_seconds(stack), time.process_time()
    await asyncio.sleep(stop - time.perf_counter())
    after, wall = cpu_seconds(stack), stop - start
    phase.cores = {part: (after[part] - before[part]) / wall for part in after}
    phase.cores["clients"] = (time.process_time() - clients) / wall


def run(config: dict[str, Any], settings: Settings) -> list[Phase]:
    with tempfile.TemporaryDirectory(prefix="saar-heavy-") as tmp, \
            canned_upstream(Path(tmp)) as upstream, \
            run_stack(config, workers_per_model=2, sim_args=["--time-scale", "0"],
                      workdir=Path(tmp) / "stack",
                      envoy_transform=pointed_at(upstream, TRANSFORMS["saar"])) as stack:
        return [asyncio.run(_phase(stack, settings, name, heavy=heavy))
                for _ in range(settings.rounds)
                for name, heavy in (("alone", False), ("beside-heavy", True))]


def table(phases: Sequence[Phase], settings: Settings) -> str:
    rows = [("phase", "ordinary req/s", "p50 ms", "p99 ms", "ordinary statuses",
             "heavy statuses", "cores: processor / envoy / clients")]
    for phase in phases:
        doc = phase.as_json()
        cores = " / ".join(f"{phase.cores.get(part, 0.0):.2f}"
                           for part in ("processor", "envoy", "clients"))
        rows.append((phase.name, f"{doc['ordinary_rps']:.0f}", f"{doc['ordinary_p50_ms']:.1f}",
                     f"{doc['ordinary_p99_ms']:.1f}", json.dumps(doc["ordinary_statuses"]),
                     json.dumps(doc["heavy_statuses"]), cores))
    kept = kept_ratios(phases)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    head = (f"{settings.ordinary} ordinary clients (2 KB chat, a tenant each) alone, then beside "
            f"{settings.heavy} clients looping {settings.heavy_bytes / 2**20:.2f} MiB bodies "
            f"({settings.heavy_tenants} tenant(s)); {settings.duration_s:.0f} s per phase")
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    foot = (f"kept beside the heavy clients: {', '.join(f'{k:.0%}' for k in kept)}"
            f" (median {statistics.median(kept):.0%})")
    return "\n".join([head, *lines, foot])


def kept_ratios(phases: Sequence[Phase]) -> list[float]:
    """Each round's ordinary req/s beside the heavy clients over its req/s alone."""
    docs = [p.as_json() for p in phases]
    return [beside["ordinary_rps"] / alone["ordinary_rps"] if alone["ordinary_rps"] else 0.0
            for alone, beside in zip(docs[::2], docs[1::2], strict=True)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extproc.dev.bench.heavy")
    parser.add_argument("--config", default=str(EXAMPLE_CONFIG))
    parser.add_argument("--ordinary", type=int, default=Settings.ordinary)
    parser.add_argument("--heavy", type=int, default=Settings.heavy)
    parser.add_argument("--heavy-bytes", type=int, default=Settings.heavy_bytes)
    parser.add_argument("--heavy-tenants", type=int, default=Settings.heavy_tenants)
    parser.add_argument("--duration", type=float, default=Settings.duration_s)
    parser.add_argument("--warmup", type=float, default=Settings.warmup_s)
    parser.add_argument("--rounds", type=int, default=Settings.rounds,
                        help="alone then beside the heavy clients, this many times")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    settings = Settings(args.ordinary, args.heavy, args.heavy_bytes, args.heavy_tenants,
                        args.warmup, args.duration, max(1, args.rounds))
    config = yaml.safe_load(Path(args.config).read_text())
    phases = run(config, settings)
    print(table(phases, settings), flush=True)
    if args.json:
        print(json.dumps({"phases": [p.as_json() for p in phases],
                          "kept": [round(k, 3) for k in kept_ratios(phases)]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
